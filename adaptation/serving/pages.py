"""Engine report pages: the report (recipe first), its JSON and recipe downloads, and two reports side by side."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, render

from ..models import StageRun
from ..sweeps.pages import download
from .services import ENGINE_REPORT_KIND, recipe_script, report_context


def engine_run(request, pk) -> StageRun:
    run = get_object_or_404(StageRun.objects.for_user(request.user).select_related("job__model", "job__cluster"),
                            pk=pk)
    if run.kind != ENGINE_REPORT_KIND or not run.result:
        raise Http404("No engine report here.")
    return run


@login_required
def report_page(request, pk):
    return render(request, "adaptation/serving/report.html", report_context(engine_run(request, pk)))


@login_required
def report_json(request, pk):
    run = engine_run(request, pk)
    return download(json.dumps(run.result, indent=2, sort_keys=True), "application/json", f"d0-engine-{run.pk}.json")


@login_required
def recipe(request, pk):
    run = engine_run(request, pk)
    return download(recipe_script(run.result), "text/x-shellscript", f"d0-recipe-{run.pk}.sh")


@login_required
def compare_page(request):
    runs = StageRun.objects.for_user(request.user).filter(kind=ENGINE_REPORT_KIND, status="succeeded")
    chosen = [runs.select_related("job__model").filter(pk=request.GET.get(key) or 0).first() for key in ("a", "b")]
    return render(request, "adaptation/serving/compare.html", {
        "sides": [report_context(run) for run in chosen if run is not None],
        "pickers": [(key, request.GET.get(key) or "") for key in ("a", "b")],
        "choices": runs.select_related("job__model").defer("result").order_by("-id")[:50]})
