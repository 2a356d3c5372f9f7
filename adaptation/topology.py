"""A cluster's topology as plain data: nodes, devices with measured and published figures, links, and the
latest env-check verdict of each node. The topology page and the API both serve exactly this."""

from __future__ import annotations

from django.db.models import Prefetch

from workers.engine.envcheck.peaks import published_peak

from .models import Cluster, Device, EnvReport, Link


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
