"""Jobs and their stage runs: ``/api/jobs/`` (submit; ``cancel`` and ``retry`` actions) and ``/api/stage-runs/``."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from workers.engine.stages import parameters_json_schema

from .. import filtersets
from ..api.base import TeamScopedRelatedField, TeamScopedViewSet
from ..api.errors import as_drf_validation_error
from ..api.schema import CONFLICT
from ..choices import StageKind
from ..models import AdaptationJob, Cluster, ModelSpec, StageRun
from ..pagination import IndexedPageNumberPagination
from . import services


class StageRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = StageRun
        fields = ["id", "job", "kind", "node", "node_name", "status", "progress", "message", "created", "started",
                  "finished", "error", "error_traceback", "result"]
        read_only_fields = fields


class StageRunListSerializer(StageRunSerializer):
    """The list leaves out results and tracebacks; fetch one stage run for them."""

    class Meta(StageRunSerializer.Meta):
        fields = [name for name in StageRunSerializer.Meta.fields if name not in ("result", "error_traceback")]


@extend_schema_field(parameters_json_schema())
class JobParametersField(serializers.JSONField):
    """The job's parameters; the schema is made from each stage's declared parameters (workers/engine)."""


class JobSerializer(serializers.ModelSerializer):
    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all())
    model = TeamScopedRelatedField(queryset=ModelSpec.objects.all(), required=False, allow_null=True)
    stages = serializers.ListField(child=serializers.ChoiceField(choices=StageKind.choices), allow_empty=False)
    parameters = JobParametersField(required=False, default=dict)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    submitted_by = serializers.StringRelatedField(read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    model_name = serializers.CharField(source="model.name", read_only=True, default=None, allow_null=True)

    class Meta:
        model = AdaptationJob
        fields = ["id", "team", "cluster", "cluster_name", "model", "model_name", "stages", "parameters", "status",
                  "progress", "created", "started", "finished", "error", "submitted_by", "retry_of"]
        read_only_fields = ["status", "progress", "created", "started", "finished", "error", "retry_of"]

    def validate_parameters(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Parameters must be a JSON object.")
        return value

    def create(self, validated_data):
        try:
            return services.submit_job(
                team=validated_data["cluster"].team,
                user=self.context["request"].user,
                cluster=validated_data["cluster"],
                model=validated_data.get("model"),
                stages=validated_data["stages"],
                parameters=validated_data.get("parameters") or {},
            )
        except DjangoValidationError as error:
            raise as_drf_validation_error(error) from None


class JobDetailSerializer(JobSerializer):
    stage_runs = StageRunSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "error_traceback", "log", "stage_runs"]
        read_only_fields = [*JobSerializer.Meta.read_only_fields, "error_traceback", "log"]


def job_list_rows(jobs):
    """A page of the job list as plain values: the job's listed columns and, of its team, cluster, model and
    submitter, the label the list shows."""
    return jobs.values("id", "cluster", "model", "stages", "parameters", "status", "progress", "created", "started",
                       "finished", "error", "retry_of", team_slug=F("team__slug"), cluster_name=F("cluster__name"),
                       model_name=F("model__name"), submitted_by_name=F("submitted_by__username"))


class JobRowSerializer(serializers.BaseSerializer):
    """A row of ``job_list_rows`` as JobSerializer writes the job (tests/test_api_lists.py holds them equal): a
    job, its team, cluster, model and submitter made as model instances and read through DRF's fields per column
    were 70% of the list's CPU at 10,000 jobs. The dates go through DRF's own DateTimeField, given the request's
    time zone once: without it, the field looks it up for every date it writes (75 per page, 8% of the list's CPU)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._date = serializers.DateTimeField(default_timezone=timezone.get_current_timezone())

    def to_representation(self, row):
        date = self._date.to_representation
        return {"id": row["id"], "team": row["team_slug"], "cluster": row["cluster"],
                "cluster_name": row["cluster_name"], "model": row["model"], "model_name": row["model_name"],
                "stages": row["stages"], "parameters": row["parameters"], "status": row["status"],
                "progress": row["progress"], "created": date(row["created"]), "started": date(row["started"]),
                "finished": date(row["finished"]), "error": row["error"], "submitted_by": row["submitted_by_name"],
                "retry_of": row["retry_of"]}


class JobViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Adaptation jobs. Submitting saves the job and enqueues it; ``cancel`` and ``retry`` are POST actions."""

    queryset = AdaptationJob.objects.all()
    filterset_class = filtersets.JobFilterSet
    ordering_fields = ["created", "status", "finished"]
    ordering = ["-created"]
    pagination_class = IndexedPageNumberPagination
    page_rows = staticmethod(job_list_rows)  # how the list reads a page's rows (IndexedPageNumberPagination)
    select_related = ("team", "cluster", "model", "submitted_by")

    def get_serializer_class(self):
        if self.action in ("retrieve", "cancel", "retry"):
            return JobDetailSerializer
        if self.action == "list":
            return JobRowSerializer
        return JobSerializer

    def get_queryset(self):
        if self.action == "list":
            # The page's ids come from the team's covering index; only the page's rows are joined (page_rows).
            return self.queryset.for_user(self.request.user)
        return super().get_queryset().prefetch_related("stage_runs")

    @extend_schema(responses=JobSerializer(many=True))
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: JobDetailSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        services.cancel_job(self.get_object(), request.user)
        job = self.get_object()  # as it is now, its stage runs ended too
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={201: JobDetailSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        job = services.retry_job(self.get_object(), request.user)
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)


class StageRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = StageRun.objects.all()
    filterset_class = filtersets.StageRunFilterSet
    ordering_fields = ["created", "status"]
    ordering = ["-id"]

    def get_serializer_class(self):
        return StageRunListSerializer if self.action == "list" else StageRunSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("result", "error_traceback") if self.action == "list" else queryset
