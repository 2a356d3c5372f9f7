"""Coverage reports, the operator library, virtual backends and the diff of two models: ``/api/coverage-reports/``,
``/api/operators/``, ``/api/virtual-backends/``, ``/api/coverage-diff/``."""

import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from ..api.base import CreatorOrTeamAdminMixin, TeamField, TeamScopedViewSet, ValidatedModelSerializer
from ..models import CoverageReport, ModelSpec, OperatorRecord, VirtualBackend
from . import services


class CoverageReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = CoverageReport
        fields = ["id", "model", "job", "stage_run", "node", "backend", "dtype", "coverage", "new_operators",
                  "report", "created"]
        read_only_fields = fields


class CoverageReportListSerializer(CoverageReportSerializer):
    gaps = serializers.SerializerMethodField()

    class Meta(CoverageReportSerializer.Meta):
        fields = ["id", "model", "job", "node", "backend", "dtype", "coverage", "new_operators", "created", "gaps"]
        read_only_fields = fields

    def get_gaps(self, report) -> list[str]:
        return report.report.get("summary", {}).get("gaps", [])


class OperatorRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = OperatorRecord
        fields = ["id", "backend", "operator", "status", "first_seen", "last_verified", "first_model"]
        read_only_fields = fields


class VirtualBackendSerializer(ValidatedModelSerializer):
    team = TeamField()
    operators = serializers.ListField(child=serializers.CharField(max_length=200), allow_empty=False,
                                      max_length=100_000, help_text="aten operator names")

    class Meta:
        model = VirtualBackend
        fields = ["id", "team", "name", "description", "operators", "created"]
        validators = []

    def validate_operators(self, value: list[str]) -> list[str]:
        """The names in ATen's form, as an uploaded list's (a 400 quoting the first that are not)."""
        from workers.engine.coverage.virtual_backend import parse_operator_list

        try:
            return parse_operator_list(json.dumps(value), json_format=True)
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None


class CoverageReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Operator coverage per model × backend × dtype; the list gives the gaps, the detail the whole report."""

    queryset = CoverageReport.objects.all()
    filterset_fields = ["model", "backend", "dtype", "job"]
    ordering_fields = ["created", "coverage"]
    ordering = ["-created"]

    def get_serializer_class(self):
        return CoverageReportListSerializer if self.action == "list" else CoverageReportSerializer


class OperatorRecordViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The operator library: every operator verified per backend, with first-seen and last-verified times."""

    queryset = OperatorRecord.objects.all()
    serializer_class = OperatorRecordSerializer
    filterset_fields = ["backend", "status", "operator"]
    ordering_fields = ["operator", "last_verified"]
    ordering = ["backend", "operator"]


class VirtualBackendViewSet(CreatorOrTeamAdminMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                            mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TeamScopedViewSet):
    """Backends described by operator lists; name them in an op_coverage job's ``virtual_backends``."""

    queryset = VirtualBackend.objects.all()
    serializer_class = VirtualBackendSerializer
    ordering = ["name"]
    owner_word = "backend"


class CoverageDiffView(APIView):
    """``?a=<model>&b=<model>[&backend=...]``: the operators model a needs that model b did not."""

    @extend_schema(parameters=[
        OpenApiParameter("a", int, required=True, description="A model of yours: the operators it needs ..."),
        OpenApiParameter("b", int, required=True, description="... that this model of yours did not need."),
        OpenApiParameter("backend", str, description="Only operators not verified on this backend (e.g. cpu)."),
    ], responses={200: dict})
    def get(self, request):
        models = ModelSpec.objects.for_user(request.user)
        try:
            model, other = (models.get(pk=int(request.query_params.get(key, ""))) for key in ("a", "b"))
        except (ValueError, ModelSpec.DoesNotExist):
            raise ValidationError({"a": ["Give two of your models as ?a=<id>&b=<id>."]}) from None
        backend = request.query_params.get("backend") or None
        return Response({"model": model.pk, "other": other.pk, "backend": backend,
                         "operators": services.diff(model, other, backend)})
