"""Sweep report pages: a report with its charts and trial table, its downloads (self-contained HTML, JSON, CSV),
and two reports side by side."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from ..models import StageRun
from ..reports import compare_context, download, json_download, report_run
from .services import KIND, report_context, self_contained_html, trials_csv


def _sweep_run(request, pk) -> StageRun:
    return report_run(request, pk, KIND, "sweep report")


@login_required
def report_page(request, pk):
    return render(request, "adaptation/sweeps/report.html", report_context(_sweep_run(request, pk)))


@login_required
def report_html(request, pk):
    run = _sweep_run(request, pk)
    return download(self_contained_html(run), "text/html", f"d0-sweep-{run.pk}.html")


@login_required
def report_json(request, pk):
    return json_download(_sweep_run(request, pk), "d0-sweep")


@login_required
def report_csv(request, pk):
    run = _sweep_run(request, pk)
    return download(trials_csv(run.result), "text/csv", f"d0-sweep-{run.pk}.csv")


@login_required
def compare_page(request):
    return render(request, "adaptation/sweeps/compare.html", compare_context(request, KIND, report_context))
