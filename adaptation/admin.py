from django.contrib import admin

from .models import (AdaptationJob, Cluster, ControlWorker, Device, EnvReport, JoinToken, Link, Membership, ModelPlan,
                     ModelSpec, Node, RejectedNodeMessage, RetiredNodeKey, ServingEndpoint, StageRun, Team)


class OwnerFixedOnChange(admin.ModelAdmin):
    """The fields that say whose a row is (its team, or the row that gives it one) are set when it is made and read
    only after: moving a row between teams is not an operation here either, as in the API and the forms."""

    fixed_on_change: tuple[str, ...] = ("team",)

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is None:
            return fields
        return fields + [name for name in self.fixed_on_change if name not in fields]


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__name"]
    list_select_related = ["user", "team"]
    autocomplete_fields = ["user", "team"]


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0
    fields = ["hostname", "status", "last_heartbeat", "queue_name"]
    readonly_fields = ["hostname", "last_heartbeat", "queue_name"]
    show_change_link = True


@admin.register(Cluster)
class ClusterAdmin(OwnerFixedOnChange):
    list_display = ["name", "team", "interconnect", "expected_devices_per_node", "created"]
    list_filter = ["team", "interconnect"]
    search_fields = ["name", "description"]
    list_select_related = ["team"]
    inlines = [NodeInline]

    # A cluster with queued or running jobs is not deleted (its stages would run on with no job to report to).
    def has_delete_permission(self, request, obj=None):
        from .choices import ACTIVE_STATUSES

        if obj is not None and obj.jobs.filter(status__in=list(ACTIVE_STATUSES)).exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        from .choices import ACTIVE_STATUSES

        busy = queryset.filter(jobs__status__in=list(ACTIVE_STATUSES)).distinct()
        if busy.exists():
            self.message_user(request, "Not deleted, they have active jobs: " + ", ".join(c.name for c in busy),
                              level="warning")
        super().delete_queryset(request, queryset.exclude(pk__in=busy.values("pk")))


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0


@admin.action(description="Drain: take no new work")
def drain_nodes(modeladmin, request, queryset):
    queryset.update(status="draining")


@admin.register(Node)
class NodeAdmin(OwnerFixedOnChange):
    fixed_on_change = ("cluster",)
    list_display = ["hostname", "cluster", "status", "last_heartbeat", "queue_name"]
    list_filter = ["status", "cluster__team", "cluster"]
    search_fields = ["hostname", "queue_name"]
    list_select_related = ["cluster"]
    # Deleting a node is how a machine that lost its key re-joins (with a new key and a new join token): the deleted
    # node's key is remembered (RetiredNodeKey) and joins nothing again.
    readonly_fields = ["registered", "last_heartbeat", "key_id", "public_key", "sealing_key", "last_signed_ts"]
    actions = [drain_nodes]
    inlines = [DeviceInline]


@admin.register(Device)
class DeviceAdmin(OwnerFixedOnChange):
    fixed_on_change = ("node",)
    list_display = ["__str__", "kind", "memory_bytes"]
    list_filter = ["kind"]
    search_fields = ["name", "node__hostname"]
    list_select_related = ["node"]


@admin.register(Link)
class LinkAdmin(OwnerFixedOnChange):
    fixed_on_change = ("cluster",)
    list_display = ["id", "cluster", "kind", "measured_bandwidth_gbps", "p2p_ok", "updated"]
    list_filter = ["kind", "p2p_ok"]
    list_select_related = ["cluster"]
    raw_id_fields = ["source_device", "target_device", "source_node", "target_node"]


@admin.register(ModelSpec)
class ModelSpecAdmin(OwnerFixedOnChange):
    list_display = ["name", "team", "architecture", "created_by", "created"]
    list_filter = ["team", "architecture"]
    search_fields = ["name", "architecture"]
    list_select_related = ["team", "created_by"]
    readonly_fields = ["architecture"]


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    fields = ["kind", "node_name", "status", "progress", "started", "finished", "error"]
    readonly_fields = fields
    can_delete = False


