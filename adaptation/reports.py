"""The views every stage report shares, whichever capability's it is (sweeps, engine sweeps, endpoint benchmarks):
the user's report run or a 404, downloads, two reports side by side, and the API's list and detail of a kind's
reports."""

from __future__ import annotations

import json

from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404
from rest_framework import mixins

from .api.base import TeamScopedViewSet
from .choices import JobStatus
from .jobs.api import StageRunListSerializer, StageRunSerializer
from .models import StageRun


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
