"""Models (a config.json, analysed on upload), the catalog, and kept plans: ``/api/models/`` (with the ``plan`` and
``adapt`` actions), ``/api/catalog/``, ``/api/model-plans/``."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import filtersets
from ..api.base import TeamField, TeamScopedRelatedField, TeamScopedViewSet, ValidatedModelSerializer
from ..api.errors import ConflictError
from ..api.schema import CONFLICT
from ..jobs.api import JobDetailSerializer
from ..models import Cluster, ModelPlan, ModelSpec
from ..teams.services import is_team_admin
from . import catalog, services
from .adapt import submit_adaptation


class ModelSpecSerializer(ValidatedModelSerializer):
    team = TeamField()
    name = serializers.CharField(max_length=200, required=False)
    config = serializers.JSONField(required=False, help_text="The config.json as a JSON object (or send config_file).")
    config_file = serializers.FileField(write_only=True, required=False, help_text="The config.json file itself.")
    catalog = serializers.ChoiceField(choices=sorted(catalog.BY_SLUG), write_only=True, required=False,
                                      help_text="Start from a known model of d0's catalog instead of a file.")
    created_by = serializers.StringRelatedField(read_only=True)

    class Meta:
        model = ModelSpec
        fields = ["id", "team", "name", "architecture", "config", "config_file", "catalog", "catalog_slug",
                  "source_note", "created_by", "created", "analysis"]
        read_only_fields = ["architecture", "catalog_slug", "analysis"]
        validators = []

    def validate(self, attrs):
        upload = attrs.pop("config_file", None)
        slug = attrs.pop("catalog", None)
        if slug:
            entry = catalog.BY_SLUG[slug]
            attrs.update(config=entry.config(), catalog_slug=slug, name=attrs.get("name") or entry.name)
            attrs.setdefault("source_note", f"d0 catalog: {entry.hf_id}")
        try:
            if upload is not None:
                attrs["config"] = services.read_config_upload(upload)
            elif "config" in attrs:
                attrs["config"] = services.check_config(attrs["config"])
            elif self.instance is None:
                raise DjangoValidationError("Send the config.json, as 'config_file' (upload) or 'config' (JSON).")
        except DjangoValidationError as error:
            field = "config_file" if upload is not None else "config"
            raise serializers.ValidationError({field: error.messages}) from None
        if self.instance is None:
            try:
                attrs["name"] = services.model_name(attrs.get("name", ""), attrs["config"],
                                                    getattr(upload, "name", ""))
            except DjangoValidationError as error:
                raise serializers.ValidationError({"name": error.messages}) from None
        return super().validate(attrs)


class ModelSpecListSerializer(ModelSpecSerializer):
    """The list leaves out the config itself: it can be megabytes per row."""

    class Meta(ModelSpecSerializer.Meta):
        fields = ["id", "team", "name", "architecture", "catalog_slug", "source_note", "created_by", "created"]


class CatalogEntrySerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    hf_id = serializers.CharField()
    published_total = serializers.FloatField(allow_null=True)
    published_active = serializers.FloatField(allow_null=True)
    note = serializers.CharField()


class PlanRequestSerializer(serializers.Serializer):
    """A cluster of yours (its devices and measured bandwidth) or a what-if one, a precision and a workload."""

    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all(), required=False, allow_null=True)
    devices_per_node = serializers.IntegerField(min_value=1, max_value=256, required=False)
    device_memory_gb = serializers.FloatField(min_value=0.5, max_value=4096, required=False)
    nodes = serializers.IntegerField(min_value=1, max_value=512, default=1)
    device_name = serializers.CharField(required=False, allow_blank=True, default="")
    precision = serializers.ChoiceField(choices=list(services.PLAN_PRECISIONS), default="bf16")
    concurrency = serializers.IntegerField(min_value=1, max_value=65536, default=32)
    context_tokens = serializers.IntegerField(min_value=1, max_value=2**22, default=8192)

    def validate(self, attrs):
        if attrs.get("cluster") is None and not (attrs.get("devices_per_node") and attrs.get("device_memory_gb")):
            raise serializers.ValidationError("Give a cluster, or devices_per_node and device_memory_gb.")
        return attrs


class ModelPlanSerializer(serializers.ModelSerializer):
    created_by = serializers.StringRelatedField(read_only=True)

    class Meta:
        model = ModelPlan
        fields = ["id", "model", "cluster", "request", "result", "created_by", "created"]
        read_only_fields = fields


class AdaptRequestSerializer(serializers.Serializer):
    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all())
    weights_path = serializers.CharField(required=False, allow_blank=True, default="",
                                         help_text="the team's checkpoint folder for the serve sweep, the same path "
                                                   "under a data root of every node; default: a validation "
                                                   "checkpoint (the architecture reduced, seeded random weights)")


class ModelSpecViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       mixins.DestroyModelMixin, TeamScopedViewSet):
    """Released models by their config.json: POST the file as ``config_file`` (multipart) or ``config`` (JSON)."""

    queryset = ModelSpec.objects.all()
    filterset_class = filtersets.ModelSpecFilterSet
    ordering_fields = ["name", "created", "architecture"]
    ordering = ["-created"]
    select_related = ("team", "created_by")

    def get_serializer_class(self):
        return ModelSpecListSerializer if self.action == "list" else ModelSpecSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("config", "analysis") if self.action == "list" else queryset

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)

    @extend_schema(request=PlanRequestSerializer, responses={201: ModelPlanSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def plan(self, request, pk=None):
        """Plan the model on one of your clusters or a what-if one; the prediction is kept (``/api/model-plans/``)."""
        spec = self.get_object()
        plan_request = PlanRequestSerializer(data=request.data, context=self.get_serializer_context())
        plan_request.is_valid(raise_exception=True)
        data = plan_request.validated_data
        cluster = data.get("cluster")
        if cluster is not None:
            devices = services.cluster_devices(cluster)
            if devices is None:
                raise ConflictError(f"Cluster {cluster.name} has no online node with devices to plan on.")
        else:
            devices = {"devices_per_node": data["devices_per_node"], "nodes": data["nodes"],
                       "device_memory_bytes": int(data["device_memory_gb"] * 1e9),
                       "device_name": data["device_name"] or None}
        workload = {"concurrency": data["concurrency"], "context_tokens": data["context_tokens"]}
        kept = services.record(spec, devices, data["precision"], workload, request.user, cluster=cluster)
        return Response(ModelPlanSerializer(kept).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=AdaptRequestSerializer, responses={201: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def adapt(self, request, pk=None):
        """The whole adaptation in one call: env check, operator coverage, a sharded validation run with the
        planner's layout, and the engine's serve sweep at the planner's layout scaled to the cluster."""
        spec = self.get_object()
        adapt_request = AdaptRequestSerializer(data=request.data, context=self.get_serializer_context())
        adapt_request.is_valid(raise_exception=True)
        job = submit_adaptation(model=spec, cluster=adapt_request.validated_data["cluster"], user=request.user,
                                weights_path=adapt_request.validated_data["weights_path"] or None)
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        if instance.created_by_id != self.request.user.pk and not is_team_admin(self.request.user, instance.team):
            raise PermissionDenied("Only the model's uploader or a team admin can delete it.")
        instance.delete()


class ModelPlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Kept planner predictions, to compare with what sharded runs and sweeps measure."""

    queryset = ModelPlan.objects.all()
    serializer_class = ModelPlanSerializer
    filterset_fields = ["model", "cluster"]
    ordering_fields = ["created"]
    ordering = ["-created"]
    select_related = ("created_by",)


class CatalogView(APIView):
    """Known models shipped with d0 (real config.json files) with their vendors' published parameter counts.
    Add one to a team with ``POST /api/models/ {"catalog": "<slug>"}``."""

    @extend_schema(responses={200: CatalogEntrySerializer(many=True)})
    def get(self, request):
        return Response(CatalogEntrySerializer(catalog.CATALOG, many=True).data)
