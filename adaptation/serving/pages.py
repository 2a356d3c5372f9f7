"""Engine report pages: the report (recipe first), its JSON and recipe downloads (bare metal, Slurm, Kubernetes LWS),
and two reports side by side."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from ..models import StageRun
from ..reports import compare_context, json_download, report_run
from .services import ENGINE_REPORT_KIND, recipe_download, report_context


def engine_run(request, pk) -> StageRun:
    return report_run(request, pk, ENGINE_REPORT_KIND, "engine report")


@login_required
def report_page(request, pk):
    return render(request, "adaptation/serving/report.html", report_context(engine_run(request, pk)))


@login_required
def report_json(request, pk):
    return json_download(engine_run(request, pk), "d0-engine")


@login_required
def recipe(request, pk, launcher="shell"):
    """The recipe for one launcher (the URL names it: recipe.sh, recipe.sbatch, recipe-lws.yaml)."""
    return recipe_download(engine_run(request, pk), launcher)


@login_required
def compare_page(request):
    return render(request, "adaptation/serving/compare.html",
                  compare_context(request, ENGINE_REPORT_KIND, report_context))
