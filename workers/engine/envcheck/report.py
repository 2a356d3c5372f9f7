"""The ``env_check`` stage: host, software stack, devices, interconnect, measurements and checks of one node.

Every figure is measured on the node itself as the median of several timed repetitions on a working set chosen
from the device (``measure``), with its spread, each measurement about ``measure_seconds`` of timed work, so a
full check of an 8-GPU node takes seconds. The report is plain JSON-ready data; the control plane stores it.
"""

from __future__ import annotations

import os
import time

import psutil

from . import checks
from .collectives import measure_collectives
from .measure import copy_bandwidth, host_to_device_bandwidth, matmul_throughput
from .probe import probe_devices, probe_host
from .software import software_stack
from .stage import DEFAULT_SECONDS_VARIABLE, MEASURE_SECONDS

MATMUL_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")


def device_label(device: dict) -> str:
    return f"{device['kind']}:{device['index']}"


def _torch_device(device: dict):
    import torch

    kind = {"rocm": "cuda", "cpu": "cpu"}.get(device["kind"], device["kind"])  # ROCm devices are torch "cuda"
    return torch.device(kind) if kind == "cpu" else torch.device(kind, device["index"])


def _with_free_memory(device: dict) -> dict:
    import torch

    if device["kind"] in ("cuda", "rocm"):
        free, _ = torch.cuda.mem_get_info(device["index"])
    elif device["kind"] == "cpu":
        free = psutil.virtual_memory().available
    else:
        free = None
    return {**device, "free_memory_bytes": free}


def peer_access_matrix(devices: list[dict]) -> list[list[bool | None]] | None:
    import torch

    gpus = [device for device in devices if device["kind"] in ("cuda", "rocm")]
    if len(gpus) < 2:
        return None
    return [[None if a == b else bool(torch.cuda.can_device_access_peer(a["index"], b["index"])) for b in gpus]
            for a in gpus]


def measured_devices(devices: list[dict]) -> list[dict]:
    """The devices to measure: the accelerators, or the CPU on a CPU-only node."""
    accelerators = [device for device in devices if device["kind"] != "cpu"]
    return accelerators or devices[:1]


def measure_device(device: dict, budget_seconds: float) -> dict:
    torch_device = _torch_device(device)
    figures = {"copy_bandwidth": copy_bandwidth(torch_device, budget_seconds=budget_seconds)}
    if device["kind"] != "cpu":
        figures["host_to_device_bandwidth"] = host_to_device_bandwidth(torch_device, budget_seconds=budget_seconds)
    figures["matmul"] = {dtype: matmul_throughput(torch_device, dtype, budget_seconds=budget_seconds)
                         for dtype in MATMUL_DTYPES}
    return figures


def _topology_links(topology: dict | None, devices: list[dict]) -> list[dict]:
    """Device-to-device links from the vendor tool's matrix, named like the rest of the report (cuda:0)."""
    if not topology or "links" not in topology:
        return []
    gpu_kind = next((device["kind"] for device in devices if device["kind"] in ("cuda", "rocm")), "cuda")
    links = []
    for link in topology["links"]:
        ends = [end for end in (link["a"], link["b"]) if end.upper().startswith("GPU")]
        if len(ends) != 2:
            continue  # GPU↔NIC paths matter for RDMA placement; they stay in the raw topology section
        a, b = (f"{gpu_kind}:{end[3:]}" for end in ends)
        links.append({"a": a, "b": b, "kind": link["kind"], "code": link.get("code"), "p2p_ok": None})
    return links


def build_links(devices: list[dict], peers, topology: dict | None, collectives: dict | None) -> list[dict]:
    links = _topology_links(topology, devices)
    gpus = [device for device in devices if device["kind"] in ("cuda", "rocm")]
    if peers:
        by_pair = {(link["a"], link["b"]): link for link in links}
        for i, a in enumerate(gpus):
            for j, b in enumerate(gpus):
                if i < j:
                    pair = (device_label(a), device_label(b))
                    link = by_pair.get(pair)
                    if link is None:
                        link = by_pair[pair] = {"a": pair[0], "b": pair[1], "kind": "pcie", "code": None}
                        links.append(link)
                    link["p2p_ok"] = bool(peers[i][j] and peers[j][i])
    all_reduce = ((collectives or {}).get("results") or {}).get("all_reduce", {})
    if not gpus and all_reduce.get("busbw"):
        # A CPU-only node: its "interconnect" is shared memory between processes, measured by gloo all_reduce.
        cpu = device_label(devices[0])
        links.append({"a": cpu, "b": cpu, "kind": "loopback", "code": "gloo", "p2p_ok": None,
                      "measured_bytes_per_s": all_reduce["busbw"]})
    return links


def check_environment(params: dict, progress) -> dict:
    """The env check of this node with ``params`` as the ``env_check`` stage validated them (``stage.py``)."""
    started = time.monotonic()
    budget = float(params.get("measure_seconds", os.environ.get(DEFAULT_SECONDS_VARIABLE) or MEASURE_SECONDS))
    progress(0.02, "host and software")
    host = probe_host()
    software = software_stack()
    progress(0.08, "devices")
    devices = [_with_free_memory(device) for device in probe_devices(host)]
    peers = peer_access_matrix(devices)
    progress(0.12, "topology")
    from .topology import collect_topology

    topology = collect_topology()
    to_measure = measured_devices(devices)
    per_device = []
    for position, device in enumerate(to_measure):
        progress(0.15 + 0.6 * position / len(to_measure), f"measuring {device_label(device)}")
        per_device.append({"device": device_label(device), "name": device["name"], **measure_device(device, budget)})
    progress(0.8, "collectives")
    gpus = [device for device in devices if device["kind"] in ("cuda", "rocm")]
    if len(gpus) >= 2:
        collectives = measure_collectives(len(gpus), "nccl")
    else:
        # One process per rank over gloo: on a CPU node this measures inter-process bandwidth on the host.
        collectives = measure_collectives(int(params.get("cpu_ranks", 2)), "gloo")
    progress(0.95, "checks")
    results = [checks.device_count_check(devices, params.get("expected_devices_per_node")),
               *checks.peer_access_checks(peers),
               *checks.package_checks(software["packages"], params.get("required_packages", checks.REQUIRED_PACKAGES)),
               *checks.peak_checks(per_device),
               *checks.repeatability_checks(per_device)]
    if "error" in collectives:
        results.append({"name": "collectives", "status": checks.WARN,
                        "message": f"Collective measurement failed: {collectives['error']}"})
    return {
        "host": host,
        "software": software,
        "devices": devices,
        "peer_access": peers,
        "topology": topology,
        "links": build_links(devices, peers, topology, collectives),
        "measurements": {"per_device": per_device, "collectives": collectives},
        "checks": results,
        "verdict": checks.verdict(results),
        "duration_seconds": time.monotonic() - started,
    }
