"""Basic environment probe: host facts (psutil, standard library) and the devices torch can see.

A CPU-only node reports its CPU as device 0 of kind ``cpu`` so every later stage has a device to work with.
"""

from __future__ import annotations

import os
import platform
import socket
import sys

import psutil


def _cpu_model() -> str:
    # /proc/cpuinfo has the marketing name on Linux; platform.processor() is often empty there.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _address() -> str | None:
    """The address other nodes reach this one at (a sharded run's rendezvous): ``D0_NODE_ADDRESS`` when the node
    worker was told it (``--address``), else what the host's name resolves to. Debian maps the hostname to
    127.0.1.1 in /etc/hosts, which other machines cannot reach: multi-node runs need ``--address`` there."""
    if os.environ.get("D0_NODE_ADDRESS"):
        return os.environ["D0_NODE_ADDRESS"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def probe_host() -> dict:
    memory = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "address": _address(),
        "os": platform.system(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpu_model": _cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "memory_total_bytes": memory.total,
        "memory_available_bytes": memory.available,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _cpu_device(host: dict) -> dict:
    return {
        "index": 0,
        "kind": "cpu",
        "name": host["cpu_model"],
        "memory_bytes": host["memory_total_bytes"],
        "properties": {"cores_logical": host["cpu_cores_logical"], "cores_physical": host["cpu_cores_physical"]},
    }


def _cuda_devices(torch) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "kind": kind,
                "name": props.name,
                "memory_bytes": int(props.total_memory),
                "properties": {
                    "compute_capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                    "gcn_arch": getattr(props, "gcnArchName", None),
                },
            }
        )
    return devices


def _xpu_devices(torch) -> list[dict]:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    devices = []
    for index in range(xpu.device_count()):
        props = xpu.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "kind": "xpu",
                "name": props.name,
                "memory_bytes": int(getattr(props, "total_memory", 0)),
                "properties": {"driver_version": getattr(props, "driver_version", None)},
            }
        )
    return devices


def _npu_devices(torch) -> list[dict]:
    # Ascend's torch_npu registers torch.npu when imported; nothing to do when it is absent.
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return []
    return [
        {"index": index, "kind": "npu", "name": npu.get_device_name(index), "memory_bytes": 0, "properties": {}}
        for index in range(npu.device_count())
    ]


def _mps_devices(torch) -> list[dict]:
    if not torch.backends.mps.is_available():
        return []
    # Apple silicon shares system memory with the GPU; report it as the device's memory.
    return [
        {
            "index": 0,
            "kind": "mps",
            "name": "Apple MPS",
            "memory_bytes": psutil.virtual_memory().total,
            "properties": {},
        }
    ]


def probe_devices(host: dict | None = None) -> list[dict]:
    """Every device torch can see on this node, CPU first."""
    import torch  # imported here so a node can report its host facts even with a broken torch install

    host = host or probe_host()
    devices = [_cpu_device(host)]
    for finder in (_cuda_devices, _xpu_devices, _npu_devices, _mps_devices):
        devices.extend(finder(torch))
    return devices


def torch_versions() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }
