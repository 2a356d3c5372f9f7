"""Pass/warn/fail checks over an environment report, each with a message a person can act on."""

from __future__ import annotations

from .peaks import published_peak

PASS, WARN, FAIL = "pass", "warn", "fail"
# A measured figure under this fraction of the published peak is worth a look (throttling, wrong PCIe slot,
# a busy device, a debug build). Real devices reach 70-90% of peak copy bandwidth and matmul throughput.
FAR_BELOW_PEAK = 0.4
REQUIRED_PACKAGES = ("torch", "transformers")
# Repetitions of one figure further apart than this (max / min) say the device was shared while it was measured:
# the median still stands, but a second check on an idle node is worth it before building on the figure.
NOISY_MAX_OVER_MIN = 1.5


def _check(name: str, status: str, message: str, **details) -> dict:
    return {"name": name, "status": status, "message": message, **({"details": details} if details else {})}


def device_count_check(devices: list[dict], expected: int | None) -> dict:
    accelerators = [device for device in devices if device["kind"] != "cpu"]
    counted = accelerators or devices  # a CPU-only node offers its CPU as its one device
    kind = "accelerator" if accelerators else "CPU device"
    if expected and len(counted) < expected:
        return _check("device_count", FAIL,
                      f"Found {len(counted)} {kind}(s) but the cluster expects {expected} per node. Check "
                      f"CUDA_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES, the driver (nvidia-smi), or correct the "
                      f"cluster's expected devices per node.", found=len(counted), expected=expected)
    return _check("device_count", PASS, f"{len(counted)} {kind}(s), as expected ({expected or 'any'}).",
                  found=len(counted), expected=expected)


def peer_access_checks(peer_matrix: list[list[bool | None]] | None) -> list[dict]:
    if not peer_matrix or len(peer_matrix) < 2:
        return []
    missing = [(a, b) for a, row in enumerate(peer_matrix) for b, ok in enumerate(row) if a != b and ok is False]
    if missing:
        pairs = ", ".join(f"{a}→{b}" for a, b in missing[:12])
        return [_check("peer_access", WARN,
                       f"Peer access is missing between {len(missing)} device pair(s) ({pairs}); tensor-parallel "
                       f"traffic between them goes through host memory. Check IOMMU/ACS settings and the topology.",
                       missing=missing)]
    return [_check("peer_access", PASS, f"All {len(peer_matrix)} devices reach each other directly.")]


def package_checks(packages: dict[str, str], required=REQUIRED_PACKAGES) -> list[dict]:
    absent = [name for name in required if packages.get(name, "absent") == "absent"]
    if absent:
        return [_check("packages", FAIL, f"Required package(s) missing: {', '.join(absent)}. Install them with "
                                         f"pip install -r workers/node-requirements.txt.", missing=absent)]
    return [_check("packages", PASS, "Required packages present: " +
                   ", ".join(f"{name} {packages[name]}" for name in required))]


def peak_checks(per_device: list[dict]) -> list[dict]:
    """Measured copy bandwidth and bf16 matmul throughput against the device's published peak."""
    results = []
    for measured in per_device:
        peak = published_peak(measured["name"])
        if not peak:
            continue
        label = f"{measured['device']} ({measured['name']})"
        copy = measured.get("copy_bandwidth", {}).get("bytes_per_s")
        bf16 = measured.get("matmul", {}).get("bf16", {}).get("flops_per_s")
        for figure, value, peak_value, unit, scale in (
            ("memory bandwidth", copy, peak["memory_bandwidth"], "TB/s", 1e12),
            ("bf16 matmul", bf16, peak["bf16_flops"], "TFLOP/s", 1e12),
        ):
            if value is None:
                continue
            ratio = value / peak_value
            status = WARN if ratio < FAR_BELOW_PEAK else PASS
            advice = (" — far below peak: look for throttling (nvidia-smi -q -d PERFORMANCE), other work on the "
                      "device, or a wrong PCIe/NVLink placement" if status == WARN else "")
            results.append(_check(f"peak_{figure.replace(' ', '_')}", status,
                                  f"{label} {figure}: {value / scale:.2f} {unit} measured, {ratio:.0%} of the "
                                  f"published {peak_value / scale:.2f} {unit} ({peak['matched']}){advice}.",
                                  ratio=ratio, measured=value, published=peak_value))
    return results


def _figures(measured: dict):
    """(name, figure dict) of every repeated measurement of one device."""
    for name in ("copy_bandwidth", "host_to_device_bandwidth"):
        if measured.get(name):
            yield name.replace("_", " "), measured[name]
    for dtype, figure in (measured.get("matmul") or {}).items():
        if figure.get("supported"):
            yield f"{dtype} matmul", figure


def repeatability_checks(per_device: list[dict]) -> list[dict]:
    """Whether each device's repetitions agree: a warning names the figures whose max/min exceeds
    ``NOISY_MAX_OVER_MIN``."""
    results = []
    for measured in per_device:
        ratios = {name: figure["spread"]["max_over_min"] for name, figure in _figures(measured)
                  if (figure.get("spread") or {}).get("max_over_min")}
        if not ratios:
            continue
        noisy = {name: ratio for name, ratio in ratios.items() if ratio > NOISY_MAX_OVER_MIN}
        label = f"{measured['device']} ({measured['name']})"
        if noisy:
            listed = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in noisy.items())
            results.append(_check("repeatability", WARN,
                                  f"{label}: repetitions disagree (max/min {listed}, over {NOISY_MAX_OVER_MIN}x): "
                                  f"other work shared the device while it was measured. The medians are reported; "
                                  f"check again on an idle node before trusting them.", max_over_min=ratios))
        else:
            results.append(_check("repeatability", PASS,
                                  f"{label}: every figure's repetitions within {max(ratios.values()):.2f}x of "
                                  f"each other.", max_over_min=ratios))
    return results


def verdict(checks: list[dict]) -> str:
    statuses = {check["status"] for check in checks}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS
