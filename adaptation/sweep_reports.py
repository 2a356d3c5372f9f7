"""Benchmark reports of a sweep stage: charts (plotly, built here from the stored trials), the self-contained HTML
download, the CSV of trials, and the page that compares two reports side by side.

Charts: throughput vs batch size per precision; TTFT and TPOT vs batch size; latency CDF (from each trial's
recorded p50/p90/p99); throughput vs latency with its Pareto front; the roofline with every trial on it; predicted
vs measured time. Metric definitions are vLLM's (see workers/engine/sweep/metrics.py).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import plotly.graph_objects as go
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.utils.html import escape

from .models import StageRun

PLOTLY_JS = Path(settings.BASE_DIR) / "static" / "vendor" / "plotly.min.js"
CSV_COLUMNS = ["id", "rung", "status", "precision", "batch_size", "page_size", "max_batch_tokens",
               "output_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
               "itl_p50_s", "e2e_p50_s", "e2e_p99_s", "goodput_requests_per_s", "peak_memory_bytes",
               "roofline_efficiency", "bound", "reason"]


def ok_trials(result: dict) -> list[dict]:
    return [trial for trial in result.get("trials", []) if trial.get("status") == "ok" and trial.get("metrics")]


def _layout(title: str, x: str, y: str, **extra) -> dict:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}}, "yaxis": {"title": {"text": y}},
            "height": 360, "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, **extra}


def _by_precision(trials: list[dict]) -> dict[str, list[dict]]:
    """Per precision, the best trial (highest output tokens/s) at each batch size, by batch size: the curves a
    reader compares; every trial is in the table, the Pareto plot and the roofline."""
    best: dict[tuple[str, int], dict] = {}
    for trial in trials:
        key = (trial["params"]["precision"], trial["params"]["batch_size"])
        if key not in best or trial["metrics"]["output_tokens_per_s"] > best[key]["metrics"]["output_tokens_per_s"]:
            best[key] = trial
    groups: dict[str, list[dict]] = {}
    for (precision, _), trial in sorted(best.items()):
        groups.setdefault(precision, []).append(trial)
    return groups


def figures(result: dict) -> dict[str, go.Figure]:
    trials = ok_trials(result)
    groups = _by_precision(trials)
    label = [f"#{t['id']} {t['params']['precision']} bs{t['params']['batch_size']} "
             f"page{t['params']['page_size']} mbt{t['params']['max_batch_tokens']}" for t in trials]
    throughput = go.Figure(layout=_layout("Output throughput vs batch size (best per size)", "batch size",
                                          "output tokens/s"))
    latency = go.Figure(layout=_layout("TTFT and TPOT (p50) vs batch size (best per size)", "batch size", "seconds"))
    for precision, members in groups.items():
        sizes = [trial["params"]["batch_size"] for trial in members]
        throughput.add_trace(go.Scatter(x=sizes, y=[t["metrics"]["output_tokens_per_s"] for t in members],
                                        mode="markers+lines", name=precision))
        latency.add_trace(go.Scatter(x=sizes, y=[t["metrics"]["ttft_s"]["p50"] for t in members],
                                     mode="markers+lines", name=f"TTFT {precision}"))
        latency.add_trace(go.Scatter(x=sizes, y=[t["metrics"]["tpot_s"]["p50"] for t in members],
                                     mode="markers+lines", name=f"TPOT {precision}", line={"dash": "dot"}))
    cdf = go.Figure(layout=_layout("End-to-end latency CDF (recorded percentiles)", "seconds", "fraction of requests"))
    for trial, name in zip(trials, label, strict=True):
        e2e = trial["metrics"]["e2e_latency_s"]
        cdf.add_trace(go.Scatter(x=[0, e2e["p50"], e2e["p90"], e2e["p99"]], y=[0, 0.5, 0.9, 0.99],
                                 mode="lines+markers", name=name))
    pareto = go.Figure(layout=_layout("Throughput vs latency", "TPOT p50 (s)", "output tokens/s"))
    points = [(t["metrics"]["tpot_s"]["p50"], t["metrics"]["output_tokens_per_s"], name)
              for t, name in zip(trials, label, strict=True) if t["metrics"]["tpot_s"]["p50"] is not None]
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
    hardware = result.get("roofline", {})
    bandwidth = hardware.get("memory_bandwidth_bytes_per_s")
    for precision, peak in (hardware.get("flops_per_s") or {}).items():
        if peak and bandwidth:
            ridge = peak / bandwidth
            xs = [ridge / 100, ridge, ridge * 100]
            roofline.add_trace(go.Scatter(x=xs, y=[min(bandwidth * x, peak) for x in xs], mode="lines",
                                          name=f"roof {precision}"))
    roofline.add_trace(go.Scatter(
        x=[t["roofline"]["arithmetic_intensity"] for t in trials],
        y=[t["roofline"]["arithmetic_intensity"] * t["roofline"]["memory_bandwidth_bytes_per_s"]
           * t["roofline"]["efficiency"] if t["roofline"]["bound"] == "memory-bound"
           else t["roofline"]["flops_per_s"] * t["roofline"]["efficiency"] for t in trials],
        text=label, mode="markers", name="trials (ceiling × efficiency)"))
    predicted = go.Figure(layout=_layout("Predicted vs measured time per trial", "predicted (s)", "measured (s)"))
    predicted.add_trace(go.Scatter(x=[t["roofline"]["predicted_seconds"] for t in trials],
                                   y=[t["roofline"]["measured_seconds"] for t in trials], text=label,
                                   mode="markers", name="trials"))
    top = max([t["roofline"]["measured_seconds"] for t in trials] or [1])
    predicted.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="measured = predicted",
                                   line={"dash": "dash", "color": "#98a2b3"}))
    return {"throughput": throughput, "latency": latency, "cdf": cdf, "pareto": pareto, "roofline": roofline,
            "predicted": predicted}


def chart_html(result: dict) -> dict[str, str]:
    return {name: figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{name}",
                                 config={"displaylogo": False, "responsive": True})
            for name, figure in figures(result).items()}


def trials_csv(result: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for trial in result.get("trials", []):
        metrics, roofline, params = trial.get("metrics") or {}, trial.get("roofline") or {}, trial.get("params", {})

        def pick(name, stat, metrics=metrics):
            return (metrics.get(name) or {}).get(stat)

        writer.writerow([trial.get("id"), trial.get("rung"), trial.get("status"), params.get("precision"),
                         params.get("batch_size"), params.get("page_size"), params.get("max_batch_tokens"),
                         metrics.get("output_tokens_per_s"), metrics.get("requests_per_s"), pick("ttft_s", "p50"),
                         pick("ttft_s", "p99"), pick("tpot_s", "p50"), pick("tpot_s", "p99"), pick("itl_s", "p50"),
                         pick("e2e_latency_s", "p50"), pick("e2e_latency_s", "p99"),
                         metrics.get("goodput_requests_per_s"), metrics.get("peak_memory_bytes"),
                         roofline.get("efficiency"), roofline.get("bound"), trial.get("reason")])
    return out.getvalue()


def _sweep_run(request, pk) -> StageRun:
    run = get_object_or_404(StageRun.objects.for_user(request.user).select_related("job__model", "job__cluster"),
                            pk=pk)
    if run.kind != "sweep" or not run.result:
        raise Http404("No sweep report here.")
    return run


def _context(run: StageRun) -> dict:
    return {"run": run, "result": run.result, "charts": chart_html(run.result),
            "trials": run.result.get("trials", []), "best": run.result.get("best"),
            "pipeline": list(run.job.stage_runs.order_by("id").values("kind", "node_name", "status", "started",
                                                                         "finished")),
            "title": f"Sweep of {run.job.model} on {run.node_name} (job {run.job_id})"}


@login_required
def report_page(request, pk):
    return render(request, "adaptation/sweep_report.html", _context(_sweep_run(request, pk)))


def self_contained_html(run: StageRun) -> str:
    """The report as one file that opens offline: plotly's JavaScript and the stylesheet are inlined."""
    context = _context(run)
    body = render_to_string("adaptation/sweep_report_body.html", context)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(context['title'])}</title>"
            f"<style>{_report_css()}</style><script>{PLOTLY_JS.read_text()}</script></head>"
            f"<body>{body}</body></html>")


@login_required
def report_html(request, pk):
    run = _sweep_run(request, pk)
    return download(self_contained_html(run), "text/html", f"d0-sweep-{run.pk}.html")


@login_required
def report_json(request, pk):
    run = _sweep_run(request, pk)
    return download(json.dumps(run.result, indent=2, sort_keys=True), "application/json", f"d0-sweep-{run.pk}.json")


@login_required
def report_csv(request, pk):
    run = _sweep_run(request, pk)
    return download(trials_csv(run.result), "text/csv", f"d0-sweep-{run.pk}.csv")


@login_required
def compare_page(request):
    runs = StageRun.objects.for_user(request.user).filter(kind="sweep", status="succeeded")
    chosen = [runs.select_related("job__model").filter(pk=request.GET.get(key) or 0).first() for key in ("a", "b")]
    sides = [_context(run) for run in chosen if run is not None]
    return render(request, "adaptation/sweep_compare.html", {
        "sides": sides, "choices": runs.select_related("job__model").defer("result").order_by("-id")[:50]})


def download(content: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _report_css() -> str:
    return (Path(settings.BASE_DIR) / "static" / "css" / "d0.css").read_text()
