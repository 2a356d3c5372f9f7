"""From a backend's observations to the stored trial: its parameters, serving metrics and roofline figures."""

from __future__ import annotations

from .backends import TrialResult
from .metrics import summarize
from .roofline import predict
from .workload import Workload

OVER_CEILING = ("measured faster than the predicted ceiling: the bandwidth or FLOP/s figures understate this device "
                "for this working set (measured under contention, or the weights fit in a cache)")


def roofline_entry(result: TrialResult, metrics: dict, workload: Workload, figures: dict) -> dict | None:
    """The trial's predicted ceiling next to what it measured, or None when nothing ran to compare with."""
    completed = [record for record in result.records if record.completed]
    flops_per_s = figures["flops_per_s"].get(result.params.precision)
    if result.cost is None or not completed or not flops_per_s:
        return None
    params = result.params
    concurrency = min(params.batch_size, workload.in_flight_limit(params.batch_size) or params.batch_size,
                      len(completed))
    prediction = predict(result.cost, [(record.prompt_tokens, record.output_tokens) for record in completed],
                         concurrency=concurrency, max_batch_tokens=params.max_batch_tokens,
                         flops_per_s=flops_per_s, bytes_per_s=figures["memory_bandwidth_bytes_per_s"])
    itl = metrics.get("itl_s")
    decode_step = prediction["decode"]["step_seconds"]
    predicted = prediction.pop("seconds")
    efficiency = predicted / metrics["duration_s"]
    return {
        **prediction,
        "predicted_seconds": predicted,
        "measured_seconds": metrics["duration_s"],
        "efficiency": efficiency,
        "note": OVER_CEILING if efficiency > 1 else None,
        # Each decode step emits one token per request in flight, so the median gap between tokens is a step's time.
        "measured_decode_step_seconds": itl["p50"] if itl else None,
        "decode_step_efficiency": decode_step / itl["p50"] if itl and decode_step else None,
        "flops_per_s": flops_per_s,
        "memory_bandwidth_bytes_per_s": figures["memory_bandwidth_bytes_per_s"],
        "model": result.cost.as_dict(),
    }


def evaluate(result: TrialResult, workload: Workload, figures: dict) -> dict:
    metrics = None
    if result.status == "ok":
        metrics = {**summarize(result.records, workload.slo), **result.memory}
    return {
        "params": result.params.as_dict(),
        "workload": {"requests": workload.requests, "arrival": workload.arrival},
        "status": result.status,
        "reason": result.reason,
        "metrics": metrics,
        "roofline": roofline_entry(result, metrics, workload, figures) if metrics else None,
        "details": result.details,
    }
