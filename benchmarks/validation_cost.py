"""What validation adds to a serve sweep: the time of the checks against the reference (transformers in float32:
its answers, then each engine start's parity and answers, alone and batched) and of the accuracy gate (lm-eval
against the served endpoint for each numerics, and against the reference once), set against the sweep's serving
time and its engine starts.

Measured, on this node: d0's demo model (SmolLM2-135M-Instruct, real weights) served by vLLM's CPU build
(``.venv-vllm``), one serve sweep per round over ``--dtypes`` x ``--variants`` (an engine start each, each
configuration's workload served 3 times within its start, as every sweep does), with the gate on. Each numerics'
row (throughput, memory, accuracy, recovery, verdict) is printed too: the quality-against-speed table. The figures
come from the stage's own timings (``quality.entries[].seconds``, ``quality.reference.seconds`` and
``accuracy_seconds``, ``search.seconds``, the trials' ``startup_s`` and durations), so they are what a team's report
shows.

    python benchmarks/validation_cost.py [--rounds 2] [--dtypes bfloat16] [--variants as_shipped,w8a8-int8,w4a16]
        [--json out.json]
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.engine.demo_model import demo_checkpoint  # noqa: E402
from workers.engine.serving.stage import serve_sweep  # noqa: E402

ENGINE = {"enforce_eager": True, "max_num_seqs": 4, "block_size": 64}
WORKLOAD = {"requests": 16, "prompt_len": 64, "output_len": 32, "warmup_requests": 2}


def one_round(checkpoint: Path, dtypes: list[str], variants: list[str]) -> dict:
    config = json.loads((checkpoint / "config.json").read_text())
    result = serve_sweep({"config": config, "weights_path": str(checkpoint), "settings": ENGINE,
                          "grid": {"dtype": dtypes}, "variants": variants, "workload": WORKLOAD,
                          "startup_timeout_s": 900},
                         lambda fraction, message: print(f"  {fraction:4.0%} {message}", file=sys.stderr))
    quality = result["quality"]
    reference = quality["reference"]
    trials = [trial for trial in result["trials"] if trial.get("metrics")]
    serving = sum(trial["metrics"].get("duration_s") or 0 for trial in trials)
    starts = sum(trial.get("startup_s") or 0 for trial in {trial["command"]: trial for trial in trials}.values())
    checks = sum(entry["seconds"]["correctness"] for entry in quality["entries"])
    served_evals = sum(entry["seconds"].get("accuracy", 0) for entry in quality["entries"])
    return {"sweep_s": result["seconds"], "search_s": result["search"]["seconds"], "serving_s": serving,
            "engine_starts_s": starts, "engine_starts": result["engine_starts"],
            "reference_answers_s": reference["seconds"], "checks_s": checks,
            "served_evaluation_s": served_evals, "reference_evaluation_s": reference["accuracy_seconds"],
            "items": reference["accuracy"].get("n"),
            "accuracy": {entry["label"]: (entry.get("accuracy") or {}).get("accuracy")
                         for entry in quality["entries"]},
            "reference_accuracy": reference["accuracy"].get("accuracy"),
            "variants_made_s": sum((row.get("variant") or {}).get("seconds") or 0 for row in quality["entries"]),
            "rows": result["variants"], "recipe": result["recipe"]["settings"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--variants", default="as_shipped,w8a8-int8,w4a16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not os.environ.get("D0_ENGINES"):
        os.environ["D0_ENGINES"] = f"vllm={ROOT / '.venv-vllm' / 'bin' / 'python'}"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    checkpoint = demo_checkpoint()
    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}", file=sys.stderr)
        rounds.append(one_round(checkpoint, args.dtypes.split(","), args.variants.split(",")))

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    validation = median("reference_answers_s") + median("checks_s") + median("served_evaluation_s") \
        + median("reference_evaluation_s")
    print(f"model: SmolLM2-135M-Instruct (real weights), vLLM CPU build, {rounds[0]['engine_starts']} engine starts "
          f"per sweep ({args.dtypes} x {args.variants}), {WORKLOAD['requests']} requests x 3 runs per configuration, "
          f"{rounds[0]['items']} lm-eval items; median of {len(rounds)} rounds")
    for key, label in (("sweep_s", "whole stage"), ("engine_starts_s", "engine starts"),
                       ("serving_s", "serving the workloads"),
                       ("reference_answers_s", "reference answers (transformers fp32, once)"),
                       ("checks_s", "parity + answers, every numerics"),
                       ("served_evaluation_s", "lm-eval against the endpoint, every numerics"),
                       ("reference_evaluation_s", "lm-eval on the reference (once)")):
        print(f"  {label:48s} {median(key):8.1f} s")
    print(f"  validation (the four rows above)                 {validation:8.1f} s = "
          f"{validation / median('sweep_s'):.0%} of the stage, {validation / median('serving_s'):.1f}x its serving")
    print(f"  variants made (quantization, once per node and checkpoint) {median('variants_made_s'):8.1f} s")
    print(f"reference accuracy {rounds[0]['reference_accuracy']:.3f}; per numerics (round 1), recipe "
          f"{rounds[0]['recipe']}:")
    for row in rounds[0]["rows"]:
        recovery = (row.get("recovery") or {}).get("accuracy_pct")
        print(f"  {row['label']:32s} {row['output_tokens_per_s'] or 0:7.1f} tok/s  "
              f"{(row['peak_memory_bytes'] or 0) / 2**20:7.0f} MiB peak  "
              f"{(row['disk_bytes'] or 0) / 2**20:5.0f} MiB disk  "
              f"acc {row['accuracy'] if row['accuracy'] is not None else float('nan'):.3f}  "
              f"recovery {recovery if recovery is not None else float('nan'):5.1f}%  "
              f"ppl {row['word_perplexity'] or float('nan'):6.2f}  top-1 {row['top1_agreement'] or 0:.3f}  "
              f"{row['verdict']}")
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=2))


if __name__ == "__main__":
    main()
