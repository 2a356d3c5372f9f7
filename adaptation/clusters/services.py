"""Clusters, nodes and their devices as the pages, the API and the control-plane tasks see them: a node worker's
registration and heartbeats, what an env check found (the node's history, and its devices' and links' current
figures), the cluster's topology as plain data, and the pre-flight gate that keeps gated stages off unfit nodes.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Prefetch, Q, Sum
from django.utils import timezone

from workers import protocol
from workers.engine.envcheck.peaks import published_peak
from workers.engine.stages import STAGES

from ..choices import CheckVerdict, InterconnectKind, NodeStatus
from ..models import Cluster, ControlWorker, Device, EnvReport, Link, Node, StageRun

logger = logging.getLogger(__name__)


def with_node_counts(clusters):
    """Clusters annotated with how many nodes each has (``node_count``) and how many are online."""
    return clusters.annotate(
        node_count=Count("nodes", distinct=True),
        nodes_online=Count("nodes", filter=Q(nodes__status=NodeStatus.ONLINE), distinct=True),
    )


def clusters_with_counts(user):
    return with_node_counts(Cluster.objects.for_user(user).select_related("team"))


def rejected_messages(cluster: Cluster) -> list[dict]:
    """The node messages dropped for this cluster, by message kind and reason, most recent first."""
    return list(cluster.rejected_messages.values("task", "reason").annotate(
        count=Sum("count"), last_seen=Max("last_seen"), detail=Max("detail")).order_by("-last_seen"))


# --- liveness -------------------------------------------------------------------------------------------


def _heard_since(workers, now):
    """Since when the control plane has run the sweep without a gap, as the latest sweep among ``workers``
    recorded it; None when that sweep is older than the beat's schedule and a busy worker explain (or there is
    none): the control plane was down or could not reach the broker, and heartbeats sent meanwhile went unheard."""
    latest = workers.order_by("-last_seen").only("last_seen", "listening_since").first()
    if latest is None or now - latest.last_seen > timedelta(seconds=2 * settings.D0_SWEEP_INTERVAL + 5):
        return None
    return latest.listening_since


@transaction.atomic
def control_worker_seen(name: str) -> None:
    """``name`` runs the sweep now; the control plane has listened since the latest sweep's record, or starts now
    after a gap. Measured across control workers, not per worker: the beat sends each sweep to one of them, so a
    worker may go several intervals without one while another hears every heartbeat."""
    now = timezone.now()
    # The latest row locked, so two sweeps taken at once after a gap agree on when listening started.
    since = _heard_since(ControlWorker.objects.select_for_update(), now) or now
    ControlWorker.objects.update_or_create(name=name[:255], defaults={"last_seen": now, "listening_since": since})


def listening_since():
    """Since when the control plane has been hearing node heartbeats without a gap; None when nobody listens."""
    return _heard_since(ControlWorker.objects, timezone.now())


def live_workers(user) -> dict:
    """Control-plane workers that ran the liveness sweep lately, and the user's teams' online nodes: health from
    the state heartbeats keep, not from a broadcast to every worker on the broker."""
    recent = timezone.now() - timedelta(seconds=3 * settings.D0_SWEEP_INTERVAL + 5)
    return {"control": ControlWorker.objects.filter(last_seen__gte=recent).count(),
            "node": Node.objects.for_user(user).filter(status=NodeStatus.ONLINE).count()}


# --- registration and heartbeats ------------------------------------------------------------------------


def register_node(cluster: Cluster, hostname: str, host_facts: dict, devices: list[dict], *, node: Node | None = None,
                  public_key: str = "", key_id: str | None = None, signed_ts: float = 0.0,
                  finished_runs: list[int] = ()) -> Node:
    """Create or update a node from its registration (``trust.register`` has checked who sent it): online unless
    draining, its queue named by the control plane, host facts and devices as reported, its key bound, and the
    stages its old worker left running settled (but ``finished_runs``, whose reports are on their way)."""
    now = timezone.now()
    if node is None:
        node = Node(cluster=cluster, hostname=hostname)
    if node.status != NodeStatus.DRAINING:
        node.status = NodeStatus.ONLINE
    node.queue_name = protocol.node_queue(cluster.join_name, hostname)
    node.last_heartbeat = now
    node.host_facts = host_facts
    if key_id:
        node.public_key, node.key_id = public_key, key_id
    node.last_signed_ts = max(node.last_signed_ts, signed_ts)
    with transaction.atomic():
        node.save()
        seen = []
        for reported in devices:
            device, _ = Device.objects.update_or_create(
                node=node,
                kind=reported["kind"],
                index=reported["index"],
                defaults={
                    "name": reported.get("name", "")[:255],
                    "memory_bytes": int(reported.get("memory_bytes") or 0),
                    "properties": reported.get("properties") or {},
                },
            )
            seen.append(device.pk)
        node.devices.exclude(pk__in=seen).delete()
    logger.info("node %s registered in %s with %d devices", hostname, cluster.join_name, len(seen))
    if node.pk and signed_ts:
        settle_runs_of_restarted_node(node, signed_ts, finished_runs)
    return node


def settle_runs_of_restarted_node(node: Node, registered_ts: float, finished_runs: list[int] = ()) -> int:
    """A node registers when its worker starts: a stage it was running before (started before this registration
    was sent) ended with the old worker process and will send no result, so it fails now with that reason instead
    of staying "running" until the stage timeout. Stages queued for it stay: their messages wait in its queue.
    So do ``finished_runs``: their finished reports, kept in the node's outbox, were sent just before this
    registration, and another control process may be storing one right now."""
    from datetime import UTC, datetime

    from ..choices import JobStatus
    from ..jobs import services as jobs
    from ..models import StageRun

    before = datetime.fromtimestamp(registered_ts, tz=UTC)
    failed = 0
    running = StageRun.objects.filter(node=node, status=JobStatus.RUNNING, started__lt=before)
    for run in running.exclude(pk__in=list(finished_runs)):
        failed += jobs.fail_stage_run(run, f"Node {node.hostname} restarted while stage {run.kind} was running: the "
                                           "worker process that ran it ended, so no result will come.")
    return failed


def record_heartbeat(node: Node) -> None:
    """The node is alive now: an offline node comes back online (a draining one stays draining)."""
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    Node.objects.filter(pk=node.pk, status=NodeStatus.OFFLINE).update(status=NodeStatus.ONLINE)


# --- env-check reports ----------------------------------------------------------------------------------


def _device_key(label: str) -> tuple[str, int]:
    kind, _, index = label.partition(":")
    return kind, int(index)


def store_env_check(run: StageRun) -> None:
    """An ``env_check`` stage's result: an EnvReport row (the node's history), and the node's Device and Link rows
    updated with what was measured, so the cluster pages and the planner read current figures."""
    report = run.result or {}
    node = run.node
    if node is None:
        return
    EnvReport.objects.create(node=node, job=run.job, stage_run=run, verdict=report.get("verdict", "fail"),
                             report=report)
    devices = {(device.kind, device.index): device for device in node.devices.all()}
    free_memory = {(entry["kind"], entry["index"]): entry.get("free_memory_bytes")
                   for entry in report.get("devices", [])}
    for entry in report.get("measurements", {}).get("per_device", []):
        device = devices.get(_device_key(entry["device"]))
        if device is None:
            continue
        device.measured = {
            "copy_bandwidth_bytes_per_s": entry.get("copy_bandwidth", {}).get("bytes_per_s"),
            "host_to_device_bytes_per_s": entry.get("host_to_device_bandwidth", {}).get("bytes_per_s"),
            "matmul_flops_per_s": {dtype: figures.get("flops_per_s")
                                   for dtype, figures in entry.get("matmul", {}).items() if figures.get("supported")},
            # Max/min of each figure's repetitions (the figures are medians): how far to trust them.
            "max_over_min": {name: (figures.get("spread") or {}).get("max_over_min") for name, figures in (
                ("copy_bandwidth", entry.get("copy_bandwidth") or {}),
                *((dtype, figures) for dtype, figures in entry.get("matmul", {}).items()
                  if figures.get("supported")))},
            "free_memory_bytes": free_memory.get((device.kind, device.index)),
            "measured_at": run.finished.isoformat() if run.finished else None,
        }
        device.save(update_fields=["measured"])
    _replace_links(node, devices, report.get("links", []))


@transaction.atomic
def _replace_links(node, devices, reported_links) -> None:
    Link.objects.filter(source_device__node=node).delete()
    known = set(InterconnectKind.values)
    for link in reported_links:
        source, target = devices.get(_device_key(link["a"])), devices.get(_device_key(link["b"]))
        if source is None or target is None:
            continue
        measured = link.get("measured_bytes_per_s")
        Link.objects.create(
            cluster=node.cluster, source_device=source, target_device=target,
            kind=link["kind"] if link["kind"] in known else InterconnectKind.UNKNOWN, code=link.get("code") or "",
            p2p_ok=link.get("p2p_ok"), measured_bandwidth_gbps=measured / 1e9 if measured else None,
        )


# --- topology -------------------------------------------------------------------------------------------


def _device(device: Device) -> dict:
    return {
        "id": device.pk,
        "label": f"{device.node.hostname}/{device.kind}:{device.index}",
        "kind": device.kind,
        "index": device.index,
        "name": device.name,
        "memory_bytes": device.memory_bytes,
        "measured": device.measured,
        "published_peak": published_peak(device.name),
    }


def cluster_topology(cluster: Cluster) -> dict:
    """Nodes, devices with measured and published figures, links, and the latest env-check verdict of each node:
    the topology page and the API both serve exactly this."""
    nodes = list(cluster.nodes.prefetch_related(
        Prefetch("devices", queryset=Device.objects.select_related("node").order_by("kind", "index"))))
    latest = EnvReport.objects.latest_per_node(nodes)
    links = Link.objects.filter(cluster=cluster).select_related(
        "source_device__node", "target_device__node", "source_node", "target_node")
    return {
        "cluster": {"id": cluster.pk, "name": cluster.name, "join_name": cluster.join_name,
                    "expected_devices_per_node": cluster.expected_devices_per_node},
        "nodes": [
            {
                "id": node.pk,
                "hostname": node.hostname,
                "status": node.status,
                "devices": [_device(device) for device in node.devices.all()],
                "latest_env_check": ({"id": latest[node.pk].pk, "verdict": latest[node.pk].verdict,
                                      "created": latest[node.pk].created.isoformat()}
                                     if node.pk in latest else None),
            }
            for node in nodes
        ],
        "links": [
            {
                "id": link.pk,
                "kind": link.kind,
                "code": link.code,
                "source": (link.source_device.pk if link.source_device_id else None),
                "target": (link.target_device.pk if link.target_device_id else None),
                "source_node": link.source_node_id,
                "target_node": link.target_node_id,
                "p2p_ok": link.p2p_ok,
                "measured_gbps": link.measured_bandwidth_gbps,
            }
            for link in links
        ],
    }


# --- the pre-flight gate --------------------------------------------------------------------------------


def preflight_refusals(kind: str, nodes: list[Node], now=None) -> dict[int, str]:
    """Node id → why the gate refuses it for a stage of ``kind`` (empty when the stage is not gated).

    Gated stages run only on nodes whose latest env check passed (or only warned) and is recent enough. A refused
    node is named in the job's log with the reason, so the fix is obvious."""
    if not STAGES[kind].gated:
        return {}
    now = now or timezone.now()
    max_age = timedelta(hours=settings.D0_PREFLIGHT_MAX_AGE_HOURS)
    latest = EnvReport.objects.latest_per_node(nodes)
    reasons = {}
    for node in nodes:
        report = latest.get(node.pk)
        if report is None:
            reasons[node.pk] = f"node {node.hostname} has no env check yet: run an env_check job first"
        elif report.verdict == CheckVerdict.FAIL:
            failed = "; ".join(check["message"] for check in report.failed_checks) or "see its report"
            reasons[node.pk] = f"node {node.hostname} failed its latest env check ({report.created:%Y-%m-%d %H:%M}" \
                               f" UTC): {failed}"
        elif now - report.created > max_age:
            reasons[node.pk] = (f"node {node.hostname}'s latest env check is from {report.created:%Y-%m-%d %H:%M} "
                                f"UTC, older than {settings.D0_PREFLIGHT_MAX_AGE_HOURS:g} h: run env_check again")
    return reasons


