"""The control plane's side of the node stages about the node itself: the instant probe and the env check."""

from __future__ import annotations

from django.urls import reverse

from ..stages import Outcome, StageHandler, register
from .services import store_env_check


@register
class EnvProbe(StageHandler):
    kind = "env_probe"

    def outcome(self, result: dict) -> Outcome:
        devices = result.get("devices") or []
        names = sorted({str(device.get("name") or device.get("kind")) for device in devices})
        return Outcome(f"{len(devices)} device(s): " + ", ".join(names))


@register
class EnvCheck(StageHandler):
    kind = "env_check"

    def prepare(self, job, params: dict, nodes: list) -> dict:
        # The check warns when a node has fewer devices than its cluster expects (a device lost since the last one).
        return {"expected_devices_per_node": job.cluster.expected_devices_per_node, **params}

    def store(self, run) -> None:
        store_env_check(run)

    def outcome(self, result: dict) -> Outcome:
        devices = result.get("devices") or []
        kinds = sorted({device.get("kind", "?") for device in devices})
        warnings = [check["message"] for check in result.get("checks", []) if check.get("status") in ("warn", "fail")]
        return Outcome(f"{str(result.get('verdict', '?')).upper()}: {len(devices)} device(s) "
                       f"({', '.join(kinds) or 'none'}), {len(result.get('checks', []))} checks", warnings[:3])

    def page(self, job, run) -> str | None:
        return reverse("cluster-topology", args=[job.cluster_id]) if run.status == "succeeded" else None
