"""The one model path the stages share: a config.json dict → a transformers config (resolving an unknown
``model_type`` the way model intake does) → a reduced config that keeps every layer kind → a model on the meta
device or with seeded random weights. No hub access and no remote code.

``loading``: config → transformers config → model (meta, seeded random weights, or a local safetensors
checkpoint). ``reducer``: the architecture-preserving shrink, checked against the full model's module classes,
and ``reduce_for_layout`` for what a tp x pp x ep split needs of it. Coverage, sharded runs and the sweep use it;
analysis reads configs its own way (``analysis/config_loading.py``), with the same resolution of unknown types.
"""

from .loading import (build_meta_model, build_random_model, causal_lm_config, load_checkpoint, load_config,
                      text_config_dict)
from .reducer import Reduction, compare_module_classes, deepen, reduce_config, reduce_for_layout

__all__ = ["Reduction", "build_meta_model", "build_random_model", "causal_lm_config", "compare_module_classes",
           "deepen", "load_checkpoint", "load_config", "reduce_config", "reduce_for_layout", "text_config_dict"]
