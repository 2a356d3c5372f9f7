"""Benchmark reports: ``/api/sweep-reports/`` with ``html`` and ``csv`` downloads."""

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action

from ..reports import ReportViewSet, download
from .services import KIND, self_contained_html, trials_csv


class SweepReportViewSet(ReportViewSet):
    """Benchmark reports: the sweep stages' results. ``html`` (self-contained, opens offline) and ``csv`` download
    them; the detail is the JSON."""

    kind = KIND

    @extend_schema(responses={(200, "text/html"): str})
    @action(detail=True, methods=["get"])
    def html(self, request, pk=None):
        run = self.get_object()
        return download(self_contained_html(run), "text/html", f"d0-sweep-{run.pk}.html")

    @extend_schema(responses={(200, "text/csv"): str})
    @action(detail=True, methods=["get"])
    def csv(self, request, pk=None):
        run = self.get_object()
        return download(trials_csv(run.result), "text/csv", f"d0-sweep-{run.pk}.csv")
