"""The one model path every stage and the analysis share: a config.json dict → its resolved transformers
architecture → a reduced config that keeps every layer kind → a model on the meta device or with seeded random
weights. No hub access and no remote code.

``config_loading``: reading a config's standard keys whatever a release names them (``ConfigView``).
``resolution``: which transformers architecture describes it (an unknown ``model_type`` through its
``architectures`` entry and key signature). ``layers``: what each layer is (mixer and FFN kinds). ``generic_decoder``:
the transformers decoder of a config's shape when no architecture fits. ``loading``: config → transformers config →
model (meta, seeded random weights, or a local safetensors checkpoint). ``reducer``: the architecture-preserving
shrink, checked against the full model's module classes, and ``reduce_for_layout`` for what a tp x pp x ep split
needs of it.

Importing the package imports neither torch nor transformers (the analysis reads configs through it in the web
tier): the names below load their module on first use.
"""

import importlib

_LAZY = {
    "Reduction": ".reducer", "compare_module_classes": ".reducer", "deepen": ".reducer", "reduce_config": ".reducer",
    "reduce_for_layout": ".reducer", "build_meta_model": ".loading", "build_random_model": ".loading",
    "causal_lm_config": ".loading", "load_checkpoint": ".loading", "load_config": ".loading",
    "text_config_dict": ".loading",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
