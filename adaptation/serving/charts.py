"""The engine report's rate sweep charts, one per configuration whose trial ran a goodput search
(``workers.engine.serving.goodput``): TTFT and TPOT percentiles against the request rate (or concurrency), as GuideLLM
draws its sweep, with the SLOs as horizontal lines and the highest load that met them as a vertical one. Runs that
broke an SLO are drawn as crosses. Built server-side with plotly from the stored trials (read through the engine's
``ServeSweepResult``) and handed to ``static/js/sweep_report.js`` as plotly's JSON."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from workers.engine.sweep.metrics import SLO_PERCENTILES
from workers.engine.sweep.result import ServeSweepResult, ServingTrial

# Each latency the chart draws, its axis (TTFT in the hundreds of ms, TPOT in the tens: one axis each) and its line.
LATENCIES = (("ttft", "TTFT", "y", "solid"), ("tpot", "TPOT", "y2", "dot"))
PERCENTILES = (50, 95, 99)
COLOURS = {50: "#1570ef", 95: "#f79009", 99: "#d92d20"}
# The percentile SLOs drawn on each latency's axis, in the colour of the percentile they bound.
SLO_LINES = {latency: {f"{latency}_p{q}_ms": COLOURS.get(q, "#667085") for q in SLO_PERCENTILES}
             for latency, _, _, _ in LATENCIES}


def _number(value) -> float | None:
    """A figure as the node sent it, if it is one (a report is the node's word: anything else is not drawn)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _label(trial: ServingTrial) -> str:
    shown = {**(trial.settings or {}), **trial.client}
    return ", ".join(f"{key}={value}" for key, value in shown.items() if key not in ("max_model_len",)) or "defaults"


def rate_sweep_figure(trial: ServingTrial, slo: dict) -> go.Figure:
    goodput = trial.goodput
    over = "concurrency" if goodput.over == "concurrency" else "rate"
    points = [point for point in goodput.rate_sweep if isinstance(point, dict) and _number(point.get(over))]
    loads = [_number(point[over]) for point in points]
    x_title = "request rate (requests/s, Poisson)" if over == "rate" else "concurrency (requests in flight)"
    best, rate = _number(goodput.max_load_meeting_slo), _number(goodput.goodput_requests_per_s) or 0.0
    found = f"goodput {rate:.3g} req/s at {over} {best:.3g}" if best is not None else "no load met the SLOs"
    figure = go.Figure(layout={
        "title": {"text": f"Trial #{trial.id}: {_label(trial)} — {found}"},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": "TTFT (ms)"}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "TPOT (ms)"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
        "height": 380, "margin": {"l": 70, "r": 70, "t": 50, "b": 60}, "legend": {"orientation": "h", "y": -0.25}})
    symbols = ["circle" if point.get("met") else "x" for point in points]
    for latency, name, axis, dash in LATENCIES:
        for q in PERCENTILES:
            figure.add_trace(go.Scatter(x=loads, y=[_number(point.get(f"{latency}_p{q}_ms")) for point in points],
                                        mode="lines+markers", name=f"{name} p{q}", yaxis=axis,
                                        line={"color": COLOURS[q], "dash": dash}, marker={"symbol": symbols}))
        for key, limit in slo.items():
            if key in SLO_LINES.get(latency, ()) and _number(limit) and loads:
                figure.add_trace(go.Scatter(x=[min(loads), max(loads)], y=[limit, limit], mode="lines", yaxis=axis,
                                            name=f"SLO {name} {key.split('_')[1]} ≤ {limit:g} ms",
                                            line={"color": SLO_LINES[latency][key], "dash": "dash", "width": 1}))
    if best is not None:
        figure.add_vline(x=best, line={"color": "#12b76a", "dash": "dash"},
                         annotation_text=f"highest {over} meeting the SLOs")
    return figure


def figures(stored: dict) -> dict[str, go.Figure]:
    """The rate sweep chart of every trial that ran a goodput search, by name (``rate-sweep-<trial id>``)."""
    result = ServeSweepResult.from_dict(stored)
    slo = result.workload.get("slo") if isinstance(result.workload.get("slo"), dict) else {}
    return {f"rate-sweep-{trial.id}": rate_sweep_figure(trial, slo) for trial in result.trials
            if trial.goodput and isinstance(trial.goodput.rate_sweep, list) and trial.goodput.rate_sweep}


def chart_data(stored: dict) -> dict[str, dict]:
    """Each chart as plotly's JSON (data and layout), for the page's json_script block."""
    return {name: json.loads(figure.to_json()) for name, figure in figures(stored).items()}
