"""The charts of a sweep's benchmark report, built server-side with plotly from the stored trials: throughput vs
batch size per precision; TTFT and TPOT vs batch size; latency CDF (from each trial's recorded p50/p90/p99);
throughput vs latency with its Pareto front; the roofline with every trial on it; predicted vs measured time.
Metric definitions are vLLM's (see workers/engine/sweep/metrics.py); the result is read through the engine's
``SweepResult`` and a trial's efficiency, flag included, through its ``Efficiency``.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go

from workers.engine.sweep.result import SweepResult, SweepTrial


def _layout(title: str, x: str, y: str, **extra) -> dict:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}}, "yaxis": {"title": {"text": y}},
            "height": 360, "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, **extra}


def _by_precision(trials: list[SweepTrial]) -> dict[str, list[SweepTrial]]:
    """Per precision, the best trial (highest output tokens/s) at each batch size, by batch size: the curves a
    reader compares; every trial is in the table, the Pareto plot and the roofline."""
    best: dict[tuple[str, int], SweepTrial] = {}
    for trial in trials:
        key = (trial.params["precision"], trial.params["batch_size"])
        if key not in best or trial.metrics.output_tokens_per_s > best[key].metrics.output_tokens_per_s:
            best[key] = trial
    groups: dict[str, list[SweepTrial]] = {}
    for (precision, _), trial in sorted(best.items()):
        groups.setdefault(precision, []).append(trial)
    return groups


def figures(stored: dict) -> dict[str, go.Figure]:
    """The charts of a stored sweep result."""
    result = SweepResult.from_dict(stored)
    trials = result.ok_trials
    groups = _by_precision(trials)
    label = [f"#{t.id} {t.params['precision']} bs{t.params['batch_size']} "
             f"page{t.params['page_size']} mbt{t.params['max_batch_tokens']}" for t in trials]
    throughput = go.Figure(layout=_layout("Output throughput vs batch size (best per size)", "batch size",
                                          "output tokens/s"))
    latency = go.Figure(layout=_layout("TTFT and TPOT (p50) vs batch size (best per size)", "batch size", "seconds"))
    for precision, members in groups.items():
        sizes = [trial.params["batch_size"] for trial in members]
        throughput.add_trace(go.Scatter(x=sizes, y=[t.metrics.output_tokens_per_s for t in members],
                                        mode="markers+lines", name=precision))
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
    return {"throughput": throughput, "latency": latency, "cdf": cdf, "pareto": pareto, "roofline": roofline,
            "predicted": predicted}


def chart_data(stored: dict) -> dict[str, dict]:
    """Each chart as plotly's JSON (data and layout): the page hands it to ``static/js/sweep_report.js`` through a
    json_script block, so no inline script is needed (the pages' Content-Security-Policy allows none)."""
    return {name: json.loads(figure.to_json()) for name, figure in figures(stored).items()}
