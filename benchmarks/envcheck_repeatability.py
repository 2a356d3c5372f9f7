"""Do env checks repeat? Five (``--checks``) back-to-back env checks of this node through the engine's own path
(``workers.engine.envcheck.env_check``, what the ``envcheck`` verb and the env_check stage run), printing for every
figure each check's value and the max/min ratio across the checks, and each check's own spread (the max/min of the
repetitions its median came from).

Goal: every figure's max/min across the checks at most 1.5x on an idle node. It is
printed, not asserted: on a node other work shares, the figures move with that work, and the within-check spread
shows how much.

    python benchmarks/envcheck_repeatability.py [--checks 5] [--measure-seconds 0.5] [--json out.json]
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.envcheck import env_check  # noqa: E402

GOAL = 1.5


def figures_of(report: dict) -> dict[str, tuple[float, float | None, str]]:
    """Every measured figure of one report: name -> (value, the check's own max/min over its repetitions, unit)."""
    figures = {}
    for device in report["measurements"]["per_device"]:
        label = device["device"]
        for name in ("copy_bandwidth", "host_to_device_bandwidth"):
            if device.get(name):
                figures[f"{label} {name.replace('_', ' ')}"] = (
                    device[name]["bytes_per_s"] / 1e9, (device[name].get("spread") or {}).get("max_over_min"), "GB/s")
        for dtype, result in device.get("matmul", {}).items():
            if result.get("supported"):
                figures[f"{label} {dtype} matmul (n={result.get('n')})"] = (
                    result["flops_per_s"] / 1e9, (result.get("spread") or {}).get("max_over_min"), "GFLOP/s")
    collectives = report["measurements"].get("collectives") or {}
    for name, result in (collectives.get("results") or {}).items():
        if result.get("busbw"):
            figures[f"{collectives.get('backend')} {name} busbw"] = (result["busbw"] / 1e9, None, "GB/s")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=5, help="back-to-back env checks")
    parser.add_argument("--measure-seconds", type=float, default=None,
                        help="timed work per measurement (default: the env check's)")
    parser.add_argument("--json", type=Path, help="also write every check's figures here")
    args = parser.parse_args()
    params = {} if args.measure_seconds is None else {"measure_seconds": args.measure_seconds}
    runs, durations = [], []
    for index in range(args.checks):
        started = time.perf_counter()
        report = env_check(params, lambda fraction, message: None)
        durations.append(time.perf_counter() - started)
        runs.append(figures_of(report))
        print(f"check {index + 1}/{args.checks}: {durations[-1]:.1f} s, verdict {report['verdict']}", flush=True)
    names = list(runs[0])
    print(f"\n{'figure':44} {'unit':8} " + " ".join(f"{'check ' + str(i + 1):>9}" for i in range(len(runs)))
          + f" {'max/min':>8} {'goal':>5}  within-check max/min")
    worst = 1.0
    for name in names:
        values = [run[name][0] for run in runs if name in run]
        ratio = max(values) / min(values) if min(values) > 0 else float("inf")
        worst = max(worst, ratio)
        within = [run[name][1] for run in runs if name in run and run[name][1]]
        within_text = " ".join(f"{value:.2f}" for value in within) if within else "—"
        print(f"{name:44} {runs[0][name][2]:8} " + " ".join(f"{value:9.2f}" for value in values)
              + f" {ratio:8.2f} {'ok' if ratio <= GOAL else 'over':>5}  {within_text}")
    print(f"\nworst max/min across checks: {worst:.2f}x (goal <= {GOAL}x on an idle node); "
          f"checks took {min(durations):.1f}-{max(durations):.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "durations_s": durations}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
