"""Small device measurements, each bounded to a fraction of a second of timed work.

- Copy bandwidth counts read + write bytes (2 × buffer size per copy), as STREAM's Copy kernel and CUDA's
  bandwidthTest device-to-device figure do.
- Host-to-device bandwidth copies from pinned host memory (what loaders use) and counts the buffer once.
- Matmul throughput: 2·n³ FLOP per n×n×n product (one multiply and one add per term), n grown until one
  product takes long enough to time, so a slow dtype (fp16 on many CPUs) costs milliseconds, not minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def _time_repeated(operation: Callable[[], object], device, budget_seconds: float) -> tuple[int, float]:
    """Run ``operation`` repeatedly for about ``budget_seconds``; return (repetitions, seconds)."""
    operation()  # warm-up: allocation, kernel selection, lazy initialisation
    _synchronize(device)
    repetitions, started = 0, time.perf_counter()
    while True:
        operation()
        repetitions += 1
        if repetitions % 4 == 0 or repetitions == 1:
            _synchronize(device)
            elapsed = time.perf_counter() - started
            if elapsed >= budget_seconds:
                return repetitions, elapsed


def copy_bandwidth(device, size_bytes: int = 256 * 2**20, budget_seconds: float = 0.4) -> dict:
    import torch

    source = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    repetitions, seconds = _time_repeated(lambda: target.copy_(source), device, budget_seconds)
    return {"bytes_per_s": 2 * size_bytes * repetitions / seconds, "size_bytes": size_bytes,
            "repetitions": repetitions, "counting": "read + write (STREAM Copy)"}


def host_to_device_bandwidth(device, size_bytes: int = 256 * 2**20, budget_seconds: float = 0.4) -> dict:
    import torch

    host = torch.empty(size_bytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    repetitions, seconds = _time_repeated(lambda: target.copy_(host, non_blocking=True), device, budget_seconds)
    return {"bytes_per_s": size_bytes * repetitions / seconds, "size_bytes": size_bytes, "pinned": True,
            "repetitions": repetitions}


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


def matmul_throughput(device, dtype_name: str, budget_seconds: float = 0.3, max_n: int | None = None) -> dict:
    max_n = max_n or (8192 if device.type != "cpu" else 2048)
    n = 256
    try:
        while True:
            operation = _matmul_operation(dtype_name, n, device)
            started = time.perf_counter()
            operation()
            _synchronize(device)
            single = time.perf_counter() - started
            if single > 0.02 or n >= max_n:
                break
            n *= 2
        repetitions, seconds = _time_repeated(operation, device, budget_seconds)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        return {"supported": False, "reason": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
    return {"supported": True, "flops_per_s": 2 * n**3 * repetitions / seconds, "n": n, "repetitions": repetitions}
