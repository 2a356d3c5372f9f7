"""Clusters, nodes and their devices as the pages, the API and the control-plane tasks see them: a node worker's
registration and heartbeats, what an env check found (the node's history, and its devices' and links' current
figures), the cluster's topology as plain data, and the pre-flight gate that keeps gated stages off unfit nodes.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Prefetch, Q
from django.utils import timezone

from workers.engine.envcheck.peaks import published_peak
from workers.engine.stages import STAGES

from ..choices import CheckVerdict, InterconnectKind, NodeStatus
from ..models import Cluster, Device, EnvReport, Link, Node, StageRun

logger = logging.getLogger(__name__)


def with_node_counts(clusters):
    """Clusters annotated with how many nodes each has (``node_count``) and how many are online."""
    return clusters.annotate(
        node_count=Count("nodes", distinct=True),
        nodes_online=Count("nodes", filter=Q(nodes__status=NodeStatus.ONLINE), distinct=True),
    )


def clusters_with_counts(user):
    return with_node_counts(Cluster.objects.for_user(user).select_related("team"))


# --- registration and heartbeats ------------------------------------------------------------------------


def resolve_cluster(reference: str) -> Cluster:
    """A cluster from a node's join name: ``team/cluster``, or a bare cluster name that is unique."""
    team_slug, _, name = reference.rpartition("/")
    clusters = Cluster.objects.filter(name=name).select_related("team")
    if team_slug:
        clusters = clusters.filter(team__slug=team_slug)
    found = list(clusters[:2])
    if len(found) != 1:
        problem = "matches several clusters; use <team>/<cluster>" if found else "matches no cluster"
        raise ValidationError(f"Cluster reference {reference!r} {problem}.")
    return found[0]


@transaction.atomic
def register_node(cluster_ref: str, hostname: str, queue_name: str, host_facts: dict, devices: list[dict]) -> Node:
    cluster = resolve_cluster(cluster_ref)
    now = timezone.now()
    node = Node.objects.select_for_update().filter(cluster=cluster, hostname=hostname).first()
    if node is None:
        node = Node(cluster=cluster, hostname=hostname)
    if node.status != NodeStatus.DRAINING:
        node.status = NodeStatus.ONLINE
    node.queue_name = queue_name
    node.last_heartbeat = now
    node.host_facts = host_facts
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


def record_heartbeat(queue_name: str) -> bool:
    now = timezone.now()
    if not Node.objects.filter(queue_name=queue_name).update(last_heartbeat=now):
        return False
    Node.objects.filter(queue_name=queue_name, status=NodeStatus.OFFLINE).update(status=NodeStatus.ONLINE)
    return True


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
