"""What the control plane does with a stage's result besides storing it on the stage run.

``env_check``: an EnvReport row (the node's history), and the node's Device and Link rows updated with what
was measured, so the cluster pages and the planner read current figures.
"""

from __future__ import annotations

from django.db import transaction

from .choices import InterconnectKind
from .coverage import store_op_coverage
from .models import EnvReport, Link, StageRun


def _device_key(label: str) -> tuple[str, int]:
    kind, _, index = label.partition(":")
    return kind, int(index)


def store_env_check(run: StageRun) -> None:
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


HANDLERS = {"env_check": store_env_check, "op_coverage": store_op_coverage}


def store(run: StageRun) -> None:
    handler = HANDLERS.get(run.kind)
    if handler:
        handler(run)
