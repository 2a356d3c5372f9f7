"""The engine report's charts, built server-side with plotly and handed to ``static/js/sweep_report.js`` as plotly's
JSON. A report is the node's word: only its numbers are drawn (anything else is dropped), and every text on a chart is
the control plane's own (a point is named by its row's number in the page's table).

- The rate sweeps, one per configuration whose trial ran a goodput search (``workers.engine.serving.goodput``): TTFT
  and TPOT percentiles against the request rate (or concurrency), as GuideLLM draws its sweep, with the SLOs as
  horizontal lines and the highest load that met them as a vertical one. Runs that broke an SLO are drawn as crosses.
  Read from the stored trials through the engine's ``ServeSweepResult``.
- Quality against speed, on real weights: each numerics served (a variant, a dtype) at its best throughput against
  its accuracy (or, with no accuracy gate, its top-1 agreement with the reference), with the gate's threshold and
  each quantized variant's recovery threshold. Read from the page's ``services.validation``."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from workers.engine.serving.recipe import number as _number
from workers.engine.sweep.metrics import SLO_PERCENTILES
from workers.engine.sweep.result import ServeSweepResult, ServingTrial

# Each latency the chart draws, its axis (TTFT in the hundreds of ms, TPOT in the tens: one axis each) and its line.
LATENCIES = (("ttft", "TTFT", "y", "solid"), ("tpot", "TPOT", "y2", "dot"))
PERCENTILES = (50, 95, 99)
COLOURS = {50: "#1570ef", 95: "#f79009", 99: "#d92d20"}
# The percentile SLOs drawn on each latency's axis, in the colour of the percentile they bound.
SLO_LINES = {latency: {f"{latency}_p{q}_ms": COLOURS.get(q, "#667085") for q in SLO_PERCENTILES}
             for latency, _, _, _ in LATENCIES}


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


PASSED, FAILED = "#12b76a", "#d92d20"


def quality_figure(validated: dict) -> go.Figure | None:
    """Quality against speed from ``services.validation``: one point per numerics with a throughput and a quality
    figure, named by its row number in the Variants table; a cross where it is not recommended. On accuracy: the
    reference's accuracy, the gate's threshold (reference - X points, which a served Wilson lower bound must reach:
    the error bar reaches down to it) and, on each quantized variant, the accuracy its recovery threshold asks for.
    None when no point can be drawn."""
    rows = [row for row in validated.get("variants") or () if row["output_tokens_per_s"] is not None]
    on_accuracy = any(row["accuracy"] is not None for row in rows)
    key = "accuracy" if on_accuracy else "top1_agreement"
    rows = [row for row in rows if row[key] is not None]
    if not rows:
        return None
    accuracy_of = {row["label"]: row["accuracy"] for row in rows if row["label"] is not None}
    wilson_of = {entry["label"]: (entry["accuracy"] or {}).get("wilson_lower_95")
                 for entry in validated.get("entries") or () if entry["label"] is not None}
    figure = go.Figure(layout={
        "title": {"text": "Quality against speed: each numerics served at its best configuration"},
        "xaxis": {"title": {"text": "output tokens/s (median of the best configuration's runs)"},
                  "rangemode": "tozero"},
        "yaxis": {"title": {"text": "accuracy (%)" if on_accuracy else "top-1 agreement with the reference (%)"}},
        "height": 400, "margin": {"l": 70, "r": 30, "t": 50, "b": 60}, "legend": {"orientation": "h", "y": -0.25}})
    for recommended, name, colour, symbol in ((True, "recommended", PASSED, "circle"),
                                              (False, "not recommended (failed a check)", FAILED, "x")):
        chosen = [row for row in rows if bool(row["recommended"]) == recommended]
        if not chosen:
            continue
        below = [None if not on_accuracy or wilson_of.get(row["label"]) is None
                 else max(0.0, 100 * (row["accuracy"] - wilson_of[row["label"]])) for row in chosen]
        figure.add_trace(go.Scatter(
            x=[row["output_tokens_per_s"] for row in chosen], y=[100 * row[key] for row in chosen],
            text=[f"#{row['number']}" for row in chosen], mode="markers+text", textposition="middle right",
            name=name, marker={"color": colour, "symbol": symbol, "size": 11},
            error_y={"type": "data", "symmetric": False, "array": [0] * len(chosen), "arrayminus": below,
                     "color": colour, "thickness": 1} if any(value is not None for value in below) else None,
            hovertemplate="%{text}: %{x:.1f} tok/s, %{y:.1f}%<extra></extra>"))
    if not on_accuracy:
        return figure
    xs = [row["output_tokens_per_s"] for row in rows]
    span = [0, max(xs) * 1.1]
    reference = ((validated.get("reference") or {}).get("accuracy") or {}).get("accuracy")
    drop = (validated.get("accuracy") or {}).get("max_drop_points")
    if reference is not None:
        figure.add_trace(go.Scatter(x=span, y=[100 * reference] * 2, mode="lines", name="the reference's accuracy",
                                    line={"color": "#1570ef", "dash": "dot", "width": 1}))
        if drop is not None:
            figure.add_trace(go.Scatter(
                x=span, y=[100 * reference - drop] * 2, mode="lines",
                line={"color": FAILED, "dash": "dash", "width": 1},
                name=f"gate: the reference − {drop:g} points (the Wilson lower bound must reach it)"))
    wanted = [(row, accuracy_of.get(row["recovery"]["against"])) for row in rows
              if row["recovery"] and row["recovery"]["threshold_pct"] is not None]
    wanted = [(row, base) for row, base in wanted if base is not None]
    if wanted:
        figure.add_trace(go.Scatter(
            x=[row["output_tokens_per_s"] for row, _ in wanted],
            y=[base * row["recovery"]["threshold_pct"] for row, base in wanted],
            text=[f"#{row['number']}" for row, _ in wanted], mode="markers", name="recovery threshold",
            marker={"symbol": "line-ew-open", "size": 22, "color": "#f79009", "line": {"width": 2}},
            hovertemplate="%{text}: needs %{y:.1f}%<extra></extra>"))
    return figure


def quality_chart_data(validated: dict) -> dict[str, dict]:
    """The quality-against-speed chart as plotly's JSON, by name, for the page's json_script block (empty when
    there is nothing to draw)."""
    figure = quality_figure(validated)
    return {"quality-against-speed": json.loads(figure.to_json())} if figure is not None else {}
