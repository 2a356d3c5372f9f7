"""``serve CONFIG.json``: an engine sweep from the command line, for node operators.

    python -m workers.engine serve config.json --engine vllm=/opt/vllm/bin/python \\
        --grid '{"max_num_seqs": [4, 8], "block_size": [16, 32]}' --settings '{"tensor_parallel_size": 2}' --json

Across nodes, the same command on each node with its rank (node rank 0 leads the sweep and serves the API, the
others run their engine headless for each of its starts; ``--master`` is node rank 0's address and a free port)::

    python -m workers.engine serve config.json --settings '{"tensor_parallel_size": 16}' \
        --nodes gpu-a,gpu-b --node-rank 0 --master 10.0.0.1:29400 --json    # and --node-rank 1 on gpu-b

Without ``--weights`` d0 writes a validation checkpoint of the architecture (reduced, seeded random weights);
``--weights DIR`` serves a checkpoint folder, its safetensors headers checked against its config.json first.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..sweep.result import ServeSweepResult
from ..sweep.trial_row import serve_sweep_table
from .stage import serve_sweep


def _object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser("serve", help="engine sweep: serve the model on vLLM under a grid of settings",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="the model's config.json")
    parser.add_argument("--engine", action="append", default=[], metavar="NAME=PYTHON",
                        help="an engine and its interpreter (default: $D0_ENGINES)")
    parser.add_argument("--use", default="vllm", help="which engine to sweep (default vllm)")
    parser.add_argument("--weights", type=Path, help="a checkpoint folder (default: a validation checkpoint)")
    parser.add_argument("--settings", type=_object, default={}, help="engine settings of every trial (JSON)")
    parser.add_argument("--grid", type=_object, help="lists of engine settings to try (JSON)")
    parser.add_argument("--workload", type=_object, default={}, help="the workload (JSON, as the sweep's)")
    parser.add_argument("--no-correctness", action="store_true", help="skip the greedy-token comparison")
    parser.add_argument("--nodes", help="the deployment's nodes, comma-separated, node rank 0 first")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank among --nodes")
    parser.add_argument("--master", metavar="ADDRESS:PORT", help="node rank 0's address and a port free there")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def run(args: argparse.Namespace, progress=None) -> dict:
    if args.engine:
        os.environ["D0_ENGINES"] = " ".join(args.engine)
    params = {"config": json.loads(args.config.read_text()), "engine": args.use, "settings": args.settings,
              "workload": args.workload, "correctness": not args.no_correctness}
    if args.grid is not None:
        params["grid"] = args.grid
    if args.weights:
        params["weights_path"] = str(args.weights.resolve())
    if args.nodes:
        address, _, port = (args.master or "").rpartition(":")
        if not address or not port.isdigit():
            raise SystemExit("--nodes needs --master ADDRESS:PORT (node rank 0's address and a free port there)")
        params["rendezvous"] = {"master_addr": address, "master_port": int(port), "node_rank": args.node_rank,
                                "hostnames": args.nodes.split(",")}
    # serve_sweep checks the parameters itself; an operator's own command may name any folder as weights.
    return serve_sweep(params, progress or (lambda fraction, message: None))


def format_summary(stored: dict) -> str:
    if stored.get("role") == "follower":
        return f"node rank {stored['node_rank']}: {stored['engine_starts']} engine start(s) headless for node rank 0"
    result = ServeSweepResult.from_dict(stored)
    lines = [f"{result.engine.get('name')} {result.engine.get('version')}: {len(result.trials)} trials, "
             f"{result.engine_starts} engine starts, {result.seconds or 0:.0f} s",
             *serve_sweep_table(result).terminal_lines(), f"recipe: {(result.recipe or {}).get('command')}"]
    if result.correctness:
        lines.append(f"correctness: {result.correctness.get('verdict')}")
    return "\n".join(lines)
