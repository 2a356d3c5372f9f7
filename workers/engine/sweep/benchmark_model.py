"""The model a sweep serves: the real architecture reduced to a few layers and small widths, or the full model,
with seeded random weights in the trial's precision. No hub access and no remote code.

The reduction is the coverage reducer's (``workers/engine/models/reducer.py``): it keeps every layer kind, the
head dims and the routing. It cuts a model whose layers are all of one kind to one layer; a benchmark model keeps
at least ``MIN_LAYERS`` so that a forward step still passes hidden states from layer to layer and the per-layer
costs show next to the fixed ones (embedding, LM head, sampling). The extra layers repeat the one kind.
"""

from __future__ import annotations

import torch

from ..models.loading import causal_lm_config, load_config
from ..models.reducer import deepen, reduce_config

MIN_LAYERS = 2
# The proxy sweep's precisions, by the torch dtype its model is built in (int8 quantizes an fp32 model dynamically).
SERVED_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}


def benchmark_config(config: dict, *, reduce: bool = True) -> tuple[dict, dict]:
    """The config.json dict to build and a description of it (layers, widths, what the reduction changed)."""
    if not reduce:
        text = causal_lm_config(load_config(config))
        return config, {"reduced": False, "model_type": config.get("model_type"),
                        "layers": text.num_hidden_layers, "hidden_size": text.hidden_size, "notes": []}
    reduction = reduce_config(config)
    reduced = dict(reduction.config)
    notes = list(reduction.notes)
    if reduction.layers < MIN_LAYERS:
        deepen(reduced, causal_lm_config(load_config(config)), MIN_LAYERS)
        notes.append(f"one layer kind: its layer repeated to {MIN_LAYERS} layers for benchmarking")
    text = causal_lm_config(load_config(reduced))  # raises if the deepened config is inconsistent
    return reduced, {"reduced": True, "model_type": config.get("model_type"), "layers": text.num_hidden_layers,
                     "full_layers": reduction.full_layers, "hidden_size": text.hidden_size,
                     "layer_kinds": reduction.layer_kinds, "notes": notes}


def dynamic_int8_unsupported(device: torch.device) -> str | None:
    """Why dynamic int8 cannot run here, or None. torch's dynamic quantisation (int8 weights, activations quantised
    per batch) has CPU kernels only (fbgemm/x86/qnnpack)."""
    if device.type != "cpu":
        return f"dynamic int8 (torch.ao quantize_dynamic) has CPU kernels only, not {device.type}"
    if not torch.backends.quantized.supported_engines:
        return "this torch build has no quantized engine for dynamic int8"
    return None


def quantize_dynamic_int8(model):
    """Linear layers with int8 weights and per-batch int8 activations (torch.ao's dynamic quantisation, deprecated
    upstream in favour of torchao, which d0 does not require)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
