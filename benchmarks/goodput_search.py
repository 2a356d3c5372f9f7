"""d0's goodput search (successive halving over engine configurations, each a bracketing rate search) against the
full grid (every configuration x a fine Poisson rate sweep), on a simulated engine.

Simulated, not measured: each configuration is a ``SimulatedEngine`` (``workers/engine/serving/simulated.py``: a
continuous-batching scheduler in virtual time, a step costing a fixed part plus a part per running request plus a
part per prompt token admitted, lognormal noise per run and per step). The knobs are named as vLLM's, but their
effect is this model's: ``max_num_seqs`` is the batch cap, ``max_num_batched_tokens`` the chunked prefill's token
budget per step (a larger one fills the cache faster, so TTFT is shorter, but its steps are longer, so TPOT is
longer), CUDA graphs (``enforce_eager`` false) shrink the fixed step cost. Serving time is the
simulated duration of every run (first send to last token), so the ratio is what the two would spend serving on
an engine that behaves like the model; engine starts are not counted (both start each configuration once).

Per repetition (its own noise seeds):
1. The grid: every configuration serves the full workload at every rate of a ladder (``LADDER_START`` x 1.1^k up to
   ``LADDER_END`` requests/s); a configuration's goodput is the highest rate meeting the SLOs below the lowest that
   did not (``GoodputSearch.best``, the search's own rule). Also the "stopped ladder": the same ladder stopped at each
   configuration's first failing rate, the cheapest exhaustive sweep that finds the same answers; and a
   GuideLLM-style sweep: a throughput run (every request at once), then ``SWEEP_RATES`` rates evenly spaced up to
   that throughput (GuideLLM's ``sweep`` profile).
2. The search: ``search.successive_halving`` over the configurations, each trial a ``find_goodput`` rate search with
   the rung's requests, from 1 request/s; with ``--confirm-runs N`` (default 2) its finalists (within 10% of each
   other) search N more times, interleaved; the pick is the highest median goodput per device over a
   configuration's full-workload searches.
3. The ratio: the pick's goodput over the best, both read from the truth: the ladder on the model without noise (so
   neither a lucky run of the search nor the grid's own winner's curse decides), and the search's serving seconds
   over the grid's. The grid's own pick (from its noisy pass) and the GuideLLM-style sweep's are read from the
   truth too: what the full grid itself achieves under the same noise.

Goal (issue 29): >= 95% of the grid's best goodput in every repetition at <= 35% of its serving time.

    python benchmarks/goodput_search.py [--repetitions 5] [--requests 200] [--json results.json]
"""

import argparse
import itertools
import json
import statistics
import sys
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.serving.goodput import GoodputSearch, Probe, find_goodput, sweep_point  # noqa: E402
from workers.engine.serving.serve_sweep import EngineConfiguration, engine_space  # noqa: E402
from workers.engine.serving.simulated import SimulatedEngine  # noqa: E402
from workers.engine.sweep.metrics import summarize  # noqa: E402
from workers.engine.sweep.result import ServingTrial  # noqa: E402
from workers.engine.sweep.search import successive_halving  # noqa: E402
from workers.engine.sweep.workload import Workload  # noqa: E402

GRID = {"max_num_seqs": [16, 64, 256], "max_num_batched_tokens": [256, 512, 2048, 8192],
        "enforce_eager": [False, True]}
SLO = {"ttft_p95_ms": 500, "ttft_p99_ms": 1000, "tpot_p95_ms": 40}
LADDER_START, LADDER_END, LADDER_STEP = 0.5, 32.0, 1.1
NOISE = 0.05
SWEEP_RATES = 10
WITHIN, TIME_GOAL = 0.95, 0.35


def engine(settings: dict, noise: float = NOISE) -> SimulatedEngine:
    return SimulatedEngine(max_num_seqs=settings["max_num_seqs"], step_s=0.015 if settings["enforce_eager"] else 0.006,
                           token_s=0.0004, prefill_token_s=0.0001, noise=noise,
                           max_num_batched_tokens=settings["max_num_batched_tokens"])


def configurations() -> list[EngineConfiguration]:
    return [EngineConfiguration(dict(zip(GRID, values, strict=True)), {})
            for values in itertools.product(*GRID.values())]


