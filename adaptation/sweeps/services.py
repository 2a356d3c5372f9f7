"""Sweep reports (a job's ``sweep`` stage) as the pages, the API and the downloads read them: the report's context,
the self-contained HTML that opens offline, the CSV of trials; what a node's env check measured, as the sweep's
roofline wants it; and the sweep the whole adaptation runs.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from django.conf import settings
from django.template.loader import render_to_string
from django.utils.html import escape

from ..models import Node, StageRun
from .charts import chart_data

PLOTLY_JS = Path(settings.BASE_DIR) / "static" / "vendor" / "plotly.min.js"
REPORT_JS = Path(settings.BASE_DIR) / "static" / "js" / "sweep_report.js"
CSV_COLUMNS = ["id", "rung", "status", "precision", "batch_size", "page_size", "max_batch_tokens",
               "output_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
               "itl_p50_s", "e2e_p50_s", "e2e_p99_s", "goodput_requests_per_s", "peak_memory_bytes",
               "roofline_efficiency", "roofline_ceiling_suspect", "roofline_end_to_end_efficiency", "step_overhead_s",
               "bound", "reason"]
# A sweep small enough for a CPU node yet with 12 configurations; nodes with accelerators can be given more.
ADAPTATION_SWEEP = {"grid": {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16, 32],
                             "max_batch_tokens": [256]},
                    "workload": {"requests": 8, "prompt_len": 32, "output_len": 16}, "search": "smart"}


def measured_hardware(node: Node) -> dict | None:
    """What the node's latest env check measured, as the sweep's roofline wants it (None if never checked)."""
    devices = list(node.devices.all())
    measured = [device.measured for device in ([d for d in devices if d.kind != "cpu"] or devices) if device.measured]
    if not measured:
        return None
    first = measured[0]
    hardware = {"flops_per_s": {dtype: value for dtype, value in (first.get("matmul_flops_per_s") or {}).items()
                                if value}}
    if first.get("copy_bandwidth_bytes_per_s"):
        hardware["memory_bandwidth_bytes_per_s"] = first["copy_bandwidth_bytes_per_s"]
    return hardware


def spreadsheet_safe(value):
    """A cell a spreadsheet shows as text: a string that starts like a formula (=, +, -, @, tab, CR) gets a leading
    apostrophe (OWASP's CSV injection advice). The strings come from nodes, so they are not trusted."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def trials_csv(result: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for trial in result.get("trials", []):
        metrics, roofline, params = trial.get("metrics") or {}, trial.get("roofline") or {}, trial.get("params", {})

        def pick(name, stat, metrics=metrics):
            return (metrics.get(name) or {}).get(stat)

        writer.writerow([spreadsheet_safe(cell) for cell in [
                         trial.get("id"), trial.get("rung"), trial.get("status"), params.get("precision"),
                         params.get("batch_size"), params.get("page_size"), params.get("max_batch_tokens"),
                         metrics.get("output_tokens_per_s"), metrics.get("requests_per_s"), pick("ttft_s", "p50"),
                         pick("ttft_s", "p99"), pick("tpot_s", "p50"), pick("tpot_s", "p99"), pick("itl_s", "p50"),
                         pick("e2e_latency_s", "p50"), pick("e2e_latency_s", "p99"),
                         metrics.get("goodput_requests_per_s"), metrics.get("peak_memory_bytes"),
                         roofline.get("efficiency"),
                         # Above 1 cannot be true: the ceiling (the node's figures) is wrong, said in its own column.
                         flagged(roofline) if roofline else None,
                         roofline.get("end_to_end_efficiency"), roofline.get("overhead_seconds_per_step"),
                         roofline.get("bound"), trial.get("reason")]])
    return out.getvalue()


def flagged(roofline: dict) -> bool:
    """Whether a trial's roofline efficiency cannot be shown as a figure: flagged by the sweep, or (a report from
    before flags) above 1."""
    return bool(roofline.get("flag")) or (roofline.get("efficiency") or 0) > 1


def over_ceiling(result: dict) -> int:
    """How many trials' efficiencies are flagged (an efficiency above 1 cannot be true)."""
    return sum(flagged(trial.get("roofline") or {}) for trial in result.get("trials", []))


def report_context(run: StageRun) -> dict:
    return {"run": run, "result": run.result, "charts": chart_data(run.result), "charts_id": f"sweep-charts-{run.pk}",
            "over_ceiling": over_ceiling(run.result),
            "trials": run.result.get("trials", []), "best": run.result.get("best"),
            "pipeline": list(run.job.stage_runs.order_by("id").values("kind", "node_name", "status", "started",
                                                                         "finished")),
            "title": f"Sweep of {run.job.model} on {run.node_name} (job {run.job_id})"}


def self_contained_html(run: StageRun) -> str:
    """The report as one file that opens offline: plotly's JavaScript, the script that draws the charts and the
    stylesheet are inlined."""
    context = report_context(run)
    body = render_to_string("adaptation/sweeps/report_body.html", context)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(context['title'])}</title>"
            f"<style>{_report_css()}</style><script>{PLOTLY_JS.read_text()}</script></head>"
            f"<body>{body}<script>{REPORT_JS.read_text()}</script></body></html>")


def _report_css() -> str:
    return (Path(settings.BASE_DIR) / "static" / "css" / "d0.css").read_text()
