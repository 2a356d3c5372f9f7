"""Engine reports: ``/api/engine-reports/`` (the serve_sweep stages' results) with a ``recipe`` download."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action

from ..api.base import TeamScopedViewSet
from ..jobs.api import StageRunListSerializer, StageRunSerializer
from ..models import StageRun
from ..sweeps.pages import download
from .services import ENGINE_REPORT_KIND, recipe_script


class EngineReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Engine reports: a real engine serving the model on a node, its trials, correctness and recipe. The detail is
    the JSON; ``recipe`` downloads the best configuration as a shell script."""

    queryset = StageRun.objects.filter(kind=ENGINE_REPORT_KIND, status="succeeded")
    ordering = ["-id"]
    filterset_fields = ["job"]

    def get_serializer_class(self):
        return StageRunListSerializer if self.action == "list" else StageRunSerializer

    @extend_schema(responses={(200, "text/x-shellscript"): str})
    @action(detail=True, methods=["get"])
    def recipe(self, request, pk=None):
        run = self.get_object()
        return download(recipe_script(run.result), "text/x-shellscript", f"d0-recipe-{run.pk}.sh")