class Bench:
    def __init__(self, workload: Workload, repetition: int, noise: float = NOISE):
        self.workload, self.repetition, self.noise = workload, repetition, noise
        self.serving_s = 0.0
        self.draws: Counter = Counter()

    def measure(self, settings: dict, workload: Workload):
        def run(rate: float) -> Probe:
            at_rate = Workload.from_dict({**workload.as_dict(), "rate": rate})
            # Every measurement draws its own noise: the same configuration at the same rate searched again (a
            # finalist's confirmation) is another run, as on an engine.
            key = json.dumps([self.repetition, settings, rate, at_rate.requests], sort_keys=True)
            self.draws[key] += 1
            seed = zlib.crc32(f"{key} {self.draws[key]}".encode())
            records = engine(settings, self.noise).serve(at_rate.measured_requests(32000), seed=seed)
            metrics = summarize(records, at_rate.slo)
            self.serving_s += metrics["duration_s"]
            point = sweep_point(rate, "rate", metrics, records, at_rate.requests, metrics["duration_s"])
            return Probe(rate, point["met"], metrics, point)

        return run


def ladder() -> list[float]:
    rates, rate = [], LADDER_START
    while rate <= LADDER_END * 1.0001:
        rates.append(rate)
        rate *= LADDER_STEP
    return rates


def grid(workload: Workload, repetition: int, noise: float = NOISE) -> dict:
    """Each configuration's goodput from the full ladder, and the seconds of the full and the stopped ladder."""
    bench = Bench(workload, repetition, noise)
    goodput, stopped_s = {}, 0.0
    for config in configurations():
        measure = bench.measure(config.settings, workload)
        search = GoodputSearch("rate")
        failed = False
        for rate in ladder():
            probe = measure(rate)
            search.probes.append(probe)
            if not failed:
                stopped_s += probe.point["seconds"]
            failed = failed or not probe.met
        goodput[json.dumps(config.settings, sort_keys=True)] = search.summary(1)["goodput_per_device"]
    return {"goodput": goodput, "seconds": bench.serving_s, "stopped_seconds": stopped_s}


def guidellm_sweep(workload: Workload, repetition: int) -> dict:
    """Per configuration: a throughput run, then evenly spaced rates up to it; the pick and the seconds."""
    bench = Bench(workload, repetition)
    goodput = {}
    for config in configurations():
        at_once = Workload.from_dict({**workload.as_dict(), "arrival": "closed", "rate": None,
                                      "concurrency": workload.requests, "goodput_search": None})
        records = engine(config.settings).serve(at_once.measured_requests(32000), seed=repetition)
        throughput = summarize(records)
        bench.serving_s += throughput["duration_s"]
        measure = bench.measure(config.settings, workload)
        search = GoodputSearch("rate", [measure(throughput["requests_per_s"] * step / SWEEP_RATES)
                                        for step in range(1, SWEEP_RATES + 1)])
        goodput[json.dumps(config.settings, sort_keys=True)] = search.summary(1)["goodput_per_device"]
    return {"pick": max(goodput, key=goodput.get), "seconds": bench.serving_s}


