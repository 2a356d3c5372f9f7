"""Device measurements that repeat: each figure is the median of several timed repetitions, with its spread.

One timing of one operation swings several-fold on a node with other work (fp32 matmul was seen to vary 18x
between runs when the product size was picked from one timing), so every figure here is:

- measured on a working set chosen from the device, never from a timing: a copy buffer ``CACHE_MULTIPLE`` times
  the largest cache the OS reports (sysfs, sysconf; STREAM's rule is at least 4x the caches), or a share of a
  GPU's memory far past its L2; matmuls of a fixed size per device class, smaller for a dtype a CPU only
  emulates (``matmul_size``);
- timed ``REPETITIONS`` times after a warm-up, each repetition long enough to time (the count of operations per
  repetition comes from the warm-up, which changes only how finely it is timed, not what is measured);
- reported as the median with the min, max, quartiles and max/min ratio of the repetitions (``summary``).

Counting: copy bandwidth counts read + write bytes (2 x buffer per copy), as STREAM's Copy and CUDA's
bandwidthTest device-to-device do; host-to-device copies from pinned host memory and counts the buffer once;
a matmul is 2 n^3 FLOP (one multiply and one add per term).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

REPETITIONS = 5
CACHE_MULTIPLE = 4
MIN_BUFFER_BYTES = 64 * 2**20
MAX_BUFFER_BYTES = 2 * 2**30
# A GPU's copy buffer: a small share of its memory (a busy device still fits it), far past its L2 (tens of MiB).
GPU_MEMORY_SHARE = 1 / 64
SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def summary(values: list[float]) -> dict:
    """Median, min, max, quartiles and max/min ratio of repeated measurements (the samples kept, in run order)."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "q1": quartiles[0],
            "q3": quartiles[2], "max_over_min": ordered[-1] / ordered[0] if ordered[0] > 0 else None,
            "samples": list(values)}


def _size_text(text: str) -> int:
    """sysfs cache sizes: "32768K", "1M", "512"."""
    text = text.strip().upper()
    unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * unit


def cpu_cache_bytes(sysfs: Path = SYSFS_CACHE, sysconf=os.sysconf) -> tuple[int | None, str]:
    """The largest CPU cache the OS reports, and where it came from. Both sysfs (what this OS instance sees, a VM's
    share) and sysconf (glibc: often the host's whole L3) are read and the larger taken: a buffer must be past the
    real cache, and a virtual machine can report less than the socket it runs on has."""
    found: list[tuple[int, str]] = []
    for index in sorted(sysfs.glob("index*")):
        try:
            size = _size_text((index / "size").read_text())
            level = (index / "level").read_text().strip()
        except (OSError, ValueError):
            continue
        found.append((size, f"L{level} {size // 2**20 or size // 2**10}{'MiB' if size >= 2**20 else 'KiB'} (sysfs)"))
    for name, level in (("SC_LEVEL3_CACHE_SIZE", 3), ("SC_LEVEL2_CACHE_SIZE", 2)):
        try:
            size = sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if size and size > 0:
            found.append((size, f"L{level} {size // 2**20}MiB (sysconf)"))
    if not found:
        return None, "no cache size reported"
    return max(found)


def buffer_bytes(device, available_bytes: int | None = None) -> tuple[int, str]:
    """The copy buffer for ``device`` and why that size: well past the caches, never from a timing."""
    if device.type in ("cuda", "xpu"):
        import torch

        module = torch.cuda if device.type == "cuda" else torch.xpu
        properties = module.get_device_properties(device)
        l2 = getattr(properties, "L2_cache_size", 0) or 0
        size = min(max(CACHE_MULTIPLE * l2, int(properties.total_memory * GPU_MEMORY_SHARE), MIN_BUFFER_BYTES),
                   MAX_BUFFER_BYTES)
        return size, (f"{size / max(l2, 1):.0f}x its {l2 / 2**20:.0f} MiB L2, at most {GPU_MEMORY_SHARE:.3g} of "
                      f"{properties.total_memory / 2**30:.0f} GiB device memory")
    return cpu_buffer_bytes(*cpu_cache_bytes(), available_bytes)


def memory_at_hand() -> int:
    """The memory this process may take: the machine's available memory, or less under a data-segment limit (the
    node runs each stage under ``RLIMIT_DATA``, workers/stage_memory.py: a 300 MiB L3 asked for two 1.2 GB buffers
    of a stage limited to 1 GiB)."""
    import resource

    import psutil

    available = psutil.virtual_memory().available
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return available if soft == resource.RLIM_INFINITY else min(available, soft)


