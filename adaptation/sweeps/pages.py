"""Sweep report pages: a report with its charts and trial table, its downloads (self-contained HTML, JSON, CSV),
and two reports side by side."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render

from ..models import StageRun
from .services import report_context, self_contained_html, trials_csv


def _sweep_run(request, pk) -> StageRun:
    run = get_object_or_404(StageRun.objects.for_user(request.user).select_related("job__model", "job__cluster"),
                            pk=pk)
    if run.kind != "sweep" or not run.result:
        raise Http404("No sweep report here.")
    return run


@login_required
def report_page(request, pk):
    return render(request, "adaptation/sweeps/report.html", report_context(_sweep_run(request, pk)))


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
    sides = [report_context(run) for run in chosen if run is not None]
    return render(request, "adaptation/sweeps/compare.html", {
        "sides": sides, "choices": runs.select_related("job__model").defer("result").order_by("-id")[:50]})


def download(content: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
