"""Published peak figures of common accelerators, to judge measured figures against.

Sources: vendor datasheets. Memory bandwidth in bytes/s; dense (non-sparse) bf16 tensor throughput in FLOP/s.
NVIDIA: H100 SXM5 datasheet (3.35 TB/s, 989 TFLOPS bf16 dense), H200 SXM datasheet (4.8 TB/s, 989 TFLOPS),
H100 PCIe (2.0 TB/s, 756 TFLOPS), B200 datasheet (8 TB/s, 2.25 PFLOPS dense bf16), A100 80GB SXM (2.039 TB/s,
312 TFLOPS), A100 40GB (1.555 TB/s, 312 TFLOPS), L40S (864 GB/s, 362 TFLOPS), H20 (4.0 TB/s, 148 TFLOPS).
AMD: MI300X datasheet (5.3 TB/s, 1307 TFLOPS bf16 dense), MI325X (6 TB/s, 1307 TFLOPS), MI250X (3.2 TB/s,
383 TFLOPS), MI300A (5.3 TB/s, 980 TFLOPS).
"""

from __future__ import annotations

TB = 1e12

# Ordered most specific first: "H100 PCIe" must match before "H100". memory: the total memory range torch reports
# for the part, for reference only: a device is never recognised by its size alone (parts share sizes, and a CPU
# node's RAM can match an accelerator's), so a cluster with no name matched and no env check has no figures.
PUBLISHED_PEAKS: list[tuple[str, dict]] = [
    ("H200", {"memory_bandwidth": 4.8 * TB, "bf16_flops": 989e12, "memory": (138e9, 153e9),
              "source": "NVIDIA H200 datasheet"}),
    ("H100 PCIe", {"memory_bandwidth": 2.0 * TB, "bf16_flops": 756e12, "source": "NVIDIA H100 PCIe datasheet"}),
    ("H100 NVL", {"memory_bandwidth": 3.9 * TB, "bf16_flops": 835e12, "memory": (93e9, 101e9),
                  "source": "NVIDIA H100 NVL datasheet"}),
    ("H100", {"memory_bandwidth": 3.35 * TB, "bf16_flops": 989e12, "memory": (79e9, 86e9),
              "source": "NVIDIA H100 SXM5 datasheet"}),
    ("H800", {"memory_bandwidth": 3.35 * TB, "bf16_flops": 989e12, "source": "NVIDIA H800 SXM5 datasheet"}),
    ("H20", {"memory_bandwidth": 4.0 * TB, "bf16_flops": 148e12, "source": "NVIDIA H20 datasheet"}),
    ("B200", {"memory_bandwidth": 8.0 * TB, "bf16_flops": 2250e12, "memory": (178e9, 186e9),
              "source": "NVIDIA DGX B200 datasheet (per GPU)"}),
    ("A100-SXM4-80GB", {"memory_bandwidth": 2.039 * TB, "bf16_flops": 312e12, "source": "NVIDIA A100 datasheet"}),
    ("A100 80GB", {"memory_bandwidth": 2.039 * TB, "bf16_flops": 312e12, "memory": (79e9, 86e9),
                   "source": "NVIDIA A100 80GB SXM datasheet"}),
    ("A100", {"memory_bandwidth": 1.555 * TB, "bf16_flops": 312e12, "source": "NVIDIA A100 40GB datasheet"}),
    ("L40S", {"memory_bandwidth": 0.864 * TB, "bf16_flops": 362e12, "memory": (44e9, 52e9),
              "source": "NVIDIA L40S datasheet"}),
    ("MI325X", {"memory_bandwidth": 6.0 * TB, "bf16_flops": 1307e12, "memory": (250e9, 276e9),
                "source": "AMD Instinct MI325X datasheet"}),
    ("MI300X", {"memory_bandwidth": 5.3 * TB, "bf16_flops": 1307e12, "memory": (190e9, 207e9),
                "source": "AMD Instinct MI300X datasheet"}),
    ("MI300A", {"memory_bandwidth": 5.3 * TB, "bf16_flops": 980e12, "source": "AMD Instinct MI300A datasheet"}),
    ("MI250X", {"memory_bandwidth": 3.2 * TB, "bf16_flops": 383e12, "source": "AMD Instinct MI250X datasheet"}),
]


def published_peak(device_name: str) -> dict | None:
    """The published figures for a device name as torch reports it (e.g. 'NVIDIA H200'), or None."""
    name = (device_name or "").upper()
    for marker, figures in PUBLISHED_PEAKS:
        if marker.upper() in name:
            return {"matched": marker, **figures}
    return None

