"""The charts of a sweep's benchmark report, built server-side with plotly from the stored trials: the finalists'
re-measured runs and the verdict; throughput vs batch size per precision; TTFT and TPOT vs batch size; latency CDF
(from each trial's recorded p50/p90/p99); throughput vs latency with its Pareto front; the roofline with every trial
on it; predicted vs measured time. Metric definitions are vLLM's (see workers/engine/sweep/metrics.py); the result
is read through the engine's ``SweepResult`` and a trial's efficiency, flag included, through its ``Efficiency``.

Throughput is drawn as the verdict judges it (``verdict.summary``): the median of a configuration's runs with their
range as error bars, and for a re-measured finalist its re-measured runs, never the first pass's figure that the
selection biased.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go

from workers.engine.sweep.result import SweepResult, SweepTrial
from workers.engine.sweep.verdict import summary


def _layout(title: str, x: str, y: str, **extra) -> dict:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}}, "yaxis": {"title": {"text": y}},
            "height": 360, "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, **extra}


def judged_throughput(result: SweepResult, trial: SweepTrial) -> dict:
    """A trial's output tokens/s as the verdict judges it: ``verdict.summary`` (median, min, max...) of its
    re-measured runs when it was a finalist, else of its own runs (its one figure in a report without them)."""
    repeats = result.remeasured(trial.id) or trial.repeats
    return summary(repeats.output_tokens_per_s if repeats and repeats.output_tokens_per_s
                   else [trial.metrics.output_tokens_per_s])


def _error_bars(figures: list[dict]) -> dict:
    return {"type": "data", "symmetric": False, "array": [figure["max"] - figure["median"] for figure in figures],
            "arrayminus": [figure["median"] - figure["min"] for figure in figures]}


def _by_precision(result: SweepResult, trials: list[SweepTrial]) -> dict[str, list[tuple[SweepTrial, dict]]]:
    """Per precision, the best trial (highest judged median output tokens/s) at each batch size, by batch size, with
    its judged figure: the curves a reader compares; every trial is in the table, the Pareto plot and the roofline."""
    best: dict[tuple[str, int], tuple[SweepTrial, dict]] = {}
    for trial in trials:
        key = (trial.params["precision"], trial.params["batch_size"])
        judged = judged_throughput(result, trial)
        if key not in best or judged["median"] > best[key][1]["median"]:
            best[key] = (trial, judged)
    groups: dict[str, list[tuple[SweepTrial, dict]]] = {}
    for (precision, _), entry in sorted(best.items()):
        groups.setdefault(precision, []).append(entry)
    return groups


def _verdict_chart(result: SweepResult) -> go.Figure | None:
    """The finalists' re-measured runs (median, and each run), the winner and runner-up named, the verdict in the
    title: the figures the pick was made on. None when nothing was re-measured."""
    rows = [row for row in (result.confirmation or {}).get("candidates") or []
            if row.get("status") == "ok" and (row.get("repeats") or {}).get("output_tokens_per_s")]
    if not rows:
        return None
    verdict = result.verdict
    title = (f"Finalists re-measured: {verdict.verdict}" if verdict
             else "Finalists re-measured (no verdict: a report stored before verdicts)")
    figure = go.Figure(layout=_layout(title, "configuration", "output tokens/s"))
    roles = {}
    if verdict and verdict.winner:
        roles[verdict.winner.id] = "winner"
        if verdict.runner_up:
            roles[verdict.runner_up.id] = "runner-up"
    names = [f"#{row['id']} {row['params']['precision']} bs{row['params']['batch_size']}"
             + (f" ({roles[row['id']]})" if row["id"] in roles else "") for row in rows]
    judged = [summary(row["repeats"]["output_tokens_per_s"]) for row in rows]
    figure.add_trace(go.Scatter(x=names, y=[entry["median"] for entry in judged], error_y=_error_bars(judged),
                                mode="markers", marker={"size": 11}, name="median of the re-measured runs"))
    figure.add_trace(go.Scatter(x=[name for name, entry in zip(names, judged, strict=True) for _ in entry["runs"]],
                                y=[run for entry in judged for run in entry["runs"]], mode="markers",
                                marker={"symbol": "circle-open", "color": "#98a2b3"}, name="each run"))
    return figure


def figures(stored: dict) -> dict[str, go.Figure]:
    """The charts of a stored sweep result."""
    result = SweepResult.from_dict(stored)
    trials = result.ok_trials
    groups = _by_precision(result, trials)
    label = [f"#{t.id} {t.params['precision']} bs{t.params['batch_size']} "
             f"page{t.params['page_size']} mbt{t.params['max_batch_tokens']}" for t in trials]
    throughput = go.Figure(layout=_layout("Output throughput vs batch size (best per size; median and range of "
                                          "the runs, re-measured for the finalists)", "batch size",
                                          "output tokens/s"))
    latency = go.Figure(layout=_layout("TTFT and TPOT (p50) vs batch size (best per size)", "batch size", "seconds"))
    for precision, entries in groups.items():
        members = [trial for trial, _ in entries]
        judged = [figure for _, figure in entries]
        sizes = [trial.params["batch_size"] for trial in members]
        throughput.add_trace(go.Scatter(x=sizes, y=[figure["median"] for figure in judged],
                                        error_y=_error_bars(judged), mode="markers+lines", name=precision))
        latency.add_trace(go.Scatter(x=sizes, y=[t.metrics.ttft_s.p50 for t in members],
                                     mode="markers+lines", name=f"TTFT {precision}"))
        latency.add_trace(go.Scatter(x=sizes, y=[t.metrics.tpot_s.p50 if t.metrics.tpot_s else None for t in members],
                                     mode="markers+lines", name=f"TPOT {precision}", line={"dash": "dot"}))
    raw = all(trial.metrics.e2e_latency_samples_s for trial in trials)
    cdf = go.Figure(layout=_layout("End-to-end latency CDF (" + ("every request" if raw else
                                                                 "recorded percentiles: an older report") + ")",
                                   "seconds", "fraction of requests"))
    for trial, name in zip(trials, label, strict=True):
        sampled = trial.metrics.e2e_latency_samples_s
        if raw:
            count = len(sampled)
            cdf.add_trace(go.Scatter(x=sampled, y=[(index + 1) / count for index in range(count)],
                                     mode="lines", line={"shape": "hv"}, name=name))
            continue
        e2e = trial.metrics.e2e_latency_s
        cdf.add_trace(go.Scatter(x=[0, e2e.p50, e2e.p90, e2e.p99], y=[0, 0.5, 0.9, 0.99],
                                 mode="lines+markers", name=name))
    pareto = go.Figure(layout=_layout("Throughput vs latency", "TPOT p50 (s)", "output tokens/s"))
    points = [(t.metrics.tpot_s.p50, t.metrics.output_tokens_per_s, name)
              for t, name in zip(trials, label, strict=True) if t.metrics.tpot_s and t.metrics.tpot_s.p50 is not None]
    pareto.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], text=[p[2] for p in points],
                                mode="markers", name="trials"))
    front, best = [], -1.0
    for point in sorted(points):  # lowest latency first: a point is on the front if nothing faster beats it
        if point[1] > best:
            front.append(point)
            best = point[1]
    pareto.add_trace(go.Scatter(x=[p[0] for p in front], y=[p[1] for p in front], mode="lines+markers",
                                name="Pareto front", line={"color": "#d92d20"}))
    roofline = go.Figure(layout=_layout("Roofline", "arithmetic intensity (FLOP/byte)", "FLOP/s",
                                        xaxis={"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
                                        yaxis={"type": "log", "title": {"text": "FLOP/s"}}))
    hardware = result.roofline
    bandwidth = hardware.get("memory_bandwidth_bytes_per_s")
    for precision, peak in (hardware.get("flops_per_s") or {}).items():
        if peak and bandwidth:
            ridge = peak / bandwidth
            xs = [ridge / 100, ridge, ridge * 100]
            roofline.add_trace(go.Scatter(x=xs, y=[min(bandwidth * x, peak) for x in xs], mode="lines",
                                          name=f"roof {precision}"))
    with_roofline = [(t, name) for t, name in zip(trials, label, strict=True) if t.roofline]
    shown = [(t, name) for t, name in with_roofline if not t.efficiency.flagged and t.efficiency.figure is not None]
    roofline.add_trace(go.Scatter(
        x=[t.roofline.arithmetic_intensity for t, _ in shown],
        y=[t.roofline.roof * t.efficiency.figure for t, _ in shown],
        text=[name for _, name in shown], mode="markers", name="trials (ceiling × efficiency, overhead out)"))
    # A flagged trial has no figure to plot: it is marked on its ceiling, so it is seen and not mistaken for one.
    suspect = [(t, name) for t, name in with_roofline if t.efficiency.flagged]
    if suspect:
        roofline.add_trace(go.Scatter(
            x=[t.roofline.arithmetic_intensity for t, _ in suspect],
            y=[t.roofline.roof for t, _ in suspect],
            text=[f"{name}: {t.efficiency.note}" for t, name in suspect],
            mode="markers", marker={"symbol": "x", "size": 10, "color": "#d92d20"},
            name="flagged: no efficiency (over the ceiling)"))
    trials = [t for t, _ in with_roofline]
    label = [name for _, name in with_roofline]
    predicted = go.Figure(layout=_layout("Predicted vs measured time per trial", "predicted (s)", "measured (s)"))
    predicted.add_trace(go.Scatter(x=[t.roofline.predicted_seconds for t in trials],
                                   y=[t.roofline.measured_seconds for t in trials], text=label,
                                   mode="markers", name="trials"))
    top = max([t.roofline.measured_seconds for t in trials] or [1])
    predicted.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="measured = predicted",
                                   line={"dash": "dash", "color": "#98a2b3"}))
    verdict = _verdict_chart(result)
    return {**({"verdict": verdict} if verdict else {}), "throughput": throughput, "latency": latency, "cdf": cdf,
            "pareto": pareto, "roofline": roofline, "predicted": predicted}


def chart_data(stored: dict) -> dict[str, dict]:
    """Each chart as plotly's JSON (data and layout): the page hands it to ``static/js/sweep_report.js`` through a
    json_script block, so no inline script is needed (the pages' Content-Security-Policy allows none)."""
    return {name: json.loads(figure.to_json()) for name, figure in figures(stored).items()}
