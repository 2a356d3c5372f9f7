"""Bus bandwidth of collectives, as nccl-tests defines it (nccl-tests doc/PERFORMANCE.md).

algbw = bytes / time, where bytes is the size of each rank's buffer. busbw = algbw × factor, the factor making
the figure comparable to the hardware's link bandwidth whatever the rank count n:
- all_reduce: 2(n-1)/n  (each rank sends and receives (n-1)/n of the data twice: reduce-scatter + all-gather)
- all_gather, reduce_scatter: (n-1)/n
- all_to_all: (n-1)/n
- broadcast, reduce: 1
"""

from __future__ import annotations

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth(collective: str, size_bytes: int, seconds: float, world_size: int) -> dict:
    """algbw and busbw in bytes/s for one collective of ``size_bytes`` per rank that took ``seconds``."""
    if world_size < 1 or seconds <= 0:
        raise ValueError("world_size must be >= 1 and seconds > 0")
    algbw = size_bytes / seconds
    return {"algbw": algbw, "busbw": algbw * BUS_FACTORS[collective](world_size)}
