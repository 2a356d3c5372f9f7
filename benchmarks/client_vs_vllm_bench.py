"""d0's load client against ``vllm bench serve`` (vLLM's own ``vllm.benchmarks.serve``), on one running vLLM server.

    python benchmarks/client_vs_vllm_bench.py [--config llama-3.1-8b.json] [--rounds 3] [--requests 32]

Starts vLLM (the CPU build from ``scripts/vllm-env.sh`` unless ``--vllm-python`` names another) on a validation
checkpoint, then runs the same workload (random prompts of ``--input-len`` tokens, ``--output-len`` tokens each with
ignore_eos, ``--concurrency`` in flight, all sent at once) with both clients, interleaved, ``--rounds`` times each.
Prints per round and the medians of TTFT, TPOT and output tokens/s, the ratios d0 / vLLM (the target: within 10%),
and d0's client CPU time per request. vLLM's figures are read from its result dict (``main`` returns it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.engine.serving.checkpoint import write_validation_checkpoint  # noqa: E402
from workers.engine.serving.client import Endpoint, run_requests  # noqa: E402
from workers.engine.serving.launchers import VllmLauncher  # noqa: E402
from workers.engine.serving.server import EngineServer, engine_environment, free_port  # noqa: E402
from workers.engine.sweep.metrics import summarize  # noqa: E402
from workers.engine.sweep.workload import Workload  # noqa: E402

BURST_TPOT_S = 1e-4
VLLM_BENCH = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("D0RESULT " + json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float))}))
"""


def vllm_bench(python: str, server: EngineServer, checkpoint: Path, args, seed: int) -> dict:
    command = [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", server.base_url, "--model", "d0",
               "--tokenizer", str(checkpoint), "--dataset-name", "random", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
               str(args.requests), "--max-concurrency", str(args.concurrency), "--request-rate", "inf",
               "--ignore-eos", "--disable-tqdm", "--seed", str(seed), "--num-warmups", str(args.concurrency),
               "--percentile-metrics", "ttft,tpot,itl,e2el"]
    output = subprocess.run(command, capture_output=True, text=True, env=engine_environment(), timeout=1800)
    lines = [line for line in output.stdout.splitlines() if line.startswith("D0RESULT ")]
    if not lines:
        raise RuntimeError(f"vllm bench serve failed:\n{output.stdout[-2000:]}\n{output.stderr[-3000:]}")
    result = json.loads(lines[-1].split(" ", 1)[1])
    return {"ttft_s": result["median_ttft_ms"] / 1000, "tpot_s": result["median_tpot_ms"] / 1000,
            "output_tokens_per_s": result["output_throughput"], "completed": result.get("completed")}


def d0_client(server: EngineServer, vocab: int, args, seed: int) -> dict:
    workload = Workload.from_dict({"requests": args.requests, "prompt_len": args.input_len,
                                   "output_len": args.output_len, "concurrency": args.concurrency,
                                   "warmup_requests": args.concurrency, "seed": seed})
    run = run_requests(Endpoint(server.base_url, "d0"), workload.measured_requests(vocab),
                       warmup=workload.warmup(vocab, args.concurrency), in_flight=args.concurrency)
    metrics = summarize(run.records)
    return {"ttft_s": metrics["ttft_s"]["p50"], "tpot_s": metrics["tpot_s"]["p50"],
            "output_tokens_per_s": metrics["output_tokens_per_s"], "completed": metrics["completed"],
            "client_cpu_s_per_request": run.client_cpu_s_per_request}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="llama-3.1-8b.json", help="a catalog config (adaptation/intake/...)")
    parser.add_argument("--vllm-python", help="vLLM's interpreter (default: scripts/vllm-env.sh's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    python = args.vllm_python or subprocess.run([str(REPO / "scripts" / "vllm-env.sh")], capture_output=True,
                                                text=True, check=True).stdout.strip().splitlines()[-1]
    config = json.loads((REPO / "adaptation" / "intake" / "catalog" / "configs" / args.config).read_text())
    with tempfile.TemporaryDirectory(prefix="d0-bench-") as work:
        checkpoint = Path(work) / "checkpoint"
        vocab = write_validation_checkpoint(config, checkpoint)["vocab_size"]
        port = free_port()
        launch = VllmLauncher.launch(python, checkpoint, {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1,
                                                          "max_model_len": 512, "max_num_seqs": args.concurrency},
                                     port=port, cpu_build=True)
        with EngineServer(launch.command, env=launch.env, port=port, log_path=Path(work) / "engine.log") as server:
            print(f"vLLM healthy after {server.wait_healthy(900):.0f} s: {launch.shell()}", flush=True)
            rounds = {"d0": [], "vllm": []}
            for index in range(args.rounds):
                # Interleaved, the order alternating, so drift of the machine falls on both clients alike.
                order = ("d0", "vllm") if index % 2 == 0 else ("vllm", "d0")
                for name in order:
                    figures = (d0_client(server, vocab, args, seed=index) if name == "d0"
                               else vllm_bench(python, server, checkpoint, args, seed=index))
                    rounds[name].append(figures)
                    print(f"round {index + 1} {name:5} TTFT p50 {figures['ttft_s'] * 1000:8.2f} ms  TPOT p50 "
                          f"{figures['tpot_s'] * 1000:7.2f} ms  {figures['output_tokens_per_s']:8.1f} tok/s  "
                          f"({figures['completed']} requests)", flush=True)
    print(f"\nmedians over {args.rounds} rounds ({args.requests} requests, {args.input_len} in / {args.output_len} "
          f"out, concurrency {args.concurrency}):")
    for key, label in (("ttft_s", "TTFT p50"), ("tpot_s", "TPOT p50"), ("output_tokens_per_s", "output tok/s")):
        ours = statistics.median(figures[key] for figures in rounds["d0"])
        theirs = statistics.median(figures[key] for figures in rounds["vllm"])
        verdict = "within 10%" if abs(ours / theirs - 1) <= 0.10 else "OFF BY MORE THAN 10%"
        print(f"  {label:13} d0 {ours:10.4f}  vllm bench {theirs:10.4f}  ratio {ours / theirs:5.3f}  {verdict}")
    bursts = {name: sum(figures["tpot_s"] < BURST_TPOT_S for figures in runs) for name, runs in rounds.items()}
    if any(bursts.values()):
        # TPOT ~0 with a long TTFT: the server sent the whole output in one burst (its API process starved for CPU
        # beside the engine core), so neither client saw token timing in those rounds.
        print(f"  rounds where the server sent whole outputs at once (TPOT p50 < {BURST_TPOT_S * 1000:g} ms): "
              + ", ".join(f"{name} {count} of {len(rounds[name])}" for name, count in bursts.items())
              + " — their TTFT/TPOT do not measure streaming")
    cpu = statistics.median(figures["client_cpu_s_per_request"] for figures in rounds["d0"])
    print(f"  d0 client CPU time per request: {cpu * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
