"""The prediction ledger: what d0 predicted for each engine trial (``prediction.trial_prediction``) beside what was
measured, how far off it was, and the calibration fitted on a cluster's history of such trials.

One row per trial and metric. The metrics are those a deployment is sized by:

- ``output_tokens_per_s``: output tokens / duration (``sweep.metrics``);
- ``ttft_s`` and ``tpot_s``: the median (p50) over the trial's requests, as vLLM's benchmark reports them;
- ``peak_memory_bytes``: the engine's processes' peak resident memory while serving (on an accelerator the device
  memory the engine holds is what matters; on a CPU node, resident memory is where the weights and cache live).

Relative error = |predicted - measured| / measured (AISimulate's and AIConfigurator's definition). The calibration
is, per engine and metric, the median of measured / roofline over the cluster's trials: the share of the roofline
this node reaches (an efficiency for throughput, a slowdown for latencies). A median, not a mean, so that a trial
disturbed by another job on the node moves it little. A calibrated prediction is the roofline x that ratio.
"""

from __future__ import annotations

from statistics import median

from ..sweep.metrics import percentile

METRICS = {"output_tokens_per_s": "output tok/s", "ttft_s": "TTFT (p50)", "tpot_s": "TPOT (p50)",
           "peak_memory_bytes": "peak memory"}
# The percentile of the relative error shown beside the median (AIConfigurator reports P90 errors).
TAIL_PERCENTILE = 90


def measured_figures(metrics: dict | None) -> dict:
    """A trial's measured figure of each ledger metric (None where it has none)."""
    metrics = metrics or {}

    def p50(name):
        distribution = metrics.get(name)
        return distribution.get("p50") if isinstance(distribution, dict) else None

    return {"output_tokens_per_s": metrics.get("output_tokens_per_s"), "ttft_s": p50("ttft_s"),
            "tpot_s": p50("tpot_s"), "peak_memory_bytes": metrics.get("peak_memory_bytes")}


def _positive(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def relative_error(predicted, measured) -> float | None:
    if not (_positive(predicted) and _positive(measured)):
        return None
    return abs(predicted - measured) / measured


def rows_of(result: dict, *, source: str = "") -> list[dict]:
    """The ledger rows of a stored serve sweep result: each served trial's prediction (the roofline, and what d0
    predicted for it, calibrated or not) beside its measurement, per metric. Trials without a prediction (no
    env-check figures, quantized) or not served whole are left out."""
    engine = (result.get("engine") or {}).get("name") or "?"
    rows = []
    for trial in result.get("trials") or []:
        ledger = trial.get("prediction") if isinstance(trial, dict) else None
        if trial.get("status") != "ok" or not isinstance(ledger, dict) or not ledger.get("available"):
            continue
        measured = measured_figures(trial.get("metrics"))
        for metric in METRICS:
            roofline = (ledger.get("roofline") or {}).get(metric)
            if _positive(roofline) and _positive(measured[metric]):
                rows.append({"engine": engine, "metric": metric, "trial": trial.get("id"), "source": source,
                             "roofline": roofline, "predicted": (ledger.get("predicted") or {}).get(metric),
                             "measured": measured[metric], "calibrated": bool(ledger.get("calibration"))})
    return rows


def error_table(rows: list[dict], predicted: str = "predicted") -> list[dict]:
    """Per engine and metric: how many trials, and the median and P90 of the relative error of ``predicted`` (the
    rows' key: "predicted", what d0 said at the time, or "roofline", the uncalibrated ceiling)."""
    errors: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        error = relative_error(row.get(predicted), row["measured"])
        if error is not None:
            errors.setdefault((row["engine"], row["metric"]), []).append(error)
    order = list(METRICS)
    return [{"engine": engine, "metric": metric, "label": METRICS[metric], "trials": len(values),
             "median": median(values), "p90": percentile(values, TAIL_PERCENTILE)}
            for (engine, metric), values in sorted(errors.items(), key=lambda item: (item[0][0],
                                                                                   order.index(item[0][1])))]


def fit_calibration(rows: list[dict], engine: str) -> dict | None:
    """The calibration of ``engine``'s predictions on these rows (one cluster's history): per metric the median of
    measured / roofline, and the number of trials behind it. None when no trial of that engine was measured."""
    ratios: dict[str, list[float]] = {}
    trials = set()
    for row in rows:
        if row["engine"] == engine:
            ratios.setdefault(row["metric"], []).append(row["measured"] / row["roofline"])
            trials.add((row.get("source"), row.get("trial")))
    if not ratios:
        return None
    return {"engine": engine, "trials": len(trials),
            "ratios": {metric: median(values) for metric, values in ratios.items()},
            "method": "per metric, the median of measured / roofline over the cluster's trials of this engine"}


def check_calibration(value) -> dict:
    """A calibration as the control plane passes it to a stage: trials > 0 and a positive ratio per known metric."""
    if not isinstance(value, dict):
        raise ValueError("a calibration is an object with trials and ratios")
    trials, ratios = value.get("trials"), value.get("ratios")
    if not (isinstance(trials, int) and not isinstance(trials, bool) and trials > 0):
        raise ValueError("calibration trials must be a positive int")
    if not isinstance(ratios, dict) or not ratios:
        raise ValueError("calibration ratios map metrics to positive numbers")
    for metric, ratio in ratios.items():
        if metric not in METRICS:
            raise ValueError(f"unknown calibration metric {metric!r}; known: {', '.join(METRICS)}")
        if not _positive(ratio):
            raise ValueError(f"calibration ratio of {metric} must be a positive number, not {ratio!r}")
    return value


def calibrated(roofline: dict, calibration: dict | None) -> tuple[dict, str]:
    """The prediction for a trial from its roofline figures: x the calibration's ratio where there is one, and the
    sentence saying which it is."""
    if not calibration:
        return dict(roofline), "roofline from the node's env-check figures, not calibrated (no measured trials of " \
                               "this cluster yet)"
    ratios = calibration["ratios"]
    figures = {metric: value * ratios[metric] if value is not None and metric in ratios else value
               for metric, value in roofline.items()}
    trials = calibration["trials"]
    return figures, f"calibrated on {trials} trial{'s' if trials != 1 else ''} of this cluster"
