"""``python -m workers.engine shard CONFIG.json --tp N [--pp N] [--ep N] [--dtype fp32] [--decode-steps 16] --json``.

``add_parser(verbs)`` adds the verb to the engine's subcommands; ``run(args)`` returns the report as a dict. A run
that ends without a report (a rank failed or hung) comes back as ``{"error": ..., "correct": False, "ranks": ...}``
so the operator sees which rank and what it printed last.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import ShardedRunError, run_sharded
from .compare import THRESHOLDS


def add_parser(verbs) -> None:
    shard = verbs.add_parser("shard", help="run a small model of CONFIG's architecture sharded and compare it with a "
                                           "single-process reference")
    shard.add_argument("config", type=Path, help="an HF config.json (shrunk to a small model of the same kind)")
    shard.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    shard.add_argument("--pp", type=int, default=1, help="pipeline stages")
    shard.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (MoE; equal to --tp when both > 1)")
    shard.add_argument("--dtype", choices=sorted(THRESHOLDS), default="fp32", help="dtype of the sharded run")
    shard.add_argument("--decode-steps", type=int, default=16, help="greedy decode steps after the prefill")
    shard.add_argument("--seed", type=int, default=0, help="seed of the random weights and the prompt")
    shard.add_argument("--weights", help="a local checkpoint folder (safetensors) instead of random weights")
    shard.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    shard.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is ended")
    shard.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> dict:
    config = None if args.weights else json.loads(args.config.read_text())
    try:
        return run_sharded(config, tp=args.tp, pp=args.pp, ep=args.ep, dtype=args.dtype,
                           decode_steps=args.decode_steps, seed=args.seed, weights_path=args.weights,
                           device=args.device, timeout_s=args.timeout)
    except ShardedRunError as error:
        return {"error": str(error), "correct": False, "ranks": error.ranks}
