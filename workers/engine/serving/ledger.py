"""The prediction ledger: what d0 predicted for each engine trial (``prediction.trial_prediction``) beside what was
measured, how far off it was, and the calibration fitted on a cluster's history of such trials.

One row per trial and metric. The metrics are those a deployment is sized by:

- ``output_tokens_per_s``: output tokens / duration (``sweep.metrics``);
- ``ttft_s`` and ``tpot_s``: the median (p50) over the trial's requests, as vLLM's benchmark reports them;
- ``peak_memory_bytes``: the engine's processes' peak resident memory while serving (on an accelerator the device
  memory the engine holds is what matters; on a CPU node, resident memory is where the weights and cache live).

Relative error = |predicted - measured| / measured (AISimulate's and AIConfigurator's definition). The calibration
is fitted per engine and metric on the cluster's trials:

- the time metrics (TTFT, TPOT, and output tok/s as its reciprocal, seconds per output token) by a line,
  measured = fixed + slope x roofline: an engine pays a fixed cost every step (scheduling, Python, sampling) that
  the roofline does not model, so measured / roofline falls as the batch and the roofline's step grow, and no one
  ratio follows it. The line is Theil-Sen's (``sweep.line_fit``): a run slowed 2-4x by another job on the node
  moves it little. With fewer than ``FIT_MIN_TRIALS`` trials, rooflines that do not spread (the largest less than
  ``FIT_MIN_SPREAD`` x the smallest: the slope would be noise), or a line with no positive slope or a negative
  fixed cost, the metric keeps the single ratio;
- every metric also has the median of measured / roofline (``ratios``): the share of the roofline this node
  reaches, the fallback above, and the whole calibration of memory. A calibration stored with only ratios (before
  the lines) still reads.
"""

from __future__ import annotations

from statistics import median

from ..sweep.line_fit import theil_sen_line
from ..sweep.metrics import percentile

METRICS = {"output_tokens_per_s": "output tok/s", "ttft_s": "TTFT (p50)", "tpot_s": "TPOT (p50)",
           "peak_memory_bytes": "peak memory"}
# The percentile of the relative error shown beside the median (AIConfigurator reports P90 errors).
TAIL_PERCENTILE = 90
# The metrics a fixed cost per step weighs on, fitted by a line; output tok/s in seconds per token (its reciprocal).
LINE_METRICS = ("output_tokens_per_s", "ttft_s", "tpot_s")
RECIPROCAL_METRICS = ("output_tokens_per_s",)
# A line needs three trials (two always fit exactly) whose rooflines spread by a fifth at least.
FIT_MIN_TRIALS = 3
FIT_MIN_SPREAD = 1.2
LINE_METHOD = "Theil-Sen line, measured = fixed + slope x roofline"


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


def _as_time(metric: str, value: float) -> float:
    """The figure in the unit a fixed cost adds to: seconds (per output token for throughput)."""
    return 1 / value if metric in RECIPROCAL_METRICS else value


def fit_line(metric: str, points: list[tuple[float, float]]) -> dict | None:
    """The line measured = fixed + slope x roofline over (roofline, measured) ``points`` of ``metric``, in time
    units; None where the single ratio stays (see the module's docstring)."""
    times = [(_as_time(metric, x), _as_time(metric, y)) for x, y in points]
    xs = [x for x, _ in times]
    if len(times) < FIT_MIN_TRIALS or max(xs) < FIT_MIN_SPREAD * min(xs):
        return None
    line = theil_sen_line(times)
    if line is None or line[1] <= 0 or line[0] < 0:
        return None
    fixed, slope = line
    return {"fixed": fixed, "slope": slope, "unit": "s per output token" if metric in RECIPROCAL_METRICS else "s",
            "trials": len(times), "method": LINE_METHOD}