@admin.register(AdaptationJob)
class AdaptationJobAdmin(OwnerFixedOnChange):
    fixed_on_change = ("team", "cluster", "model")
    list_display = ["id", "team", "cluster", "model", "status", "progress", "created", "finished"]
    list_filter = ["status", "team"]
    list_select_related = ["team", "cluster", "model"]
    # Status fields change only through the job's transition methods and the control plane.
    readonly_fields = ["status", "progress", "started", "finished", "error", "error_traceback", "log",
                       "celery_task_id", "retry_of"]
    inlines = [StageRunInline]


@admin.register(StageRun)
class StageRunAdmin(OwnerFixedOnChange):
    fixed_on_change = ("job", "node")
    list_display = ["id", "job", "kind", "node_name", "status", "progress", "started", "finished"]
    list_filter = ["status", "kind"]
    readonly_fields = ["status", "progress", "started", "finished", "error", "error_traceback", "result",
                       "celery_task_id"]


@admin.register(EnvReport)
class EnvReportAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "verdict", "created", "job"]
    list_filter = ["verdict", "node__cluster"]
    list_select_related = ["node__cluster", "job"]
    readonly_fields = ["node", "job", "stage_run", "created", "verdict", "report"]


@admin.register(ModelPlan)
class ModelPlanAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "cluster", "created_by", "created"]
    list_select_related = ["model", "cluster", "created_by"]
    readonly_fields = ["model", "cluster", "request", "result", "created_by", "created"]


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ["token_id", "cluster", "description", "expires", "revoked", "uses", "created_by"]
    list_filter = ["cluster__team", "cluster"]
    list_select_related = ["cluster", "created_by"]
    # Tokens are made on the cluster page or through the API, where the whole token is shown once. Nothing of the
    # secret is shown, not even its verifying key: the fields are named here, so no list, form or read-only field
    # has it.
    fields = ["cluster", "token_id", "description", "created_by", "created", "expires", "revoked", "uses",
              "last_used"]
    readonly_fields = ["cluster", "token_id", "created_by", "created", "uses", "last_used"]

    def has_add_permission(self, request):
        return False


class RecordedByTheControlPlane(admin.ModelAdmin):
    """Rows the control plane writes as it runs; the admin reads and deletes them."""

    def has_add_permission(self, request):
        return False


@admin.register(RetiredNodeKey)
class RetiredNodeKeyAdmin(RecordedByTheControlPlane):
    """Keys of deleted nodes, refused at registration; deleting one lets that key join again (with a token)."""

    list_display = ["key_id", "hostname", "retired"]
    search_fields = ["key_id", "hostname"]
    readonly_fields = ["key_id", "hostname", "retired"]


@admin.register(RejectedNodeMessage)
class RejectedNodeMessageAdmin(RecordedByTheControlPlane):
    list_display = ["task", "reason", "cluster", "count", "last_seen", "detail"]
    list_filter = ["reason", "task", "cluster"]
    list_select_related = ["cluster"]
    readonly_fields = ["cluster", "task", "reason", "count", "first_seen", "last_seen", "detail"]


@admin.register(ControlWorker)
class ControlWorkerAdmin(RecordedByTheControlPlane):
    list_display = ["name", "last_seen", "listening_since"]
    readonly_fields = ["name", "last_seen", "listening_since"]


@admin.register(ServingEndpoint)
class ServingEndpointAdmin(OwnerFixedOnChange):
    """The API key is neither shown nor editable here: it is entered on the endpoints page or through the API. A
    changed base_url drops the stored key (the model's save)."""

    list_display = ["name", "team", "base_url", "served_model", "has_api_key", "created"]
    list_filter = ["team"]
    search_fields = ["name", "base_url", "served_model"]
    fields = ["team", "name", "base_url", "served_model", "created_by"]

    @admin.display(boolean=True)
    def has_api_key(self, endpoint):
        return endpoint.has_api_key
