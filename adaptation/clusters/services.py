"""Clusters, nodes and their devices as the pages, the API and the control-plane tasks see them: a node worker's
registration and heartbeats, what an env check found (the node's history, and its devices' and links' current
figures), and the cluster's topology as plain data.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Prefetch, Sum
from django.utils import timezone

from workers import protocol
from workers.engine.envcheck.peaks import published_peak
from workers.engine.serving.recipe import checked_engine

from ..choices import ACTIVE_STATUSES, InterconnectKind, NodeStatus
from ..errors import Conflict
from ..models import Cluster, Device, EnvReport, Link, Node, StageRun
from . import broker_users

logger = logging.getLogger(__name__)


def rejected_messages(cluster: Cluster) -> list[dict]:
    """The node messages dropped for this cluster, by message kind and reason, most recent first."""
    return list(cluster.rejected_messages.values("task", "reason").annotate(
        count=Sum("count"), last_seen=Max("last_seen"), detail=Max("detail")).order_by("-last_seen"))


# --- registration and heartbeats ------------------------------------------------------------------------


def register_node(cluster: Cluster, hostname: str, host_facts: dict, devices: list[dict], *, node: Node | None = None,
                  public_key: str = "", key_id: str | None = None, signed_ts: float = 0.0,
                  sealing_key: str = "") -> Node:
    """Create or update a node from its registration (``trust.register`` has checked who sent it): online unless
    draining, its queue named by the control plane, host facts and devices as reported, its key bound. The stages
    its old worker left running are settled by the control task that took the registration
    (``adaptation.jobs.recovery.node_registered``)."""
    now = timezone.now()
    if node is None:
        node = Node(cluster=cluster, hostname=hostname)
    if node.status != NodeStatus.DRAINING:
        node.status = NodeStatus.ONLINE
    node.queue_name = protocol.node_queue(cluster.join_name, hostname)
    node.last_heartbeat = now
    node.host_facts = with_checked_engines(host_facts)
    if key_id:
        node.public_key, node.key_id = public_key, key_id
    node.sealing_key = sealing_key
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
    return node


def with_checked_engines(host_facts: dict) -> dict:
    """The node's serving engines as its registration reported them, each checked as it arrives (a version is a
    version, the name one d0 drives; ``recipe.checked_engine``): the pages and recipes show only checked values."""
    engines = host_facts.get("engines") if isinstance(host_facts, dict) else None
    if not isinstance(engines, list):
        return host_facts
    return {**host_facts, "engines": [checked_engine(engine) for engine in engines if isinstance(engine, dict)]}


def record_heartbeat(node: Node) -> None:
    """The node is alive now: an offline node comes back online (a draining one stays draining)."""
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    Node.objects.filter(pk=node.pk).come_back()


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


def node_broker_hint() -> dict:
    """The ``--broker`` a node of this install is told to use: this install's broker, without credentials when nodes
    get broker users of their own, else with them left for the operator to fill in (never shown); or, on the
    zero-setup embedded broker, that only this machine reaches it."""
    if settings.D0_EMBEDDED_BROKER:
        return {"url": settings.D0_BROKER_URL, "local_only": True}
    parts = urlsplit(settings.D0_BROKER_URL)
    # With per-node broker users a node is given no credentials: it joins with its token and makes its own password.
    credentials = "NODE-USER:PASSWORD@" if (parts.username or parts.password) and not broker_users.enabled() else ""
    host = f"{parts.hostname}:{parts.port}" if parts.port else (parts.hostname or "")
    return {"url": f"{parts.scheme}://{credentials}{host}{parts.path}", "local_only": False}


def delete_cluster(cluster) -> None:
    """Delete a cluster and its history, unless a job of it is still queued or running: its stages would go on on
    the nodes with no job row left to report to (the API answers 409 with the jobs to cancel first)."""
    active = list(cluster.jobs.filter(status__in=list(ACTIVE_STATUSES)).values_list("pk", flat=True)[:10])
    if active:
        raise Conflict(f"Cluster {cluster.name} has active jobs ({', '.join(f'#{pk}' for pk in active)}): cancel "
                       "them first, or wait for them to end.")
    cluster.delete()
