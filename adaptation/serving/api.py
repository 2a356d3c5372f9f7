"""Engine reports: ``/api/engine-reports/`` (the serve_sweep stages' results) with a ``recipe`` download for each
launcher (``?launcher=shell|slurm|lws``); serving
endpoints someone else runs (``/api/serving-endpoints/``, the API key write-only) and their benchmarks
(``/api/endpoint-reports/``)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers
from rest_framework.decorators import action

from ..api.base import CreatorOrTeamAdminMixin, TeamField, TeamScopedViewSet, ValidatedModelSerializer
from ..models import ServingEndpoint
from ..reports import ReportViewSet
from .services import ENDPOINT_REPORT_KIND, ENGINE_REPORT_KIND, RECIPE_LAUNCHERS, recipe_download


class EngineReportViewSet(ReportViewSet):
    """Engine reports: a real engine serving the model on a node, its trials, correctness and recipe. The detail is
    the JSON; ``recipe`` downloads the best configuration for a launcher: the per-node shell script (``shell``, the
    default), a Slurm batch script (``slurm``) or a Kubernetes LeaderWorkerSet manifest (``lws``)."""

    kind = ENGINE_REPORT_KIND

    @extend_schema(
        parameters=[OpenApiParameter("launcher", str, enum=list(RECIPE_LAUNCHERS), default="shell",
                                     description="shell: bare-metal commands per node rank; slurm: sbatch script "
                                                 "(srun, one task per node); lws: LeaderWorkerSet manifest")],
        responses={(200, "text/x-shellscript"): str, (200, "application/yaml"): str,
                   (409, "text/plain"): str})
    @action(detail=True, methods=["get"])
    def recipe(self, request, pk=None):
        launcher = request.query_params.get("launcher", "shell")
        if launcher not in RECIPE_LAUNCHERS:
            raise serializers.ValidationError(
                {"launcher": [f"unknown launcher {launcher!r}; one of {', '.join(RECIPE_LAUNCHERS)}"]})
        return recipe_download(self.get_object(), launcher)


class EndpointReportViewSet(ReportViewSet):
    """Benchmarks of serving endpoints someone else runs: d0's load client at each concurrency asked for."""

    kind = ENDPOINT_REPORT_KIND


class ServingEndpointSerializer(ValidatedModelSerializer):
    team = TeamField()
    api_key = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=2000,
                                    help_text="Sent as a bearer token; stored encrypted, never returned.")
    has_api_key = serializers.BooleanField(read_only=True)

    class Meta:
        model = ServingEndpoint
        fields = ["id", "team", "name", "base_url", "served_model", "api_key", "has_api_key", "created"]
        validators = []

    def validate(self, attrs):
        key = attrs.pop("api_key", None)
        attrs = super().validate(attrs)
        if key is not None:
            attrs["api_key"] = key
        return attrs

    def create(self, validated_data):
        key = validated_data.pop("api_key", None)
        endpoint = super().create(validated_data)
        if key is not None:
            endpoint.set_api_key(key)
            endpoint.save(update_fields=["api_key_encrypted"])
        return endpoint

    def update(self, instance, validated_data):
        # A key given with a new base_url is kept; a new base_url alone drops the stored key (the model's save).
        key = validated_data.pop("api_key", None)
        if key is not None:
            validated_data.pop("api_key_encrypted", None)  # the stored key, which the validation carried along
            instance.set_api_key(key)
        return super().update(instance, validated_data)


class ServingEndpointViewSet(CreatorOrTeamAdminMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                             mixins.RetrieveModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                             TeamScopedViewSet):
    """OpenAI-compatible endpoints the team runs elsewhere; benchmark one with a job of stage ``endpoint_bench``
    and parameters ``{"endpoint_bench": {"endpoint": id, "concurrency": [1, 4]}}``."""

    queryset = ServingEndpoint.objects.all()
    serializer_class = ServingEndpointSerializer
    ordering = ["name"]
    owner_word = "endpoint"
