from django.db import connection
from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import catalog, coverage, filtersets, planning, services, sweep_reports
from ..choices import NodeStatus
from ..models import (AdaptationJob, Cluster, CoverageReport, Device, EnvReport, Link, ModelPlan, ModelSpec, Node,
                      OperatorRecord, StageRun, VirtualBackend)
from ..topology import cluster_topology
from . import serializers
from .errors import ConflictError


class TeamScopedViewSet(viewsets.GenericViewSet):
    """Rows of the requesting user's teams only: another team's row is a 404, never a 403."""

    select_related: tuple = ()
    prefetch_related: tuple = ()

    def get_queryset(self):
        queryset = self.queryset.for_user(self.request.user)
        return queryset.select_related(*self.select_related).prefetch_related(*self.prefetch_related)


class ClusterViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.UpdateModelMixin, mixins.DestroyModelMixin, TeamScopedViewSet):
    """Clusters of your teams. Team admins create, change and delete them; members read."""

    queryset = Cluster.objects.all()
    serializer_class = serializers.ClusterSerializer
    filterset_class = filtersets.ClusterFilterSet
    ordering_fields = ["name", "created"]
    ordering = ["name"]
    select_related = ("team",)

    def get_queryset(self):
        return super().get_queryset().annotate(
            node_count=Count("nodes", distinct=True),
            nodes_online=Count("nodes", filter=Q(nodes__status=NodeStatus.ONLINE), distinct=True),
        )

    def _require_admin(self, team):
        if not services.is_team_admin(self.request.user, team):
            raise PermissionDenied(f"Only an admin of team {team} can change its clusters.")

    def perform_create(self, serializer):
        self._require_admin(serializer.validated_data["team"])
        serializer.save()

    def perform_update(self, serializer):
        self._require_admin(serializer.instance.team)
        if serializer.validated_data.get("team", serializer.instance.team) != serializer.instance.team:
            self._require_admin(serializer.validated_data["team"])
        serializer.save()

    def perform_destroy(self, instance):
        self._require_admin(instance.team)
        instance.delete()

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def topology(self, request, pk=None):
        """Nodes, devices (measured and published figures), links and each node's latest env-check verdict."""
        return Response(cluster_topology(self.get_object()))


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Nodes register themselves by running a node worker; they are read-only here."""

    queryset = Node.objects.all()
    serializer_class = serializers.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ["hostname", "last_heartbeat", "status"]
    ordering = ["hostname"]
    select_related = ("cluster",)


class DeviceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = Device.objects.all()
    serializer_class = serializers.DeviceSerializer
    filterset_class = filtersets.DeviceFilterSet
    ordering_fields = ["index", "memory_bytes", "kind"]
    ordering = ["id"]
    select_related = ("node",)


class LinkViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = Link.objects.all()
    serializer_class = serializers.LinkSerializer
    filterset_class = filtersets.LinkFilterSet
    ordering_fields = ["kind", "measured_bandwidth_gbps"]
    ordering = ["id"]


class ModelSpecViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       mixins.DestroyModelMixin, TeamScopedViewSet):
    """Released models by their config.json: POST the file as ``config_file`` (multipart) or ``config`` (JSON)."""

    queryset = ModelSpec.objects.all()
    filterset_class = filtersets.ModelSpecFilterSet
    ordering_fields = ["name", "created", "architecture"]
    ordering = ["-created"]
    select_related = ("team", "created_by")

    def get_serializer_class(self):
        return serializers.ModelSpecListSerializer if self.action == "list" else serializers.ModelSpecSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("config", "analysis") if self.action == "list" else queryset

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)

    @extend_schema(request=serializers.PlanRequestSerializer, responses={201: serializers.ModelPlanSerializer})
    @action(detail=True, methods=["post"])
    def plan(self, request, pk=None):
        """Plan the model on one of your clusters or a what-if one; the prediction is kept (``/api/model-plans/``)."""
        spec = self.get_object()
        plan_request = serializers.PlanRequestSerializer(data=request.data, context=self.get_serializer_context())
        plan_request.is_valid(raise_exception=True)
        data = plan_request.validated_data
        cluster = data.get("cluster")
        if cluster is not None:
            devices = planning.cluster_devices(cluster)
            if devices is None:
                raise ConflictError(f"Cluster {cluster.name} has no online node with devices to plan on.")
        else:
            devices = {"devices_per_node": data["devices_per_node"], "nodes": data["nodes"],
                       "device_memory_bytes": int(data["device_memory_gb"] * 1e9),
                       "device_name": data["device_name"] or None}
        workload = {"concurrency": data["concurrency"], "context_tokens": data["context_tokens"]}
        kept = planning.record(spec, devices, data["precision"], workload, request.user, cluster=cluster)
        return Response(serializers.ModelPlanSerializer(kept).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=serializers.AdaptRequestSerializer, responses={201: serializers.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def adapt(self, request, pk=None):
        """The whole adaptation in one call: env check, operator coverage, a sharded validation run with the
        planner's layout, and the tuning sweep with its benchmark report."""
        spec = self.get_object()
        adapt_request = serializers.AdaptRequestSerializer(data=request.data, context=self.get_serializer_context())
        adapt_request.is_valid(raise_exception=True)
        job = services.submit_adaptation(model=spec, cluster=adapt_request.validated_data["cluster"],
                                         user=request.user)
        return Response(serializers.JobDetailSerializer(job, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        if instance.created_by_id != self.request.user.pk and not services.is_team_admin(self.request.user,
                                                                                        instance.team):
            raise PermissionDenied("Only the model's uploader or a team admin can delete it.")
        instance.delete()


class JobViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Adaptation jobs. Submitting saves the job and enqueues it; ``cancel`` and ``retry`` are POST actions."""

    queryset = AdaptationJob.objects.all()
    filterset_class = filtersets.JobFilterSet
    ordering_fields = ["created", "status", "finished"]
    ordering = ["-created"]
    select_related = ("team", "cluster", "model", "submitted_by")

    def get_serializer_class(self):
        if self.action in ("retrieve", "cancel", "retry"):
            return serializers.JobDetailSerializer
        return serializers.JobSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            return queryset.defer("log", "error_traceback", "model__config", "model__analysis")
        return queryset.prefetch_related("stage_runs")

    @extend_schema(request=None, responses={200: serializers.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.cancel_job(self.get_object(), request.user)
        return Response(serializers.JobDetailSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={201: serializers.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        job = services.retry_job(self.get_object(), request.user)
        return Response(serializers.JobDetailSerializer(job, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)


class StageRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    queryset = StageRun.objects.all()
    filterset_class = filtersets.StageRunFilterSet
    ordering_fields = ["created", "status"]
    ordering = ["-id"]

    def get_serializer_class(self):
        return serializers.StageRunListSerializer if self.action == "list" else serializers.StageRunSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset.defer("result", "error_traceback") if self.action == "list" else queryset


class ModelPlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Kept planner predictions, to compare with what sharded runs and sweeps measure."""

    queryset = ModelPlan.objects.all()
    serializer_class = serializers.ModelPlanSerializer
    filterset_fields = ["model", "cluster"]
    ordering_fields = ["created"]
    ordering = ["-created"]
    select_related = ("created_by",)


class CoverageReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Operator coverage per model × backend × dtype; the list gives the gaps, the detail the whole report."""

    queryset = CoverageReport.objects.all()
    filterset_fields = ["model", "backend", "dtype", "job"]
    ordering_fields = ["created", "coverage"]
    ordering = ["-created"]

    def get_serializer_class(self):
        return (serializers.CoverageReportListSerializer if self.action == "list"
                else serializers.CoverageReportSerializer)


class OperatorRecordViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The operator library: every operator verified per backend, with first-seen and last-verified times."""

    queryset = OperatorRecord.objects.all()
    serializer_class = serializers.OperatorRecordSerializer
    filterset_fields = ["backend", "status", "operator"]
    ordering_fields = ["operator", "last_verified"]
    ordering = ["backend", "operator"]


class VirtualBackendViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                            mixins.DestroyModelMixin, TeamScopedViewSet):
    """Backends described by operator lists; name them in an op_coverage job's ``virtual_backends``."""

    queryset = VirtualBackend.objects.all()
    serializer_class = serializers.VirtualBackendSerializer
    ordering = ["name"]

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)