def cpu_buffer_bytes(cache: int | None, where: str, available_bytes: int | None = None) -> tuple[int, str]:
    size = max(CACHE_MULTIPLE * (cache or 0), MIN_BUFFER_BYTES)
    if available_bytes is None:
        available_bytes = memory_at_hand()
    # Two buffers of this size are live; leave most memory to whatever else runs on the node.
    size = min(size, MAX_BUFFER_BYTES, max(available_bytes // 8, MIN_BUFFER_BYTES))
    return size, (f"{size / cache:.1f}x the largest cache, {where}" if cache else f"{where}: the minimum")


# CPU instructions that run a dtype's products natively (x86 /proc/cpuinfo flags; aarch64 "Features"); without
# them torch emulates the dtype at a few hundred MFLOP/s, and a product of the native size would take seconds.
NATIVE_CPU_FLAGS = {"fp32": None, "bf16": {"avx512_bf16", "amx_bf16", "bf16"},
                    "fp16": {"avx512_fp16", "amx_fp16", "fphp", "asimdhp"},
                    "int8": {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"}}
EMULATED_N = 256
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The CPU's instruction-set flags as Linux lists them, or None where it does not."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def matmul_size(device, dtype_name: str = "fp32", flags: set[str] | None = None) -> tuple[int, str]:
    """The n of the n x n x n products timed on ``device`` and why, from its class and (on a CPU) whether it runs
    the dtype natively: large enough to reach the device's throughput, small enough that an emulated dtype still
    costs well under a second a product. Never from a timing."""
    if device.type == "cpu":
        native = NATIVE_CPU_FLAGS.get(dtype_name)
        flags = cpu_flags() if flags is None else flags
        if native and flags is not None and not native & flags:
            return EMULATED_N, f"cpu without {'/'.join(sorted(native))}: {dtype_name} emulated"
        n = 2048 if (os.cpu_count() or 1) >= 32 else 1024
        return n, f"cpu with {os.cpu_count()} cores"
    if device.type == "mps":
        return 4096, "mps"
    return 8192, f"{device.type} accelerator"


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed_repetitions(operation: Callable[[], object], device, budget_seconds: float,
                      repetitions: int = REPETITIONS) -> list[float]:
    """Seconds per operation in each of ``repetitions`` timed repetitions after a warm-up; each repetition runs the
    operation as often as fits its share of ``budget_seconds`` (at least once)."""
    operation()  # warm-up: allocation, kernel selection, lazy initialisation
    _synchronize(device)
    started = time.perf_counter()
    operation()
    _synchronize(device)
    single = max(time.perf_counter() - started, 1e-9)
    per_repetition = max(1, int(budget_seconds / repetitions / single))
    seconds = []
    for _ in range(repetitions):
        started = time.perf_counter()
        for _ in range(per_repetition):
            operation()
        _synchronize(device)
        seconds.append((time.perf_counter() - started) / per_repetition)
    return seconds


def _rates(amount: float, seconds: list[float]) -> dict:
    return summary([amount / each for each in seconds])


def copy_bandwidth(device, size_bytes: int | None = None, budget_seconds: float = 0.5,
                   repetitions: int = REPETITIONS) -> dict:
    import torch

    size_from = "given"
    if size_bytes is None:
        size_bytes, size_from = buffer_bytes(device)
    source = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    source.fill_(1)  # touch every page, so the first timed copy does not pay for faulting them in
    target = torch.empty_like(source).fill_(0)
    spread = _rates(2 * size_bytes, timed_repetitions(lambda: target.copy_(source), device, budget_seconds,
                                                      repetitions))
    return {"bytes_per_s": spread["median"], "spread": spread, "size_bytes": size_bytes, "size_from": size_from,
            "repetitions": repetitions, "counting": "read + write (STREAM Copy)"}


def host_to_device_bandwidth(device, size_bytes: int | None = None, budget_seconds: float = 0.5,
                             repetitions: int = REPETITIONS) -> dict:
    import torch

    size_from = "given"
    if size_bytes is None:
        size_bytes, size_from = buffer_bytes(device)
        size_bytes = min(size_bytes, MAX_BUFFER_BYTES)  # pinned host memory is scarcer than device memory
    host = torch.empty(size_bytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    spread = _rates(size_bytes, timed_repetitions(lambda: target.copy_(host, non_blocking=True), device,
                                                  budget_seconds, repetitions))
    return {"bytes_per_s": spread["median"], "spread": spread, "size_bytes": size_bytes, "size_from": size_from,
            "pinned": True, "repetitions": repetitions}


def _matmul_operation(dtype_name: str, n: int, device):
    """The product to time for a dtype, or raise if the device cannot do it."""
    import torch

    if dtype_name in ("fp32", "bf16", "fp16"):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        return lambda: a @ b
    if dtype_name == "int8":
        a = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    if dtype_name == "fp8":
        if device.type != "cuda":
            raise NotImplementedError("fp8 matmul needs a GPU with float8 tensor cores (compute capability 8.9+)")
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # _scaled_mm wants column-major b
        scale = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    raise ValueError(f"unknown dtype {dtype_name}")


def matmul_throughput(device, dtype_name: str, budget_seconds: float = 0.5, n: int | None = None,
                      repetitions: int = REPETITIONS) -> dict:
    n_from = "given"
    if n is None:
        n, n_from = matmul_size(device, dtype_name)
    try:
        operation = _matmul_operation(dtype_name, n, device)
        seconds = timed_repetitions(operation, device, budget_seconds, repetitions)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        return {"supported": False, "reason": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
    spread = _rates(2 * n**3, seconds)
    return {"supported": True, "flops_per_s": spread["median"], "spread": spread, "n": n,
            "n_from": n_from, "repetitions": repetitions}
