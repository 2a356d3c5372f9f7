"""Jobs and their stage runs: ``/api/jobs/`` (submit; ``cancel`` and ``retry`` actions) and ``/api/stage-runs/``."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from workers.engine.stages import parameters_json_schema

from .. import filtersets
from ..api.base import TeamScopedRelatedField, TeamScopedViewSet
from ..api.errors import as_drf_validation_error
from ..api.schema import CONFLICT, JOB_EXAMPLE_NAME
from .. import stages as handlers
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
    # Its choices are the registered kinds when the serializer is made (a kind may be registered after start-up).
    stages = serializers.ListField(child=serializers.ChoiceField(choices=()), allow_empty=False)
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["stages"].child.choices = handlers.choices()

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


# The job the docs page offers to submit: a valid one as it stands. Its cluster and model are the caller's own where
# the schema is served to a signed-in user (adaptation/api/schema.py, a postprocessing hook); 1 and 1 elsewhere.
JOB_EXAMPLE = {
    "cluster": 1,
    "model": 1,
    "stages": ["env_check", "op_coverage"],
    "parameters": {"env_check": {"measure_seconds": 1.0}, "op_coverage": {"dtypes": ["bf16"], "decode_steps": 3}},
}


@extend_schema_view(create=extend_schema(examples=[OpenApiExample(
    JOB_EXAMPLE_NAME, value=JOB_EXAMPLE, request_only=True,
    summary="Check the cluster's nodes, then trace the model's operators",
    description="A job that runs as it stands: its cluster and model are the first of your teams' (1 and 1 where "
                "you have none yet: add a cluster and a model first).")]))
class JobViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Adaptation jobs. Submitting saves the job and enqueues it; ``cancel`` and ``retry`` are POST actions."""

    queryset = AdaptationJob.objects.all()
    filterset_class = filtersets.JobFilterSet
    ordering_fields = ["created", "status", "finished"]
    ordering = ["-created"]
    pagination_class = IndexedPageNumberPagination
    select_related = ("team", "cluster", "model", "submitted_by")

    def get_serializer_class(self):
        return JobDetailSerializer if self.action in ("retrieve", "cancel", "retry") else JobSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            # The job's listed columns and, of its team, cluster, model and submitter, only the label the list shows
            # (not a model's config and analysis JSON, nor a user's password hash).
            return queryset.only("stages", "parameters", "status", "progress", "created", "started", "finished",
                                 "error", "retry_of", "team__slug", "cluster__name", "model__name",
                                 "submitted_by__username")
        return queryset.prefetch_related("stage_runs")

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