class CoverageDiffView(APIView):
    """``?a=<model>&b=<model>[&backend=...]``: the operators model a needs that model b did not."""

    @extend_schema(responses={200: dict})
    def get(self, request):
        models = ModelSpec.objects.for_user(request.user)
        try:
            model, other = (models.get(pk=int(request.query_params.get(key, ""))) for key in ("a", "b"))
        except (ValueError, ModelSpec.DoesNotExist):
            raise ValidationError({"a": ["Give two of your models as ?a=<id>&b=<id>."]}) from None
        backend = request.query_params.get("backend") or None
        return Response({"model": model.pk, "other": other.pk, "backend": backend,
                         "operators": coverage.diff(model, other, backend)})


class EnvReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Environment checks of nodes, newest first; the history is kept."""

    queryset = EnvReport.objects.all()
    filterset_class = filtersets.EnvReportFilterSet
    ordering_fields = ["created", "verdict"]
    ordering = ["-created"]
    select_related = ("node",)

    def get_serializer_class(self):
        return serializers.EnvReportListSerializer if self.action == "list" else serializers.EnvReportSerializer


class CatalogView(APIView):
    """Known models shipped with d0 (real config.json files) with their vendors' published parameter counts.
    Add one to a team with ``POST /api/models/ {"catalog": "<slug>"}``."""

    @extend_schema(responses={200: serializers.CatalogEntrySerializer(many=True)})
    def get(self, request):
        return Response(serializers.CatalogEntrySerializer(catalog.CATALOG, many=True).data)


class SweepReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Benchmark reports: the sweep stages' results. ``html`` (self-contained, opens offline) and ``csv`` download
    them; the detail is the JSON."""

    queryset = StageRun.objects.filter(kind="sweep", status="succeeded")
    ordering = ["-id"]
    filterset_fields = ["job"]

    def get_serializer_class(self):
        return serializers.StageRunListSerializer if self.action == "list" else serializers.StageRunSerializer

    @extend_schema(responses={(200, "text/html"): str})
    @action(detail=True, methods=["get"])
    def html(self, request, pk=None):
        run = self.get_object()
        return sweep_reports.download(sweep_reports.self_contained_html(run), "text/html", f"d0-sweep-{run.pk}.html")

    @extend_schema(responses={(200, "text/csv"): str})
    @action(detail=True, methods=["get"])
    def csv(self, request, pk=None):
        run = self.get_object()
        return sweep_reports.download(sweep_reports.trials_csv(run.result), "text/csv", f"d0-sweep-{run.pk}.csv")


class StatusView(APIView):
    """Health: database, broker, and how many workers answer a ping. Open to all (load balancers)."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: dict, 503: dict})
    def get(self, request):
        report = {"database": "ok", "broker": "ok", "workers": {"control": 0, "node": 0}}
        healthy = True
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as error:  # noqa: BLE001 - the point is to report it
            report["database"] = f"error: {error}"
            healthy = False
        app = services.celery_app()
        try:
            with app.connection_for_read() as broker:
                broker.ensure_connection(max_retries=1, timeout=2)
            replies = app.control.ping(timeout=1.0) or []
            for reply in replies:
                for worker_name in reply:
                    kind = "node" if worker_name.startswith("d0.node.") else "control"
                    report["workers"][kind] += 1
        except Exception as error:  # noqa: BLE001
            report["broker"] = f"error: {error}"
            healthy = False
        return Response(report, status=status.HTTP_200_OK if healthy else status.HTTP_503_SERVICE_UNAVAILABLE)
