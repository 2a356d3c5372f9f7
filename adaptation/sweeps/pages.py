"""Sweep report pages: a report with its charts and trial table, its downloads (self-contained HTML, JSON, CSV),
and two reports side by side."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render

from ..models import StageRun
from .services import report_context, self_contained_html, trials_csv


def report_run(request, pk, kind: str, what: str) -> StageRun:
    """The user's stage run ``pk`` of ``kind`` with a result (a report), else 404."""
    run = get_object_or_404(StageRun.objects.for_user(request.user).select_related("job__model", "job__cluster"),
                            pk=pk)
    if run.kind != kind or not run.result:
        raise Http404(f"No {what} here.")
    return run


def _sweep_run(request, pk) -> StageRun:
    return report_run(request, pk, "sweep", "sweep report")


def json_download(run: StageRun, prefix: str) -> HttpResponse:
    return download(json.dumps(run.result, indent=2, sort_keys=True), "application/json", f"{prefix}-{run.pk}.json")


def compare_context(request, kind: str, context_of) -> dict:
    """Reports ``?a=`` and ``?b=`` of ``kind`` side by side (each ``context_of(run)``), and the reports to pick."""
    runs = StageRun.objects.for_user(request.user).filter(kind=kind, status="succeeded").select_related("job__model")
    chosen = [runs.filter(pk=request.GET.get(key) or 0).first() for key in ("a", "b")]
    return {"sides": [context_of(run) for run in chosen if run is not None],
            "pickers": [(key, request.GET.get(key) or "") for key in ("a", "b")],
            "choices": runs.defer("result").order_by("-id")[:50]}


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
    return render(request, "adaptation/sweeps/compare.html", compare_context(request, "sweep", report_context))


def download(content: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