def search(workload: Workload, repetition: int, confirm_runs: int) -> dict:
    bench = Bench(workload, repetition)

    def run_trial(config: EngineConfiguration, trial_workload: Workload) -> dict:
        found = find_goodput(bench.measure(config.settings, trial_workload), trial_workload.rate, "rate",
                             trial_workload.goodput_runs)
        summary = found.summary(1)
        return ServingTrial(settings=config.settings, client={}, status="ok",
                            metrics={**found.shown().metrics,
                                     "goodput_requests_per_s": summary["goodput_requests_per_s"]},
                            workload={"requests": trial_workload.requests, "arrival": "poisson"},
                            goodput=summary).as_dict()

    # With confirm_runs, the halving's finalists (within 10% of each other) search again, interleaved, and the pick
    # is the highest median: one rate search's answer moves with its runs' noise as much as near-tied
    # configurations differ.
    space = replace(engine_space(lambda settings: settings), confirm_finalists=confirm_runs > 0)
    outcome = successive_halving(configurations(), workload, run_trial, lambda fraction, message: None,
                                 space=space, confirm_runs=max(confirm_runs, 1))
    runs: dict[str, list[float]] = {}
    for trial in outcome["trials"]:
        if trial["status"] == "ok" and trial["workload"]["requests"] == workload.requests:
            runs.setdefault(json.dumps(trial["settings"], sort_keys=True), []).append(
                trial["goodput"]["goodput_per_device"])
    pick = max(runs, key=lambda settings: statistics.median(runs[settings]))
    return {"pick": pick, "seconds": bench.serving_s,
            "reported": statistics.median(runs[pick]), "trials_run": outcome["trials_run"],
            "rate_runs": sum(trial["goodput"]["runs"] for trial in outcome["trials"] if trial.get("goodput"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--confirm-runs", type=int, default=2,
                        help="rate searches of the finalists again, the pick their median (0: one search each)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workload = Workload.from_dict({"requests": args.requests, "prompt_len": {"normal": [256, 64]},
                                   "output_len": {"normal": [128, 32]}, "arrival": "poisson", "rate": 1.0,
                                   "slo": SLO, "goodput_search": "rate", "goodput_runs": 8})
    print(f"{len(configurations())} configurations ({', '.join(f'{k} {v}' for k, v in GRID.items())}); "
          f"{args.requests} requests, prompt ~N(256, 64), output ~N(128, 32) tokens, Poisson; SLO {SLO}; "
          f"grid ladder {LADDER_START}..{LADDER_END} req/s x{LADDER_STEP} ({len(ladder())} rates); noise {NOISE}; "
          f"finalists confirmed by {args.confirm_runs} more searches")
    truth = grid(workload, 0, noise=0.0)["goodput"]
    best = max(truth.values())
    print(f"truth (the ladder on the noise-free model): best {best:.3f} req/s per device, "
          f"{max(truth, key=truth.get)}; configurations within 5% of it: "
          f"{sum(value >= 0.95 * best for value in truth.values())} of {len(truth)}")
    print(f"{'rep':>3} {'pick':>72} {'ratio':>6} {'time/grid':>9} {'time/stopped':>12} {'grid pick':>9} "
          f"{'guidellm pick':>13} {'time/guidellm':>13} {'trials':>6} {'rate runs':>9} {'wall s':>6}")
    rows = []
    for repetition in range(args.repetitions):
        started = time.perf_counter()
        noisy = grid(workload, repetition)
        found = search(workload, repetition, args.confirm_runs)
        swept = guidellm_sweep(workload, repetition)
        row = {"repetition": repetition, "truth_best": best, "pick": found["pick"],
               "pick_reported": found["reported"], "ratio": truth[found["pick"]] / best,
               "grid_pick": max(noisy["goodput"], key=noisy["goodput"].get),
               "time_ratio": found["seconds"] / noisy["seconds"],
               "time_ratio_stopped": found["seconds"] / noisy["stopped_seconds"],
               "grid_seconds": noisy["seconds"], "stopped_seconds": noisy["stopped_seconds"],
               "search_seconds": found["seconds"], "trials_run": found["trials_run"],
               "rate_runs": found["rate_runs"], "guidellm_pick": swept["pick"],
               "guidellm_ratio": truth[swept["pick"]] / best, "guidellm_seconds": swept["seconds"],
               "time_ratio_guidellm": found["seconds"] / swept["seconds"]}
        row["grid_ratio"] = truth[row["grid_pick"]] / best
        rows.append(row)
        print(f"{repetition:>3} {found['pick']:>72} {row['ratio']:>6.3f} {row['time_ratio']:>9.3f} "
              f"{row['time_ratio_stopped']:>12.3f} {row['grid_ratio']:>9.3f} {row['guidellm_ratio']:>13.3f} "
              f"{row['time_ratio_guidellm']:>13.3f} {row['trials_run']:>6} {row['rate_runs']:>9} "
              f"{time.perf_counter() - started:>6.1f}", flush=True)
    worst, slowest = min(row["ratio"] for row in rows), max(row["time_ratio"] for row in rows)
    print(f"goodput: worst {worst:.3f}, median {statistics.median(row['ratio'] for row in rows):.3f} of the true "
          f"best ({'met' if worst >= WITHIN else 'missed'}: >= {WITHIN} every time); serving time: at most "
          f"{slowest:.3f} of the grid's ({'met' if slowest <= TIME_GOAL else 'missed'}: <= {TIME_GOAL}), at most "
          f"{max(row['time_ratio_stopped'] for row in rows):.3f} of the stopped ladder's, at most "
          f"{max(row['time_ratio_guidellm'] for row in rows):.3f} of the GuideLLM-style sweep's; the grid's own pick "
          f"worst {min(row['grid_ratio'] for row in rows):.3f}, the GuideLLM-style sweep's worst "
          f"{min(row['guidellm_ratio'] for row in rows):.3f} of the true best")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
