"""The views every stage report shares, whichever capability's it is (sweeps, engine sweeps, endpoint benchmarks,
sharded runs, coverage): the index of a team's reports, the user's report run or a 404, downloads, two reports side
by side, and the API's list and detail of a kind's reports."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from rest_framework import mixins

from .api.base import TeamScopedViewSet
from .choices import JobStatus
from .jobs.api import StageRunListSerializer, StageRunSerializer
from .models import StageRun
from .pagination import IndexedPaginator

# The stage kinds whose runs are reports, in the index's order of its filter, each with its label and its page
# (the coverage of an op_coverage run is read on its model's coverage page, which shows the latest per backend).
REPORT_KINDS = {
    "sweep": ("Sweep", lambda run: reverse("sweep-report", args=[run.pk])),
    "serve_sweep": ("Engine report", lambda run: reverse("engine-report", args=[run.pk])),
    "sharded_run": ("Sharded run", lambda run: reverse("sharded-run", args=[run.pk])),
    "op_coverage": ("Coverage report", lambda run: reverse("model-coverage", args=[run.job.model_id])
                    if run.job.model_id else reverse("job-detail", args=[run.job_id])),
    "endpoint_bench": ("Endpoint benchmark", lambda run: reverse("endpoint-report", args=[run.pk])),
}


def report_runs(user, kind: str | None = None):
    """The user's teams' reports, newest first: the stage runs of a report kind that have a page, without their
    results. A sharded run that failed has one too (its page says what broke); a multi-node engine sweep's
    followers do not (the leader's report is the run's)."""
    kinds = [kind] if kind in REPORT_KINDS else list(REPORT_KINDS)
    has_page = Q(status=JobStatus.SUCCEEDED) | Q(kind="sharded_run", status=JobStatus.FAILED)
    return (StageRun.objects.for_user(user).filter(has_page, kind__in=kinds)
            .exclude(kind="serve_sweep", result__role="follower")
            .select_related("job__model", "job__cluster").defer("result", "job__model__config",
                                                                "job__model__analysis").order_by("-id"))


@login_required
def report_index(request):
    """Every report of the user's teams in one list (sweeps, engine reports, sharded runs, coverage), newest first,
    a page at a time, optionally of one kind (``?kind=sweep``)."""
    kind = request.GET.get("kind") or None
    page = IndexedPaginator(report_runs(request.user, kind), settings.D0_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"run": run, "label": REPORT_KINDS[run.kind][0], "url": REPORT_KINDS[run.kind][1](run)} for run in page]
    return render(request, "adaptation/reports.html", {
        "page": page, "rows": rows, "kind": kind if kind in REPORT_KINDS else "",
        "kinds": [(name, label) for name, (label, _) in REPORT_KINDS.items()],
        "query": f"kind={kind}" if kind in REPORT_KINDS else "",
    })


def report_run(request, pk, kind: str, what: str) -> StageRun:
    """The user's stage run ``pk`` of ``kind`` with a result (a report), else 404."""
    run = get_object_or_404(StageRun.objects.for_user(request.user).select_related("job__model", "job__cluster"),
                            pk=pk)
    if run.kind != kind or not run.result:
        raise Http404(f"No {what} here.")
    return run


def download(content: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def json_download(run: StageRun, prefix: str) -> HttpResponse:
    return download(json.dumps(run.result, indent=2, sort_keys=True), "application/json", f"{prefix}-{run.pk}.json")


def compare_context(request, kind: str, context_of) -> dict:
    """Reports ``?a=`` and ``?b=`` of ``kind`` side by side (each ``context_of(run)``), and the reports to pick."""
    runs = StageRun.objects.for_user(request.user).filter(kind=kind, status=JobStatus.SUCCEEDED).select_related(
        "job__model")
    chosen = [runs.filter(pk=request.GET.get(key) or 0).first() for key in ("a", "b")]
    return {"sides": [context_of(run) for run in chosen if run is not None],
            "pickers": [(key, request.GET.get(key) or "") for key in ("a", "b")],
            "choices": runs.defer("result").order_by("-id")[:50]}


class ReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """A kind's reports (its succeeded stage runs): the list without results, the detail with its JSON. Subclasses
    set ``kind``."""

    queryset = StageRun.objects.all()
    kind = ""
    ordering = ["-id"]
    filterset_fields = ["job"]

    def get_queryset(self):
        return super().get_queryset().filter(kind=self.kind, status=JobStatus.SUCCEEDED)

    def get_serializer_class(self):
        return StageRunListSerializer if self.action == "list" else StageRunSerializer
