"""From a backend's observations to the stored trial: its parameters, serving metrics and roofline figures."""

from __future__ import annotations

from .backends import TrialResult
from .metrics import summarize
from .result import Metrics, Roofline, SweepTrial, TrialWorkload
from .roofline import predict, separate_overhead, step_overhead
from .workload import Workload


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
    predicted = prediction.pop("seconds")
    predicted_steps = prediction.pop("steps")
    scheduled = result.details.get("generation_steps")
    entry = {
        **prediction,
        "predicted_seconds": predicted,
        "measured_seconds": metrics["duration_s"],
        # The forward steps the backend ran when it counts them (transformers' scheduler mixes a new request's
        # prefill into decode steps), else the steps the schedule implies: the per-step overhead is paid per step run.
        "steps": scheduled or predicted_steps,
        "predicted_steps": predicted_steps,
        "steps_from": "counted by the backend" if scheduled else "predicted from the schedule",
        # Each decode step emits one token per request in flight, so the median gap between tokens is a step's time.
        "measured_decode_step_seconds": itl["p50"] if itl else None,
        "flops_per_s": flops_per_s,
        "memory_bandwidth_bytes_per_s": figures["memory_bandwidth_bytes_per_s"],
        "model": result.cost.as_dict(),
    }
    # Until the sweep has fitted its per-step overhead from all its trials, none is taken out.
    return separate_overhead(entry, 0.0)


def with_step_overhead(trials: list[dict]) -> dict | None:
    """Fit the per-step overhead over ``trials``' roofline entries and take it out of each (in place); returns the
    fit (``roofline.step_overhead``), or None when no trial has a roofline."""
    entries = [trial["roofline"] for trial in trials if trial.get("roofline")]
    overhead = step_overhead(entries)
    if overhead is not None:
        for trial in trials:
            if trial.get("roofline"):
                trial["roofline"] = separate_overhead(trial["roofline"], overhead["seconds_per_step"])
    return overhead


def evaluate(result: TrialResult, workload: Workload, figures: dict) -> dict:
    """The trial as it is stored (``result.SweepTrial``); the search numbers it and ``runner.repeated`` adds its
    runs."""
    metrics = None
    if result.status == "ok":
        metrics = {**summarize(result.records, workload.slo), **result.memory}
    return SweepTrial(params=result.params.as_dict(),
                      workload=TrialWorkload(requests=workload.requests, arrival=workload.arrival),
                      status=result.status, reason=result.reason, metrics=Metrics.from_dict(metrics),
                      roofline=Roofline.from_dict(roofline_entry(result, metrics, workload, figures) if metrics
                                                  else None),
                      details=result.details).as_dict()
