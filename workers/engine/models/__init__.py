"""The one model path the stages share: a config.json dict → a transformers config (resolving an unknown
``model_type`` the way model intake does) → a reduced config that keeps every layer kind → a model on the meta
device or with seeded random weights. No hub access and no remote code.

``loading``: config → transformers config → model. ``reducer``: the architecture-preserving shrink, checked
against the full model's module classes. Coverage and the sweep use it today; analysis reads configs its own
way (``analysis/config_loading.py``) and the sharded run still shrinks with ``sharding/configs.py``.
"""

from .loading import build_meta_model, build_random_model, causal_lm_config, load_config, text_config_dict
from .reducer import Reduction, compare_module_classes, reduce_config

__all__ = ["Reduction", "build_meta_model", "build_random_model", "causal_lm_config", "compare_module_classes",
           "load_config", "reduce_config", "text_config_dict"]
