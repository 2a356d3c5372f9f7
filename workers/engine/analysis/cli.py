"""The ``analyze`` verb of ``python -m workers.engine``:

    analyze CONFIG.json [--json] [--devices N --device-memory-gib M [--nodes K]] [--precision bf16]

``add_parser(verbs)`` registers it on the engine's argparse subparsers; ``run(args)`` returns the report dict,
which the engine's entry point prints. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse

from .kv_cache import KV_PRECISION_BYTES
from .memory import PRECISIONS
from .planner import DEFAULT_CONCURRENCY, DEFAULT_CONTEXT_TOKENS

GIB = 2**30


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser(
        "analyze", help="analyse a model's config.json offline: parameters, memory, KV cache, parallel layouts",
        description="Analyse a released config.json without downloading anything or running remote code.")
    parser.add_argument("config", metavar="CONFIG.json", help="the model's config.json")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                        help="weight precision the layouts are planned for (default bf16)")
    cluster = parser.add_argument_group("cluster (adds parallel-layout plans)")
    cluster.add_argument("--devices", type=_positive_int, metavar="N", help="accelerators per node")
    cluster.add_argument("--device-memory-gib", type=_positive_float, metavar="M", help="memory per device, GiB")
    cluster.add_argument("--nodes", type=_positive_int, default=1, metavar="K", help="nodes (default 1)")
    cluster.add_argument("--device-name", help="e.g. 'NVIDIA H200', to look up its published memory bandwidth")
    cluster.add_argument("--memory-bandwidth-gb-s", type=_positive_float, metavar="GB/S",
                         help="measured memory bandwidth per device, GB/s (overrides the published figure)")
    workload = parser.add_argument_group("workload the layouts must hold")
    workload.add_argument("--concurrency", type=_positive_int, default=DEFAULT_CONCURRENCY,
                          help=f"sequences decoded together (default {DEFAULT_CONCURRENCY})")
    workload.add_argument("--context", type=_positive_int, default=DEFAULT_CONTEXT_TOKENS,
                          help=f"tokens per sequence (default {DEFAULT_CONTEXT_TOKENS})")
    workload.add_argument("--kv-precision", choices=tuple(KV_PRECISION_BYTES), default="bf16",
                          help="KV-cache precision (default bf16)")
    return parser


def run(args: argparse.Namespace) -> dict:
    from . import analyze, load_config_file

    devices = None
    if args.devices is not None or args.device_memory_gib is not None:
        if args.devices is None or args.device_memory_gib is None:
            raise ValueError("--devices and --device-memory-gib go together")
        bandwidth = args.memory_bandwidth_gb_s * 1e9 if args.memory_bandwidth_gb_s else None
        devices = {"devices_per_node": args.devices, "nodes": args.nodes,
                   "device_memory_bytes": int(args.device_memory_gib * GIB),
                   "memory_bandwidth_bytes_per_s": bandwidth, "device_name": args.device_name}
    workload = {"concurrency": args.concurrency, "context_tokens": args.context, "kv_precision": args.kv_precision}
    return analyze(load_config_file(args.config), devices=devices, precision=args.precision, workload=workload)
