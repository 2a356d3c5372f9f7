"""Clusters (team admins write), nodes, devices, links and env-check reports: ``/api/clusters/`` (with
``topology``), ``/api/join-tokens/`` (with ``revoke``), ``/api/nodes/``, ``/api/devices/``, ``/api/links/``,
``/api/env-reports/``."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from .. import control_messages, filtersets
from ..api.base import TeamField, TeamScopedRelatedField, TeamScopedViewSet, ValidatedModelSerializer
from ..models import Cluster, Device, EnvReport, JoinToken, Link, Node
from ..teams.services import is_team_admin
from ..serving import ledger
from . import services, trust


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


class JoinTokenSerializer(serializers.ModelSerializer):
    cluster = TeamScopedRelatedField(queryset=Cluster.objects.all())
    hours = serializers.FloatField(write_only=True, min_value=0.1, max_value=24 * 30, required=False,
                                   help_text="How long it lets nodes join (default D0_JOIN_TOKEN_HOURS, 24).")
    created_by = serializers.StringRelatedField(read_only=True)

    class Meta:
        model = JoinToken
        fields = ["id", "cluster", "token_id", "description", "hours", "created", "created_by", "expires", "revoked",
                  "uses", "last_used"]
        read_only_fields = ["token_id", "created", "expires", "revoked", "uses", "last_used"]


class NewJoinTokenSerializer(JoinTokenSerializer):
    """The create response: the token as every read gives it, plus the whole token and the node's command."""

    token = serializers.CharField(read_only=True, help_text="The whole token: shown this once.")
    join_command = serializers.CharField(read_only=True)

    class Meta(JoinTokenSerializer.Meta):
        fields = [*JoinTokenSerializer.Meta.fields, "token", "join_command"]


class JoinTokenViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       TeamScopedViewSet):
    """Join tokens of your clusters. A team admin makes one (the response carries the whole token, this once) and
    revokes it; a node presents it at its first registration only."""

    queryset = JoinToken.objects.all()
    serializer_class = JoinTokenSerializer
    filterset_fields = ["cluster"]
    ordering = ["-created"]
    select_related = ("cluster__team", "created_by")

    def _require_admin(self, cluster):
        if not is_team_admin(self.request.user, cluster.team):
            raise PermissionDenied(f"Only an admin of team {cluster.team} can manage its join tokens.")

    @extend_schema(responses={201: NewJoinTokenSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        cluster = serializer.validated_data["cluster"]
        self._require_admin(cluster)
        token, whole = trust.create_join_token(cluster, request.user, hours=serializer.validated_data.get("hours"),
                                               description=serializer.validated_data.get("description", ""))
        token.token = whole
        token.join_command = (f"D0_JOIN_TOKEN={whole} python -m workers.node --broker redis://CONTROL-PLANE:6379/0 "
                              f"--cluster {cluster.join_name} --control-key {control_messages.public_key()}")
        data = NewJoinTokenSerializer(token, context=self.get_serializer_context()).data
        response = Response(data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(request=None, responses={200: JoinTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = self.get_object()
        self._require_admin(token.cluster)
        trust.revoke_join_token(token)
        token.refresh_from_db()
        return Response(JoinTokenSerializer(token, context=self.get_serializer_context()).data)


class ClusterViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.UpdateModelMixin, mixins.DestroyModelMixin, TeamScopedViewSet):
    """Clusters of your teams. Team admins create, change and delete them; members read."""

    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_class = filtersets.ClusterFilterSet
    ordering_fields = ["name", "created"]
    ordering = ["name"]
    select_related = ("team",)

    def get_queryset(self):
        return super().get_queryset().with_node_counts()

    def _require_admin(self, team):
        if not is_team_admin(self.request.user, team):
            raise PermissionDenied(f"Only an admin of team {team} can change its clusters.")

    def perform_create(self, serializer):
        self._require_admin(serializer.validated_data["team"])
        cluster = serializer.save()
        # The answer carries the node counts, as every other read of a cluster does.
        serializer.instance = Cluster.objects.filter(pk=cluster.pk).with_node_counts().get()

    def perform_update(self, serializer):
        self._require_admin(serializer.instance.team)  # the stored team: a cluster never changes team
        serializer.save()

    def perform_destroy(self, instance):
        self._require_admin(instance.team)
        services.delete_cluster(instance)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def topology(self, request, pk=None):
        """Nodes, devices (measured and published figures), links and each node's latest env-check verdict."""
        return Response(services.cluster_topology(self.get_object()))

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], url_path="prediction-ledger")
    def prediction_ledger(self, request, pk=None):
        """How far d0's predictions were from what the cluster's serve sweeps measured (per engine and metric: trials,
        median and P90 relative error, and the roofline's alone) and the calibration its next serve sweep is given."""
        return Response(ledger.error_distribution(self.get_object()))


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Nodes register themselves by running a node worker; they are read-only here."""

    queryset = Node.objects.all()
    serializer_class = NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ["hostname", "last_heartbeat", "status"]
    ordering = ["hostname"]
    select_related = ("cluster",)


class DeviceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = Device.objects.all()
    serializer_class = DeviceSerializer
    filterset_class = filtersets.DeviceFilterSet
    ordering_fields = ["index", "memory_bytes", "kind"]
    ordering = ["id"]
    select_related = ("node",)


class LinkViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = Link.objects.all()
    serializer_class = LinkSerializer
    filterset_class = filtersets.LinkFilterSet
    ordering_fields = ["kind", "measured_bandwidth_gbps"]
    ordering = ["id"]


class EnvReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Environment checks of nodes, newest first; the history is kept."""

    queryset = EnvReport.objects.all()
    filterset_class = filtersets.EnvReportFilterSet
    ordering_fields = ["created", "verdict"]
    ordering = ["-created"]
    select_related = ("node",)

    def get_serializer_class(self):
        return EnvReportListSerializer if self.action == "list" else EnvReportSerializer
