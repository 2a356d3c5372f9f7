"""The recipe's prediction: the roofline ceiling (``sweep.roofline``) of the best trial's workload on the served
checkpoint, from the node's env-check figures, beside what the engine measured.

The cost model is the checkpoint's own architecture built on the meta device (no memory, no weights), its weights
and KV cache at the dtype the engine served. Efficiency = predicted seconds / measured seconds: at most 1 when the
figures are right; above 1 the ceiling is wrong (the figures were measured under load, or the weights fit in a
cache) and the report says so rather than show it as an efficiency. Far below 1 on a CPU node mostly means per-step
overhead in the engine (scheduling, Python, sampling), which the roofline does not model.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..sweep.result import Efficiency
from ..sweep.roofline import FORMULAS, model_cost, predict

DTYPE_PRECISIONS = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# vLLM's max_num_batched_tokens when chunked prefill is on and none is given (its V1 default for serving).
DEFAULT_BATCHED_TOKENS = 2048


def served_precision(config: dict, settings: dict) -> str | None:
    dtype = settings.get("dtype", "auto")
    if dtype == "auto":
        dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return DTYPE_PRECISIONS.get(str(dtype))


def prediction(checkpoint: Path, best: dict, lengths: list[tuple[int, int]], hardware: dict | None) -> dict:
    """``{"available": False, "reason"}``, or the ceiling next to the measurement."""
    config = json.loads((checkpoint / "config.json").read_text())
    precision = served_precision(config, best["settings"])
    flops = ((hardware or {}).get("flops_per_s") or {}).get(precision)
    bandwidth = (hardware or {}).get("memory_bandwidth_bytes_per_s")
    if not hardware or not flops or not bandwidth:
        return {"available": False,
                "reason": f"no env-check figures for {precision or 'this dtype'} matmuls and memory bandwidth on "
                          "this node: run an env check first (the whole adaptation does)"}
    if best["settings"].get("quantization") or best["settings"].get("kv_cache_dtype", "auto") != "auto":
        return {"available": False, "reason": "quantized weights or KV cache: the cost model sizes them at the "
                                              "activation dtype, so no prediction is made"}
    from ..models.loading import build_meta_model, load_config

    element = ELEMENT_BYTES[precision]
    model = build_meta_model(load_config(config))
    cost = model_cost(model, lambda module, parameter: element, element)
    concurrency = best["workload"].get("concurrency") or best["settings"].get("max_num_seqs", 1)
    batched = best["settings"].get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS
    predicted = predict(cost, lengths, concurrency=concurrency, max_batch_tokens=batched, flops_per_s=flops,
                        bytes_per_s=bandwidth)
    seconds = predicted.pop("seconds")
    measured = best["metrics"]["duration_s"]
    output_tokens = sum(output for _, output in lengths)
    return {"available": True, "precision": precision, "flops_per_s": flops, "memory_bandwidth_bytes_per_s": bandwidth,
            "source": "the node's latest env check", "predicted_seconds": seconds, "measured_seconds": measured,
            "predicted_output_tokens_per_s": output_tokens / seconds if seconds else None,
            "measured_output_tokens_per_s": best["metrics"]["output_tokens_per_s"],
            # Above 1 the ceiling is wrong, so it is no efficiency: flagged, and not shown as one.
            **Efficiency.judge(seconds, measured, overhead_out=False).as_dict(),
            "bound": predicted["bound"], "max_num_batched_tokens": batched,
            "batched_tokens_assumed": "max_num_batched_tokens" not in best["settings"],
            "concurrency": concurrency, "model": cost.as_dict(), "formulas": FORMULAS,
            "phases": {"prefill": predicted["prefill"], "decode": predicted["decode"]}}