def node_broker_hint() -> dict:
    """The ``--broker`` a node of this install is told to use: this install's broker with its credentials left for
    the operator to fill in (never shown), or, on the zero-setup embedded broker, that only this machine reaches it."""
    from urllib.parse import urlsplit

    from django.conf import settings

    if settings.D0_EMBEDDED_BROKER:
        return {"url": settings.D0_BROKER_URL, "local_only": True}
    parts = urlsplit(settings.D0_BROKER_URL)
    credentials = "NODE-USER:PASSWORD@" if parts.username or parts.password else ""
    host = f"{parts.hostname}:{parts.port}" if parts.port else (parts.hostname or "")
    return {"url": f"{parts.scheme}://{credentials}{host}{parts.path}", "local_only": False}


def delete_cluster(cluster) -> None:
    """Delete a cluster and its history, unless a job of it is still queued or running: its stages would go on on
    the nodes with no job row left to report to (the API answers 409 with the jobs to cancel first)."""
    from ..choices import ACTIVE_STATUSES
    from ..jobs.services import Conflict

    active = list(cluster.jobs.filter(status__in=list(ACTIVE_STATUSES)).values_list("pk", flat=True)[:10])
    if active:
        raise Conflict(f"Cluster {cluster.name} has active jobs ({', '.join(f'#{pk}' for pk in active)}): cancel "
                       "them first, or wait for them to end.")
    cluster.delete()
