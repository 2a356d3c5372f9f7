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
- beside the line, a cost per sequence in a step: measured = fixed + slope x roofline + per_sequence x sequences
  (the requests a step carries, ``prediction.trial_prediction``'s ``concurrency``). A small model's decode step
  reads the same weights at every batch, so its roofline is flat over the grid, while a CPU engine samples,
  detokenises and schedules every sequence in every step: the measured TPOT grows with the batch and no line of
  the roofline follows it. The term is the Theil-Sen line of what the line (or the ratio) leaves against the
  sequences, and it is kept only where it earns its place: a positive cost per sequence, sequences that spread
  (the most at least ``SEQUENCE_MIN_SPREAD`` x the fewest), and, each calibration trial left out in turn and
  predicted from the others, a smaller median + P90 relative error than without it;
- where the rooflines spread but no line fits (its fixed cost would be negative: measured / roofline grows with the
  roofline, as a CPU engine's share of the roofline does with the batch here), a power law, measured = scale x
  roofline ^ exponent (Theil-Sen in logs; positive for any roofline, so it does not predict a negative time past
  the trials, as the line would), kept where left-out trials are predicted closer by it than by the ratio;
- every metric also has the median of measured / roofline (``ratios``): the share of the roofline this node
  reaches, the fallback above, and the whole calibration of memory. A calibration stored with only ratios (before
  the lines) or without the per-sequence term (before it) still reads.
"""

from __future__ import annotations

import math
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
SEQUENCE_MIN_SPREAD = 2
LINE_METHOD = "Theil-Sen line, measured = fixed + slope x roofline"
SEQUENCE_METHOD = "+ per_sequence x the sequences a step carries, kept where it predicts left-out trials closer"
POWER_METHOD = "power law, measured = scale x roofline ^ exponent (Theil-Sen in logs)"


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


def _sequences(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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
                             "measured": measured[metric], "calibrated": bool(ledger.get("calibration")),
                             "sequences": _sequences(ledger.get("concurrency"))})
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


def _unit(metric: str) -> str:
    return "s per output token" if metric in RECIPROCAL_METRICS else "s"


def _times(metric: str, points: list[tuple]) -> list[tuple[float, float, int | None]]:
    """(roofline, measured, sequences) ``points`` of ``metric`` with both figures in time units."""
    return [(_as_time(metric, roofline), _as_time(metric, measured), sequences)
            for roofline, measured, sequences in points]


def _spread(times: list[tuple]) -> bool:
    """Enough trials, with rooflines far enough apart, for a fit along the roofline (else its slope is noise)."""
    xs = [x for x, *_ in times]
    return len(times) >= FIT_MIN_TRIALS and max(xs) >= FIT_MIN_SPREAD * min(xs)


def _ratio(times: list[tuple]) -> tuple[float, float, float]:
    """The single ratio as a fit (fixed, slope, per_sequence): what is left where no other form fits."""
    return 0.0, median(y / x for x, y, _ in times), 0.0


def _line_in_time(times: list[tuple]) -> tuple[float, float] | None:
    """(fixed, slope) of the Theil-Sen line through (roofline, measured) seconds; None where the single ratio stays
    (see the module's docstring)."""
    if not _spread(times):
        return None
    line = theil_sen_line([(x, y) for x, y, _ in times])
    if line is None or line[1] <= 0 or line[0] < 0:
        return None
    return line


def _time_fit(times: list[tuple[float, float, int | None]], per_sequence: bool) -> tuple | None:
    """(fixed, slope, per_sequence) over (roofline, measured, sequences) seconds: the line, with the cost per
    sequence where ``per_sequence`` asks and one fits; None where only the ratio is left."""
    line = _line_in_time(times)
    if not per_sequence:
        return (*line, 0.0) if line else None
    fixed, slope = line or _ratio(times)[:2]
    left = [(n, y - fixed - slope * x) for x, y, n in times if n]
    counts = [n for n, _ in left]
    if len(left) < FIT_MIN_TRIALS or max(counts) < SEQUENCE_MIN_SPREAD * min(counts):
        return None
    term = theil_sen_line(left)
    if term is None or term[1] <= 0:
        return None
    if line:
        fit = (fixed + term[0], slope, term[1])
    else:
        # The roofline is flat: what the term leaves at no sequences is a share of that one roofline, not a fixed
        # cost of its own (measured = slope x roofline + per_sequence x sequences).
        fit = (0.0, slope + term[0] / median(x for x, _, _ in times), term[1])
    return fit if fit[0] >= 0 and fit[1] > 0 else None


def _predict_time(fit: tuple, roofline_time: float, sequences: int | None) -> float:
    fixed, slope, per_sequence = fit
    return fixed + slope * roofline_time + per_sequence * (sequences or 0)


def _left_out_error(times: list[tuple[float, float, int | None]], predictor) -> float:
    """Median + P90 relative error of each trial predicted by ``predictor(others)`` (a function of the roofline
    and the sequences, fitted on the other trials): how well a form predicts a trial it has not seen."""
    errors = []
    for index, (x, y, n) in enumerate(times):
        errors.append(abs(predictor(times[:index] + times[index + 1:])(x, n) - y) / y)
    return median(errors) + percentile(errors, TAIL_PERCENTILE)


def _fitted_or_ratio(per_sequence: bool):
    """A predictor of ``_left_out_error``: the time fit of this form, else the ratio."""
    def predictor(others):
        fit = _time_fit(others, per_sequence) or _ratio(others)
        return lambda x, n: _predict_time(fit, x, n)
    return predictor


def fit_line(metric: str, points: list[tuple]) -> dict | None:
    """The line measured = fixed + slope x roofline (+ per_sequence x sequences) over (roofline, measured,
    sequences) ``points`` of ``metric``, in time units; None where the single ratio stays (see the module's
    docstring)."""
    times = _times(metric, points)
    fit = _time_fit(times, per_sequence=False)
    with_sequences = _time_fit(times, per_sequence=True)
    if with_sequences and len(times) > FIT_MIN_TRIALS and (
            _left_out_error(times, _fitted_or_ratio(True)) < _left_out_error(times, _fitted_or_ratio(False))):
        fit = with_sequences
    if fit is None:
        return None
    fixed, slope, per_sequence = fit
    line = {"fixed": fixed, "slope": slope, "unit": _unit(metric), "trials": len(times), "method": LINE_METHOD}
    if per_sequence:
        line.update(per_sequence=per_sequence, method=f"{LINE_METHOD} {SEQUENCE_METHOD}")
    return line


# A power law's exponent outside these bounds is no calibration of an engine's cost but of its noise.
POWER_EXPONENTS = (0.25, 4.0)


def _power_in_time(times: list[tuple]) -> tuple[float, float] | None:
    """(scale, exponent) of measured = scale x roofline ^ exponent in seconds, fitted as a Theil-Sen line in logs."""
    if not _spread(times):
        return None
    line = theil_sen_line([(math.log(x), math.log(y)) for x, y, _ in times])
    if line is None or not POWER_EXPONENTS[0] <= line[1] <= POWER_EXPONENTS[1]:
        return None
    return math.exp(line[0]), line[1]


def _ratio_only(others):
    """A predictor of ``_left_out_error``: the ratio."""
    return lambda x, n: _predict_time(_ratio(others), x, n)


def _power_or_ratio(others):
    """A predictor of ``_left_out_error``: the power law, else the ratio."""
    power = _power_in_time(others)
    return (lambda x, n: power[0] * x ** power[1]) if power else _ratio_only(others)


def fit_power(metric: str, points: list[tuple]) -> dict | None:
    """Where no line fits ``points`` (roofline, measured, sequences) of a time metric: the power law, if each trial
    left out is predicted closer by the others' power law than by their ratio (median + P90)."""
    times = _times(metric, points)
    fitted = _power_in_time(times)
    if fitted is None or len(times) <= FIT_MIN_TRIALS or (
            _left_out_error(times, _power_or_ratio) >= _left_out_error(times, _ratio_only)):
        return None
    return {"scale": fitted[0], "exponent": fitted[1], "trials": len(times), "unit": _unit(metric),
            "method": POWER_METHOD}


def fit_calibration(rows: list[dict], engine: str) -> dict | None:
    """The calibration of ``engine``'s predictions on these rows (one cluster's history): per metric the median of
    measured / roofline, per time metric the line (with its cost per sequence) where one fits, and the number of
    trials behind it. None when no trial of that engine was measured."""
    points: dict[str, list[tuple]] = {}
    trials = set()
    for row in rows:
        if row["engine"] == engine:
            points.setdefault(row["metric"], []).append((row["roofline"], row["measured"], row.get("sequences")))
            trials.add((row.get("source"), row.get("trial")))
    if not points:
        return None
    lines = {metric: fit_line(metric, values) for metric, values in points.items() if metric in LINE_METRICS}
    powers = {metric: fit_power(metric, points[metric]) for metric, line in lines.items() if not line}
    return {"engine": engine, "trials": len(trials),
            "ratios": {metric: median(y / x for x, y, _ in values) for metric, values in points.items()},
            "lines": {metric: line for metric, line in lines.items() if line},
            "powers": {metric: power for metric, power in powers.items() if power},
            "method": f"per time metric a {LINE_METHOD} where {FIT_MIN_TRIALS}+ trials spread, with a cost per "
                      "sequence a step carries where it predicts left-out trials closer; where no line fits, a "
                      f"{POWER_METHOD} where it predicts left-out trials closer than the ratio; otherwise, and for "
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
        per_sequence = line.get("per_sequence", 0) if isinstance(line, dict) else None
        if per_sequence != 0 and not _positive(per_sequence):
            raise ValueError(f"calibration line of {metric}: its cost per sequence must be a positive number")
        if not isinstance(line, dict) or not _positive(line.get("slope")) or not (
                isinstance(line.get("fixed"), int | float) and not isinstance(line.get("fixed"), bool)
                and line["fixed"] >= 0):
            raise ValueError(f"calibration line of {metric} needs a positive slope and a fixed cost >= 0")
    powers = value.get("powers") or {}  # absent from calibrations stored before the power laws
    if not isinstance(powers, dict):
        raise ValueError("calibration powers map time metrics to {scale, exponent}")
    for metric, power in powers.items():
        if metric not in LINE_METRICS:
            raise ValueError(f"no calibration power law for {metric!r}; they are fitted for {', '.join(LINE_METRICS)}")
        if not isinstance(power, dict) or not _positive(power.get("scale")) or not (
                _positive(power.get("exponent")) and POWER_EXPONENTS[0] <= power["exponent"] <= POWER_EXPONENTS[1]):
            raise ValueError(f"calibration power law of {metric} needs a positive scale and an exponent in "
                             f"[{POWER_EXPONENTS[0]}, {POWER_EXPONENTS[1]}]")
    return value


def describe_fits(calibration: dict) -> list[dict]:
    """Each metric's fit as the cluster page and the ``ledger`` verb show it: its label, and the fit as a formula
    of the roofline's figure."""
    lines = calibration.get("lines") or {}
    powers = calibration.get("powers") or {}
    shown = []
    for metric, ratio in calibration["ratios"].items():
        line, power = lines.get(metric), powers.get(metric)
        per_sequence = f" + {line['per_sequence']:.3g} s × sequences a step carries" if (
            line and line.get("per_sequence")) else ""
        if line and metric in RECIPROCAL_METRICS:
            fit = f"1 / ({line['fixed']:.3g} s + {line['slope']:.3g} × the roofline's s per token{per_sequence})"
        elif line:
            fit = f"{line['fixed']:.3g} s + {line['slope']:.3g} × roofline{per_sequence}"
        elif power and metric in RECIPROCAL_METRICS:
            fit = f"1 / ({power['scale']:.3g} × (the roofline's s per token) ^ {power['exponent']:.3g})"
        elif power:
            fit = f"{power['scale']:.3g} × roofline ^ {power['exponent']:.3g}"
        else:
            fit = f"roofline × {ratio:.3g}"
        shown.append({"metric": metric, "label": METRICS[metric], "ratio": ratio, "line": line, "power": power,
                      "fit": fit})
    return shown


def calibrate_figure(metric: str, roofline, calibration: dict, sequences: int | None = None):
    """One roofline figure as the calibration predicts it for a trial whose steps carry ``sequences``: on its line
    where the metric has one (a line with a cost per sequence needs them), else x its ratio, else as it is."""
    if roofline is None:
        return None
    line = (calibration.get("lines") or {}).get(metric)
    per_sequence = (line or {}).get("per_sequence") or 0.0
    if line and (not per_sequence or _sequences(sequences)):
        time = _predict_time((line["fixed"], line["slope"], per_sequence), _as_time(metric, roofline), sequences)
        return _as_time(metric, time)
    power = (calibration.get("powers") or {}).get(metric)
    if power and not line:
        return _as_time(metric, power["scale"] * _as_time(metric, roofline) ** power["exponent"])
    ratio = calibration["ratios"].get(metric)
    return roofline * ratio if ratio is not None else roofline


def calibrated(roofline: dict, calibration: dict | None, sequences: int | None = None) -> tuple[dict, str]:
    """The prediction for a trial whose steps carry ``sequences`` from its roofline figures (``calibrate_figure``),
    and the sentence saying which it is: the trials behind it, and the fit of each metric."""
    if not calibration:
        return dict(roofline), "roofline from the node's env-check figures, not calibrated (no measured trials of " \
                               "this cluster yet)"
    figures = {metric: calibrate_figure(metric, value, calibration, sequences) for metric, value in roofline.items()}
    trials = calibration["trials"]
    fitted = calibration.get("lines") or {}
    lines = [METRICS[metric] for metric in METRICS if metric in fitted]
    counted = [METRICS[metric] for metric in METRICS if (fitted.get(metric) or {}).get("per_sequence")]
    powers = [METRICS[metric] for metric in METRICS if metric in (calibration.get("powers") or {})
              and METRICS[metric] not in lines]
    ratios = [METRICS[metric] for metric in METRICS if metric in calibration["ratios"]
              and METRICS[metric] not in lines + powers]
    fits = ([f"fixed cost + slope x roofline for {', '.join(lines)}"] if lines else []) + (
        [f"a cost per sequence in a step for {', '.join(counted)}"] if counted else []) + (
        [f"a power law of the roofline for {', '.join(powers)}"] if powers else []) + (
        [f"median measured / roofline for {', '.join(ratios)}"] if ratios else [])
    return figures, f"calibrated on {trials} trial{'s' if trials != 1 else ''} of this cluster ({'; '.join(fits)})"
