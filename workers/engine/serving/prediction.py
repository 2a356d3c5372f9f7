"""d0's predictions for a serve sweep: the roofline ceiling (``sweep.roofline``) of a trial's workload on the served
checkpoint, from the node's env-check figures, beside what the engine measured: for the recipe (``prediction``:
the best trial's duration, and its efficiency) and for every trial (``trial_prediction``: output tokens/s, TTFT,
TPOT and memory, calibrated on the cluster's history where it has one, ``ledger``).

The cost model is the checkpoint's own architecture built on the meta device (no memory, no weights), its weights
and KV cache at the dtype the engine served. Efficiency = predicted seconds / measured seconds: at most 1 when the
figures are right; above 1 the ceiling is wrong (the figures were measured under load, or the weights fit in a
cache) and the report says so rather than show it as an efficiency. Far below 1 on a CPU node mostly means per-step
overhead in the engine (scheduling, Python, sampling), which the roofline does not model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..sweep.result import Efficiency
from .ledger import calibrated
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


class NoPrediction(Exception):
    """Why no prediction is made for a trial (said beside it, never a failure of the sweep)."""


def node_figures(hardware: dict | None, precision: str | None) -> tuple[float, float]:
    """(FLOP/s at ``precision``, memory bytes/s) of the node's env check; NoPrediction when it has none: another
    device's figures are never put in their place."""
    flops = ((hardware or {}).get("flops_per_s") or {}).get(precision)
    bandwidth = (hardware or {}).get("memory_bandwidth_bytes_per_s")
    if not hardware or not flops or not bandwidth:
        raise NoPrediction(f"no figures for this node: no env-check figures for {precision or 'this dtype'} "
                           "matmuls and memory bandwidth; run an env check first (the whole adaptation does)")
    return flops, bandwidth


class CostModels:
    """The cost model of each checkpoint served, at the dtype it is served in, built once per sweep (a meta-device
    build of the architecture: no memory, no weights)."""

    def __init__(self):
        self.built: dict[tuple[str, str], object] = {}

    def of(self, checkpoint: Path, settings: dict):
        """(cost, precision) of ``checkpoint`` as ``settings`` serve it; NoPrediction where none is made."""
        if settings.get("quantization") or settings.get("kv_cache_dtype", "auto") != "auto" or (
                settings.get("variant") not in (None, "as_shipped")):
            raise NoPrediction("quantized weights or KV cache: the cost model sizes them at the activation dtype, "
                               "so no prediction is made")
        config = json.loads((Path(checkpoint) / "config.json").read_text())
        precision = served_precision(config, settings)
        if precision is None:
            raise NoPrediction(f"the served dtype {settings.get('dtype')!r} has no cost model")
        key = (str(checkpoint), precision)
        if key not in self.built:
            from ..models.loading import build_meta_model, load_config

            element = ELEMENT_BYTES[precision]
            self.built[key] = model_cost(build_meta_model(load_config(config)), lambda module, parameter: element,
                                         element)
        return self.built[key], precision


