"""The cost of spreading one engine over two nodes: the same workload on vLLM at TP=2 inside one node (one engine,
two ranks) and across two nodes (two engine launches joined by vLLM's own ``--nnodes/--node-rank``, the second
``--headless``), as d0's multi-node serve sweep launches them, interleaved, several rounds.

    python benchmarks/multinode_overhead.py [--rounds 3] [--requests 32] [--concurrency 4] [--output-len 32]

Both "nodes" are processes on this machine talking over loopback, each rank bound to a CPU of its own in both
arrangements (``VLLM_CPU_OMP_THREADS_BIND``), so what differs is the path between the ranks: inside one node vLLM's
shared-memory message queue, across nodes its TCP one. Prints each round's output tokens/s, TPOT and TTFT medians
and engine start, the medians over the rounds, and the ratios across / inside. On real hardware the between-node
path is a network (InfiniBand, RoCE, Ethernet), not loopback: this measures d0's and vLLM's own overhead of a
multi-node launch, the lower bound of what a real network adds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.engine.serving.checkpoint import write_validation_checkpoint  # noqa: E402
from workers.engine.serving.client import Endpoint, run_requests  # noqa: E402
from workers.engine.serving.launchers import NodeRole, VllmLauncher  # noqa: E402
from workers.engine.serving.server import EngineServer, free_port  # noqa: E402
from workers.engine.sweep.metrics import summarize  # noqa: E402
from workers.engine.sweep.workload import Workload  # noqa: E402

SETTINGS = {"tensor_parallel_size": 2, "enforce_eager": True, "gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1,
            "max_model_len": 512, "max_num_seqs": 8}


def servers(python: str, checkpoint: Path, logs: Path, arrangement: str, round_: int) -> list[EngineServer]:
    """The engine processes of one arrangement; the first serves the API."""
    port = free_port()
    if arrangement == "inside":
        launch = VllmLauncher.launch(python, checkpoint, SETTINGS, port=port, cpu_build=True)
        launch.env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        return [EngineServer(launch.command, env=launch.env, port=port, log_path=logs / f"inside-{round_}.log")]
    engine_port, found = free_port(), []
    for rank in (0, 1):
        own = port if rank == 0 else free_port()
        launch = VllmLauncher.launch(python, checkpoint, SETTINGS, port=own, cpu_build=True,
                                     role=NodeRole(2, rank, "127.0.0.1", engine_port, "127.0.0.1"))
        found.append(EngineServer(launch.command, env={**launch.env, "VLLM_CPU_OMP_THREADS_BIND": str(rank)},
                                  port=own, log_path=logs / f"across-{round_}-rank{rank}.log"))
    return found


def serve(python: str, checkpoint: Path, logs: Path, arrangement: str, round_: int, workload: Workload,
          vocab: int) -> dict:
    started = servers(python, checkpoint, logs, arrangement, round_)
    try:
        for server in started:
            server.start()
        startup = started[0].wait_healthy(600)
        run = run_requests(Endpoint(started[0].base_url, "d0"), workload.measured_requests(vocab),
                           warmup=workload.warmup(vocab, workload.concurrency), in_flight=workload.concurrency,
                           timeout_s=600)
    finally:
        for server in started:
            server.stop()
    metrics = summarize(run.records, None)
    if metrics["completed"] != len(run.records):
        raise SystemExit(f"{arrangement}: {metrics['failed']} requests failed")
    return {"output_tokens_per_s": metrics["output_tokens_per_s"], "tpot_p50_ms": metrics["tpot_s"]["p50"] * 1e3,
            "ttft_p50_ms": metrics["ttft_s"]["p50"] * 1e3, "startup_s": startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--config", default=str(REPO / "adaptation" / "intake" / "catalog" / "configs" /
                                                "llama-3.1-8b.json"))
    args = parser.parse_args()
    workload = Workload.from_dict({"requests": args.requests, "prompt_len": args.input_len,
                                   "output_len": args.output_len, "concurrency": args.concurrency})
    with tempfile.TemporaryDirectory() as work:
        checkpoint = Path(work) / "checkpoint"
        described = write_validation_checkpoint(json.loads(Path(args.config).read_text()), checkpoint)
        vocab = described["vocab_size"]
        print(f"model: validation checkpoint of {Path(args.config).name} ({described['layers']} layer(s), random "
              f"weights), TP=2, {args.requests} requests of {args.input_len} in / {args.output_len} out, "
              f"concurrency {args.concurrency}, {args.rounds} interleaved rounds")
        rows = {"inside": [], "across": []}
        for round_ in range(args.rounds):
            order = ("inside", "across") if round_ % 2 == 0 else ("across", "inside")
            for arrangement in order:
                began = time.perf_counter()
                figures = serve(args.vllm_python, checkpoint, Path(work) / "logs", arrangement, round_, workload,
                                vocab)
                rows[arrangement].append(figures)
                print(f"round {round_ + 1} {arrangement:>6}: {figures['output_tokens_per_s']:7.1f} out tok/s, TPOT "
                      f"p50 {figures['tpot_p50_ms']:6.2f} ms, TTFT p50 {figures['ttft_p50_ms']:7.1f} ms, start "
                      f"{figures['startup_s']:5.1f} s ({time.perf_counter() - began:.0f} s in all)", flush=True)
    print()
    medians = {arrangement: {key: statistics.median(row[key] for row in found) for key in found[0]}
               for arrangement, found in rows.items()}
    for key in ("output_tokens_per_s", "tpot_p50_ms", "ttft_p50_ms", "startup_s"):
        inside, across = medians["inside"][key], medians["across"][key]
        print(f"median {key:>20}: inside {inside:8.2f}  across {across:8.2f}  across/inside {across / inside:5.2f}")


if __name__ == "__main__":
    main()
