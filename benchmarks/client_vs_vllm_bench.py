"""d0's load client against ``vllm bench serve`` (vLLM's own ``vllm.benchmarks.serve``), on one running vLLM server.

    python benchmarks/client_vs_vllm_bench.py [--rounds 7] [--requests 96] [--output-len 64] [--width 1024]

Starts vLLM (the CPU build from ``scripts/vllm-env.sh`` unless ``--vllm-python`` names another) on a validation
checkpoint, then runs the same workload (random prompts of ``--input-len`` tokens, ``--output-len`` tokens each with
ignore_eos, ``--concurrency`` in flight, all sent at once) with both clients, interleaved, ``--rounds`` times each.
Prints per round and the medians of TTFT, TPOT and output tokens/s, the ratios d0 / vLLM (the target: within 10%),
and d0's client CPU time per request. vLLM's figures are read from its result dict (``main`` returns it).

On a machine of few cores the engine core's busy OpenMP threads starve the engine's API process and the client,
and the server then sends whole outputs in one burst (nothing left to time). ``--engine-cpus`` (default: the first
half of this process's CPUs) pins the engine core's threads (``VLLM_CPU_OMP_THREADS_BIND``); the API process and
both clients run on the rest (``--client-cpus``), the same CPUs for either client. ``--engine-cpus all`` turns
pinning off. Even pinned, a validation checkpoint's decode step (~1 ms on a CPU) is shorter than it takes the
engine core's output thread to get the GIL and its CPU back, so 32 tokens reach the API process in one burst; by
default the benchmark therefore serves a 4-layer Llama of ``--width`` 1024 (random weights, ~5 ms a step here),
where tokens stream as they would from a real model on a GPU. ``--width 0`` serves ``--config``'s validation
checkpoint instead.
"""

from __future__ import annotations

import argparse
import json
import os
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


def bench_config(width: int) -> dict:
    """A Llama of ``width`` (4 layers, 16 heads, GQA 4) whose decode step is long enough to stream on a CPU."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": width,
            "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
            "intermediate_size": 4 * width, "vocab_size": 8192, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}


def cpu_split(engine: str | None, client: str | None) -> tuple[str | None, set[int] | None]:
    """``(VLLM_CPU_OMP_THREADS_BIND, CPUs for the API process and the clients)``, or ``(None, None)`` unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if engine == "all" or len(cpus) < 2:
        return None, None
    engine_cpus = _cpus(engine) if engine else cpus[:len(cpus) // 2]
    client_cpus = _cpus(client) if client else [cpu for cpu in cpus if cpu not in engine_cpus]
    if not client_cpus or set(engine_cpus) & set(client_cpus):
        raise SystemExit("--engine-cpus and --client-cpus must be disjoint and leave the clients a CPU")
    return ",".join(map(str, engine_cpus)), set(client_cpus)


def _cpus(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="llama-3.1-8b.json", help="a catalog config (adaptation/intake/...)")
    parser.add_argument("--vllm-python", help="vLLM's interpreter (default: scripts/vllm-env.sh's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024, help="hidden size of the served 4-layer Llama; 0 serves "
                                                                   "--config's validation checkpoint")
    parser.add_argument("--engine-cpus", help="CPUs of the engine core's threads, e.g. 0 or 0-7, or 'all' for no "
                                              "pinning (default: the first half)")
    parser.add_argument("--client-cpus", help="CPUs of the API process and the clients (default: the others)")
    args = parser.parse_args()
    bind, client_cpus = cpu_split(args.engine_cpus, args.client_cpus)
    python = args.vllm_python or subprocess.run([str(REPO / "scripts" / "vllm-env.sh")], capture_output=True,
                                                text=True, check=True).stdout.strip().splitlines()[-1]
    if args.width:
        config, served = bench_config(args.width), f"a 4-layer Llama of width {args.width}, random weights"
    else:
        config = json.loads((REPO / "adaptation" / "intake" / "catalog" / "configs" / args.config).read_text())
        served = f"the validation checkpoint of {args.config} (reduced, random weights)"
    with tempfile.TemporaryDirectory(prefix="d0-bench-") as work:
        checkpoint = Path(work) / "checkpoint"
        vocab = write_validation_checkpoint(config, checkpoint, reduce=not args.width)["vocab_size"]
        print(f"serving {served}", flush=True)
        port = free_port()
        launch = VllmLauncher.launch(python, checkpoint, {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1,
                                                          "max_model_len": 512, "max_num_seqs": args.concurrency},
                                     port=port, cpu_build=True)
        env = dict(launch.env)
        if bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
            # Inherited by the engine's API process and by vllm bench's process; the engine core re-binds its
            # OpenMP threads to ``bind`` itself.
            os.sched_setaffinity(0, client_cpus)
            print(f"engine core on CPUs {bind}; API process and clients on CPUs "
                  f"{','.join(map(str, sorted(client_cpus)))}", flush=True)
        with EngineServer(launch.command, env=env, port=port, log_path=Path(work) / "engine.log") as server:
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
