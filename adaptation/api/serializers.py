from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from .. import catalog, services
from ..choices import StageKind
from ..configs import check_config, model_name, read_config_upload
from ..models import (AdaptationJob, Cluster, CoverageReport, Device, EnvReport, Link, ModelPlan, ModelSpec, Node,
                      OperatorRecord, StageRun, Team, VirtualBackend)
from .errors import as_drf_validation_error


class TeamScopedRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key that only accepts rows of the requesting user's teams: others read as 'does not exist'."""

    def get_queryset(self):
        return self.queryset.model.objects.for_user(self.context["request"].user)


class TeamField(serializers.SlugRelatedField):
    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", queryset=Team.objects.all(), required=False, **kwargs)

    def get_queryset(self):
        return Team.objects.for_user(self.context["request"].user)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Runs the model's own ``full_clean()`` so the admin, the forms and the API apply the same rules (NetBox).

    Subclasses set ``validators = []`` in Meta: DRF's own unique-together validator would make ``team``
    required, while here it defaults to the user's only team; full_clean checks the constraint instead.
    """

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "team" in self.fields and not attrs.get("team") and self.instance is None:
            attrs["team"] = self._default_team()
        instance = self.instance or self.Meta.model()
        for name, value in attrs.items():
            setattr(instance, name, value)
        try:
            instance.full_clean()
        except DjangoValidationError as error:
            raise as_drf_validation_error(error) from None
        # What clean() derives (a model's analysis) is kept, so save() does not derive it a second time.
        for field in self.Meta.model._meta.concrete_fields:
            if not field.editable and not field.primary_key and not field.auto_created:
                attrs.setdefault(field.name, getattr(instance, field.name))
        return attrs

    def _default_team(self):
        team = services.default_team(self.context["request"].user)
        if team is None:
            raise serializers.ValidationError({"team": ["You belong to several teams (or none): say which one."]})
        return team


class ClusterSerializer(ValidatedModelSerializer):
    team = TeamField()
    join_name = serializers.CharField(read_only=True)
    nodes_online = serializers.IntegerField(read_only=True)
    node_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Cluster
        fields = ["id", "team", "name", "description", "expected_devices_per_node", "interconnect", "join_name",
                  "node_count", "nodes_online", "created"]
        validators = []


class NodeSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "cluster_name", "hostname", "queue_name", "status", "last_heartbeat",
                  "registered", "host_facts"]
        read_only_fields = fields


class DeviceSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = Device
        fields = ["id", "node", "hostname", "index", "kind", "name", "memory_bytes", "properties", "measured"]
        read_only_fields = fields


class LinkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Link
        fields = ["id", "cluster", "kind", "code", "source_device", "target_device", "source_node", "target_node",
                  "measured_bandwidth_gbps", "p2p_ok", "updated"]
        read_only_fields = fields


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
                attrs["config"] = read_config_upload(upload)
            elif "config" in attrs:
                attrs["config"] = check_config(attrs["config"])
            elif self.instance is None:
                raise DjangoValidationError("Send the config.json, as 'config_file' (upload) or 'config' (JSON).")
        except DjangoValidationError as error:
            field = "config_file" if upload is not None else "config"
            raise serializers.ValidationError({field: error.messages}) from None
        if self.instance is None:
            try:
                attrs["name"] = model_name(attrs.get("name", ""), attrs["config"], getattr(upload, "name", ""))
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


class JobSerializer(serializers.ModelSerializer):
    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all())
    model = TeamScopedRelatedField(queryset=ModelSpec.objects.all(), required=False, allow_null=True)
    stages = serializers.ListField(child=serializers.ChoiceField(choices=StageKind.choices), allow_empty=False)
    parameters = serializers.JSONField(required=False, default=dict)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    submitted_by = serializers.StringRelatedField(read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    model_name = serializers.CharField(source="model.name", read_only=True, default=None)

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


class EnvReportSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    cluster = serializers.IntegerField(source="node.cluster_id", read_only=True)

    class Meta:
        model = EnvReport
        fields = ["id", "node", "hostname", "cluster", "job", "stage_run", "created", "verdict", "report"]
        read_only_fields = fields


class EnvReportListSerializer(EnvReportSerializer):
    """The list gives each report's checks; the full report (measurements, topology) is on the detail."""

    checks = serializers.JSONField(source="report.checks", read_only=True)

    class Meta(EnvReportSerializer.Meta):
        fields = ["id", "node", "hostname", "cluster", "job", "stage_run", "created", "verdict", "checks"]
        read_only_fields = fields


class PlanRequestSerializer(serializers.Serializer):
    """A cluster of yours (its devices and measured bandwidth) or a what-if one, a precision and a workload."""

    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all(), required=False, allow_null=True)
    devices_per_node = serializers.IntegerField(min_value=1, max_value=256, required=False)
    device_memory_gb = serializers.FloatField(min_value=0.5, max_value=4096, required=False)
    nodes = serializers.IntegerField(min_value=1, max_value=512, default=1)
    device_name = serializers.CharField(required=False, allow_blank=True, default="")
    precision = serializers.ChoiceField(choices=["bf16", "fp16", "fp8", "int8", "int4"], default="bf16")
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


class AdaptRequestSerializer(serializers.Serializer):
    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all())