def roofline_figures(cost, lengths: list[tuple[int, int]], concurrency: int, batched: int, flops: float,
                     bandwidth: float, in_flight: int | None = None) -> tuple[dict, dict]:
    """The ledger's metrics as the roofline predicts them, and the roofline itself (``concurrency``: the requests a
    step carries; ``in_flight``: those the client keeps sent, which may be more):
    output tokens/s = output tokens / (prefill + decode seconds); TPOT = one decode step (each step makes one token
    for every request in flight); TTFT = one prefill step (a request's prompt is prefilled in one step beside the
    others, and its first token comes out of it) + its wait for a place in the batch: with more requests in flight
    than the engine batches, a closed loop's requests after the first wave wait (waves - 1) requests' service
    (a prefill step and a decode step per later token), waves = ceil(in flight / concurrency); memory = the
    weights + the KV cache of the requests in flight at their longest context (the runtime, its libraries and an
    engine's preallocated cache are not modelled: the calibration carries them)."""
    predicted = predict(cost, lengths, concurrency=concurrency, max_batch_tokens=batched, flops_per_s=flops,
                        bytes_per_s=bandwidth)
    output_tokens = sum(output for _, output in lengths)
    prefill_step, decode_step = predicted["prefill"]["step_seconds"] or 0.0, predicted["decode"]["step_seconds"] or 0.0
    waves = math.ceil((in_flight or concurrency) / concurrency)
    outputs = sorted(output for _, output in lengths)
    service = prefill_step + (outputs[len(outputs) // 2] - 1) * decode_step if outputs else 0.0
    longest = sorted((cost.kv_bytes(prompt + output) for prompt, output in lengths), reverse=True)[:concurrency]
    figures = {"output_tokens_per_s": output_tokens / predicted["seconds"] if predicted["seconds"] else None,
               "ttft_s": prefill_step + (waves - 1) * service or None, "tpot_s": decode_step or None,
               "peak_memory_bytes": cost.dense_weight_bytes + cost.expert_weight_bytes + sum(longest)}
    return figures, predicted


def trial_prediction(models: CostModels, checkpoint: Path, trial: dict, lengths: list[tuple[int, int]],
                     hardware: dict | None, calibration: dict | None) -> dict:
    """What d0 predicts for one served trial (``ledger``): the roofline's figures, the prediction (calibrated on
    the cluster's trials where ``calibration`` is given) and what it is based on; or why there is none."""
    if trial.get("goodput"):
        return {"available": False, "reason": "a goodput search's figures are those of its best load, which the "
                                              "roofline does not choose"}
    try:
        cost, precision = models.of(checkpoint, trial["settings"])
        flops, bandwidth = node_figures(hardware, precision)
    except NoPrediction as reason:
        return {"available": False, "reason": str(reason)}
    # The requests a step carries: those in flight, at most the engine's batch (max_num_seqs).
    in_flight = (trial.get("workload") or {}).get("concurrency") or trial["settings"].get("max_num_seqs", 1)
    concurrency = min(in_flight, trial["settings"].get("max_num_seqs") or in_flight)
    batched = trial["settings"].get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS
    roofline, _ = roofline_figures(cost, lengths, concurrency, batched, flops, bandwidth, in_flight)
    predicted, basis = calibrated(roofline, calibration, concurrency)
    return {"available": True, "roofline": roofline, "predicted": predicted, "basis": basis,
            "calibration": calibration, "precision": precision, "concurrency": concurrency,
            "hardware": {"flops_per_s": flops, "memory_bandwidth_bytes_per_s": bandwidth,
                         "source": "the node's latest env check"}}


def prediction(checkpoint: Path, best: dict, lengths: list[tuple[int, int]], hardware: dict | None,
               models: CostModels | None = None) -> dict:
    """``{"available": False, "reason"}``, or the ceiling next to the measurement."""
    try:
        cost, precision = (models or CostModels()).of(checkpoint, best["settings"])
        flops, bandwidth = node_figures(hardware, precision)
    except NoPrediction as reason:
        return {"available": False, "reason": str(reason)}
    concurrency = best["workload"].get("concurrency") or best["settings"].get("max_num_seqs", 1)
    batched = best["settings"].get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS
    figures, predicted = roofline_figures(cost, lengths, concurrency, batched, flops, bandwidth)
    seconds = predicted.pop("seconds")
    measured = best["metrics"]["duration_s"]
    return {"available": True, "precision": precision, "flops_per_s": flops, "memory_bandwidth_bytes_per_s": bandwidth,
            "source": "the node's latest env check", "predicted_seconds": seconds, "measured_seconds": measured,
            "predicted_output_tokens_per_s": figures["output_tokens_per_s"],
            "measured_output_tokens_per_s": best["metrics"]["output_tokens_per_s"],
            # Above 1 the ceiling is wrong, so it is no efficiency: flagged, and not shown as one.
            **Efficiency.judge(seconds, measured, overhead_out=False).as_dict(),
            "bound": predicted["bound"], "max_num_batched_tokens": batched,
            "batched_tokens_assumed": "max_num_batched_tokens" not in best["settings"],
            "concurrency": concurrency, "model": cost.as_dict(), "formulas": FORMULAS,
            "phases": {"prefill": predicted["prefill"], "decode": predicted["decode"]}}
