"""Sweep reports (a job's ``sweep`` stage) as the pages, the API and the downloads read them: the report's context,
the self-contained HTML that opens offline, the CSV of trials (the stored result read through the engine's
``SweepResult``, its trials through the engine's one row declaration, ``trial_row``); what a node's env check
measured, as the sweep's roofline wants it; and the sweep the whole adaptation runs.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.template.loader import render_to_string
from django.utils.html import escape

from workers.engine.sweep.result import SweepResult
from workers.engine.sweep.trial_row import sweep_table

from ..models import Node, StageRun
from .charts import chart_data

KIND = "sweep"
PLOTLY_JS = Path(settings.BASE_DIR) / "static" / "vendor" / "plotly.min.js"
REPORT_JS = Path(settings.BASE_DIR) / "static" / "js" / "sweep_report.js"
# A sweep small enough for a CPU node: 6 configurations; nodes with accelerators can be given more. No page sizes:
# the architectures that need a proxy most (MLA: DeepSeek-V3, Kimi-K2) are served by static batches, which do not
# page, and on a 48-token workload a page size is not a knob the deployment's engine would take from a proxy.
ADAPTATION_SWEEP = {"grid": {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16],
                             "max_batch_tokens": [256]},
                    "workload": {"requests": 8, "prompt_len": 32, "output_len": 16}, "search": "smart"}


def with_measured_hardware(params: dict, node: Node) -> dict:
    """A sweep's parameters with the roofline's figures: the job's own, else what ``node`` measured."""
    return params if "hardware" in params else {**params, "hardware": measured_hardware(node)}


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


def report_context(run: StageRun) -> dict:
    result = SweepResult.from_dict(run.result)
    return {"run": run, "result": result, "charts": chart_data(run.result), "charts_id": f"sweep-charts-{run.pk}",
            "over_ceiling": result.over_ceiling, "table": sweep_table(result), "best": result.best,
            "pipeline": list(run.job.stage_runs.order_by("id").values("kind", "node_name", "status", "started",
                                                                         "finished")),
            "title": f"Sweep of {run.job.model} on {run.node_name} (job {run.job_id})"}


def trials_csv(stored: dict) -> str:
    """The CSV of a stored sweep result's trials: every column of the trial row, in the stored units."""
    return sweep_table(SweepResult.from_dict(stored)).csv()


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
