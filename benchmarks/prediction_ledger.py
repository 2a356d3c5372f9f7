"""The prediction ledger's error on this machine's vLLM trials, before and after calibration, on held-out trials.

1. The node's figures, measured as the env check measures them (``roofline.hardware_figures``: a copy past the
   caches, a bf16 matmul; the median of repeated timings).
2. A serve sweep's trials on vLLM (the engine at ``D0_ENGINES``, else ``.venv-vllm``): SmolLM2-135M's architecture
   from the catalog (random bf16 weights, the whole model, not reduced) under ``--grid``, each configuration served
   three times within its engine start, as the serve sweep serves them (``serve_sweep.run_search``); each trial gets
   d0's prediction as the sweep gives it (``serve_sweep.predict_trials``: the roofline of the served checkpoint).
3. The trials split in two halves: within each configuration its runs alternate between the halves (so that both
   see every configuration). The calibration is fitted on the first half (``ledger.fit_calibration``: a line,
   fixed cost + slope x roofline, for the time metrics whose trials spread; the median ratio otherwise) and the
   error measured on the second, held out: the roofline's error (before) and the calibrated prediction's (after).

Printed per metric: the median and P90 of the relative error before and after. Goal after: median <= 10% and
P90 <= 20% on output tok/s and TPOT; printed, not asserted (a shared machine can land either side). Printed with
it, the noise floor: how far a run is from the median of its own configuration's runs (the same configuration,
served three times in one engine start): no predictor of a configuration can be closer than its runs are to each
other.

    python benchmarks/prediction_ledger.py [--grid '{"max_num_seqs": [4, 8], "concurrency": [1, 2, 4, 8]}']
                                           [--json results.json]
    python benchmarks/prediction_ledger.py --replay results.json   # no engine: the stored run's trials refitted
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.serving import ledger  # noqa: E402
from workers.engine.serving.checkpoint import write_validation_checkpoint  # noqa: E402
from workers.engine.serving.engines import configured_engines  # noqa: E402
from workers.engine.serving.serve_sweep import Session, engine_configurations, predict_trials, run_search  # noqa: E402
from workers.engine.sweep.metrics import percentile  # noqa: E402
from workers.engine.sweep.roofline import hardware_figures  # noqa: E402
from workers.engine.sweep.workload import Workload  # noqa: E402

CONFIG = ROOT / "adaptation" / "intake" / "catalog" / "configs" / "smollm2-135m-instruct.json"
# Eager mode: torch.compile takes each engine start 3+ minutes on 2 shared cores, which would leave the benchmark
# no time for trials; eager steps are slower, which the calibration is there to learn.
GRID = {"max_num_seqs": [4, 8], "concurrency": [1, 2, 4, 8], "enforce_eager": [True]}
WORKLOAD = {"requests": 8, "prompt_len": 64, "output_len": 32}
GOAL = {"output_tokens_per_s": (0.10, 0.20), "tpot_s": (0.10, 0.20)}


def halves(trials: list[dict]) -> tuple[list[dict], list[dict]]:
    """(calibration half, held-out half): each configuration's runs alternate, starting on a side that alternates
    from one configuration to the next."""
    by_configuration: dict[str, list[dict]] = {}
    for trial in sorted(trials, key=lambda trial: trial["id"]):
        key = json.dumps({"settings": trial["settings"], "client": trial["client"]}, sort_keys=True)
        by_configuration.setdefault(key, []).append(trial)
    first, second = [], []
    for index, runs in enumerate(by_configuration.values()):
        for position, trial in enumerate(runs):
            (first if (position + index) % 2 == 0 else second).append(trial)
    return first, second


def noise_floor(trials: list[dict]) -> dict:
    """Per metric, the median and P90 over runs of |run - its configuration's median| / run."""
    by_configuration: dict[str, list[dict]] = {}
    for trial in trials:
        key = json.dumps({"settings": trial["settings"], "client": trial["client"]}, sort_keys=True)
        by_configuration.setdefault(key, []).append(ledger.measured_figures(trial["metrics"]))
    deviations: dict[str, list[float]] = {}
    for runs in by_configuration.values():
        for metric in ledger.METRICS:
            values = [run[metric] for run in runs if run[metric]]
            if len(values) > 1:
                middle = statistics.median(values)
                deviations.setdefault(metric, []).extend(abs(value - middle) / value for value in values)
    return {metric: {"median": statistics.median(values), "p90": percentile(values, ledger.TAIL_PERCENTILE)}
            for metric, values in deviations.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=json.loads, default=GRID)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--replay", type=Path, help="a --json file of an earlier run: its trials' stored rooflines "
                                                    "and measurements refitted by today's calibration, no engine run")
    args = parser.parse_args()
    if args.replay:
        stored = json.loads(args.replay.read_text())
        # Runs stored before the engine was recorded beside the trials were all of vLLM.
        described = stored.get("engine") or {"name": "vllm"}
        served = [trial for trial in stored["trials"] if trial["status"] == "ok"]
        calibration_half, held_out = halves(served)
        fitted = ledger.fit_calibration(ledger.rows_of({"engine": described, "trials": calibration_half}), "vllm")
        for trial in held_out:
            # The roofline does not depend on the calibration: the stored one is predicted again with today's fit.
            predicted, basis = ledger.calibrated(trial["prediction"]["roofline"], fitted,
                                                 trial["prediction"].get("concurrency"))
            trial["prediction"] = {**trial["prediction"], "predicted": predicted, "basis": basis,
                                   "calibration": fitted}
        print(f"replayed {args.replay}: {len(served)} trials served: calibrated on {len(calibration_half)}, error "
              f"measured on the other {len(held_out)} (held out)")
        report(described, served, held_out, fitted)
        return
    if not os.environ.get("D0_ENGINES"):
        os.environ["D0_ENGINES"] = f"vllm={ROOT / '.venv-vllm' / 'bin' / 'python'}"
    import torch

    started = time.perf_counter()
    figures = hardware_figures(None, torch.device("cpu"), ["bf16"])
    hardware = {"memory_bandwidth_bytes_per_s": figures["memory_bandwidth_bytes_per_s"],
                "flops_per_s": {"bf16": figures["flops_per_s"]["bf16"]}}
    print(f"node figures (measured as the env check does): {hardware['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"{hardware['flops_per_s']['bf16'] / 1e9:.1f} GFLOP/s bf16", file=sys.stderr)
    engine = configured_engines()["vllm"]
    described = engine.probe()
    if not described["usable"]:
        sys.exit(f"vLLM at {engine.python} is unusable: {described['reason']}")
    workload = Workload.from_dict(WORKLOAD)
    with tempfile.TemporaryDirectory(prefix="d0-ledger-") as work:
        work = Path(work)
        checkpoint = work / "checkpoint"
        write_validation_checkpoint(json.loads(CONFIG.read_text()), checkpoint, reduce=False)
        session = Session(engine, described, checkpoint, work / "logs",
                          max_model_len=max(256, workload.max_sequence_tokens() + 16))
        groups = engine_configurations({}, args.grid)
        trials, search = run_search(session, groups, workload, {"search": "grid", "startup_timeout_s": 600},
                                    lambda fraction, message: print(f"{fraction:4.0%} {message}", file=sys.stderr))
        served = [trial for trial in trials if trial["status"] == "ok"]
        calibration_half, held_out = halves(served)
        # The first half is predicted as a cluster with no history is; the second with the first half's fit.
        predict_trials(session, calibration_half, workload, hardware, None)
        fitted = ledger.fit_calibration(ledger.rows_of({"engine": described, "trials": calibration_half}), "vllm")
        predict_trials(session, held_out, workload, hardware, fitted)
    print(f"vLLM {described.get('version')} ({'CPU build' if described.get('cpu_build') else 'GPU'}), SmolLM2-135M "
          f"architecture (random bf16 weights), grid {json.dumps(args.grid)}, {WORKLOAD['requests']} requests of "
          f"{WORKLOAD['prompt_len']} + {WORKLOAD['output_len']} tokens; {len(served)} trials served: calibrated on "
          f"{len(calibration_half)}, error measured on the other {len(held_out)} (held out); "
          f"{time.perf_counter() - started:.0f} s")
    results = report(described, served, held_out, fitted)
    if args.json:
        args.json.write_text(json.dumps({"engine": described, "hardware": hardware, "calibration": fitted,
                                         "results": results, "search": search, "trials": trials}, indent=2,
                                        default=str))


def report(described: dict, served: list[dict], held_out: list[dict], fitted: dict | None) -> dict:
    """Prints the fit and, per metric, the error before and after calibration on the held-out trials beside the
    noise floor; returns the figures printed."""
    rows = ledger.rows_of({"engine": described, "trials": held_out})
    before = {row["metric"]: row for row in ledger.error_table(rows, "roofline")}
    after = {row["metric"]: row for row in ledger.error_table(rows, "predicted")}
    print("calibration: " + "; ".join(f"{shown['label']} {shown['fit']}"
                                      for shown in (ledger.describe_fits(fitted) if fitted else [])))
    floor = noise_floor(served)
    print(f"{'metric':22s} {'before: median':>15s} {'P90':>8s} {'after: median':>15s} {'P90':>8s}  "
          f"{'noise floor: median':>20s} {'P90':>8s}  goal")
    results = {}
    for metric, label in ledger.METRICS.items():
        if metric not in after:
            continue
        goal = GOAL.get(metric)
        met = goal and after[metric]["median"] <= goal[0] and after[metric]["p90"] <= goal[1]
        verdict = ("met" if met else "NOT met") if goal else "-"
        noise = floor.get(metric, {"median": float("nan"), "p90": float("nan")})
        print(f"{label:22s} {before[metric]['median']:15.1%} {before[metric]['p90']:8.1%} "
              f"{after[metric]['median']:15.1%} {after[metric]['p90']:8.1%}  {noise['median']:20.1%} "
              f"{noise['p90']:8.1%}  {verdict}")
        results[metric] = {"before": before[metric], "after": after[metric], "noise_floor": noise,
                           "goal_met": met if goal else None}
    return results


if __name__ == "__main__":
    main()
