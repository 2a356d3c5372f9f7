"""Plans for serving a model: on one of the team's clusters (its registered devices and measured bandwidth) or on
a what-if cluster described by hand ("8 × H200 per node"). The engine's planner does the work."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from workers.engine.analysis import ConfigError, analyze

from .choices import NodeStatus
from .models import Cluster, ModelPlan, ModelSpec

GIB = 2**30
PRECISIONS = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "fp8"), ("int8", "int8"), ("int4", "int4")]


class PlanForm(forms.Form):
    """A what-if cluster and workload. Defaults: one node of 8 × H200 (141 GB), bf16, 32 sequences of 8k tokens."""

    devices_per_node = forms.IntegerField(min_value=1, max_value=256, initial=8)
    device_memory_gb = forms.FloatField(min_value=0.5, max_value=4096, initial=141, label="Device memory (GB)")
    nodes = forms.IntegerField(min_value=1, max_value=512, initial=1)
    device_name = forms.CharField(required=False, initial="H200", help_text="Picks the published bandwidth.")
    precision = forms.ChoiceField(choices=PRECISIONS, initial="bf16")
    concurrency = forms.IntegerField(min_value=1, max_value=65536, initial=32)
    context_tokens = forms.IntegerField(min_value=1, max_value=2**22, initial=8192)

    def devices(self) -> dict:
        data = self.cleaned_data
        return {"devices_per_node": data["devices_per_node"], "nodes": data["nodes"],
                "device_memory_bytes": int(data["device_memory_gb"] * 1e9), "device_name": data["device_name"] or None}

    def workload(self) -> dict:
        return {"concurrency": self.cleaned_data["concurrency"], "context_tokens": self.cleaned_data["context_tokens"]}


def cluster_devices(cluster: Cluster) -> dict | None:
    """The planner's view of a cluster: its online nodes' accelerators (or CPUs), with measured bandwidth."""
    nodes = [node for node in cluster.nodes.all() if node.status == NodeStatus.ONLINE]
    per_node = []
    for node in nodes:
        devices = list(node.devices.all())
        per_node.append([device for device in devices if device.kind != "cpu"] or devices)
    per_node = [devices for devices in per_node if devices]
    if not per_node:
        return None
    everything = [device for devices in per_node for device in devices]
    measured = [device.measured.get("copy_bandwidth_bytes_per_s") for device in everything]
    return {
        "devices_per_node": min(len(devices) for devices in per_node),
        "nodes": len(per_node),
        "device_memory_bytes": min(device.memory_bytes for device in everything),
        "device_name": everything[0].name,
        # The slowest device sets the pace of a synchronous layout; only figures every device has count.
        "memory_bandwidth_bytes_per_s": min(measured) if measured and all(measured) else None,
    }


def plan(spec: ModelSpec, devices: dict, precision: str, workload: dict | None = None) -> dict:
    try:
        return analyze(spec.config, devices=devices, precision=precision, workload=workload)["plans"]
    except ConfigError as error:
        raise ValidationError(str(error)) from None
    except ValueError as error:  # the planner's own bounds (device counts, memory, concurrency)
        raise ValidationError(str(error)) from None


def record(spec: ModelSpec, devices: dict, precision: str, workload: dict, user, cluster=None) -> ModelPlan:
    result = plan(spec, devices, precision, workload)
    return ModelPlan.objects.create(model=spec, cluster=cluster, created_by=user, result=result,
                                    request={"devices": devices, "precision": precision, "workload": workload})