def fit_calibration(rows: list[dict], engine: str) -> dict | None:
    """The calibration of ``engine``'s predictions on these rows (one cluster's history): per metric the median of
    measured / roofline, per time metric the line where one fits, and the number of trials behind it. None when
    no trial of that engine was measured."""
    points: dict[str, list[tuple[float, float]]] = {}
    trials = set()
    for row in rows:
        if row["engine"] == engine:
            points.setdefault(row["metric"], []).append((row["roofline"], row["measured"]))
            trials.add((row.get("source"), row.get("trial")))
    if not points:
        return None
    lines = {metric: fit_line(metric, values) for metric, values in points.items() if metric in LINE_METRICS}
    return {"engine": engine, "trials": len(trials),
            "ratios": {metric: median(y / x for x, y in values) for metric, values in points.items()},
            "lines": {metric: line for metric, line in lines.items() if line},
            "method": f"per time metric a {LINE_METHOD} where {FIT_MIN_TRIALS}+ trials spread; otherwise, and for "
                      "memory, the median of measured / roofline over the cluster's trials of this engine"}


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
    lines = value.get("lines") or {}  # absent from calibrations stored before the lines
    if not isinstance(lines, dict):
        raise ValueError("calibration lines map time metrics to {fixed, slope}")
    for metric, line in lines.items():
        if metric not in LINE_METRICS:
            raise ValueError(f"no calibration line for {metric!r}; lines are fitted for {', '.join(LINE_METRICS)}")
        if not isinstance(line, dict) or not _positive(line.get("slope")) or not (
                isinstance(line.get("fixed"), int | float) and not isinstance(line.get("fixed"), bool)
                and line["fixed"] >= 0):
            raise ValueError(f"calibration line of {metric} needs a positive slope and a fixed cost >= 0")
    return value


def describe_fits(calibration: dict) -> list[dict]:
    """Each metric's fit as the cluster page and the ``ledger`` verb show it: its label, and the fit as a formula
    of the roofline's figure."""
    lines = calibration.get("lines") or {}
    shown = []
    for metric, ratio in calibration["ratios"].items():
        line = lines.get(metric)
        if line and metric in RECIPROCAL_METRICS:
            fit = f"1 / ({line['fixed']:.3g} s + {line['slope']:.3g} × the roofline's s per token)"
        elif line:
            fit = f"{line['fixed']:.3g} s + {line['slope']:.3g} × roofline"
        else:
            fit = f"roofline × {ratio:.3g}"
        shown.append({"metric": metric, "label": METRICS[metric], "ratio": ratio, "line": line, "fit": fit})
    return shown


def calibrate_figure(metric: str, roofline, calibration: dict):
    """One roofline figure as the calibration predicts it: on its line where the metric has one, else x its
    ratio, else as it is."""
    if roofline is None:
        return None
    line = (calibration.get("lines") or {}).get(metric)
    if line:
        time = line["fixed"] + line["slope"] * _as_time(metric, roofline)
        return _as_time(metric, time)
    ratio = calibration["ratios"].get(metric)
    return roofline * ratio if ratio is not None else roofline


def calibrated(roofline: dict, calibration: dict | None) -> tuple[dict, str]:
    """The prediction for a trial from its roofline figures (``calibrate_figure``), and the sentence saying which
    it is: the trials behind it, and the fit of each metric."""
    if not calibration:
        return dict(roofline), "roofline from the node's env-check figures, not calibrated (no measured trials of " \
                               "this cluster yet)"
    figures = {metric: calibrate_figure(metric, value, calibration) for metric, value in roofline.items()}
    trials = calibration["trials"]
    lines = [METRICS[metric] for metric in METRICS if metric in (calibration.get("lines") or {})]
    ratios = [METRICS[metric] for metric in METRICS if metric in calibration["ratios"] and METRICS[metric] not in lines]
    fits = ([f"fixed cost + slope x roofline for {', '.join(lines)}"] if lines else []) + (
        [f"median measured / roofline for {', '.join(ratios)}"] if ratios else [])
    return figures, f"calibrated on {trials} trial{'s' if trials != 1 else ''} of this cluster ({'; '.join(fits)})"
