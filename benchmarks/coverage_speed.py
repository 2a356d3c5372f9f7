"""Time operator coverage per model on this machine: reduce, build, trace (prefill + decode), classify, smoke and
the torch.compile check, as ``python -m workers.engine coverage`` runs them.

Prints one row per model (by default every config in the catalog, adaptation/intake/catalog/configs) with the
reduced size, the operators traced, each step's wall time, the run's CPU time (user + system, which moves less than
wall time on a shared machine) and the coverage, after one cold run (transformers' lazy imports, first kernel
launches) that is reported on its own line and not in the table. Goal: under 10 s per model.

    python benchmarks/coverage_speed.py [--dtype bf16] [--device cpu] [--no-compile] [CONFIG.json ...]
"""

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.coverage import run_coverage  # noqa: E402

CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
GOAL_S = 10.0


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="config.json files (default: the shipped models)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", help="default: this node's accelerator, else cpu")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile check")
    args = parser.parse_args()
    paths = args.configs or sorted(CONFIGS.glob("*.json"))
    # transformers' deprecation and rope-validation warnings say nothing about speed.
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()

    def measure(path: Path) -> dict:
        return run_coverage(json.loads(path.read_text()), dtype=args.dtype, device=args.device,
                            check_compile=not args.no_compile)

    started = time.perf_counter()
    cold = measure(paths[0])
    print(f"cold run ({paths[0].name}): {time.perf_counter() - started:.2f} s on {cold['device']}")
    header = (f"{'model':<48} {'layers':>7} {'params':>9} {'ops':>4} {'calls':>6} {'reduce':>7} {'build':>6} "
              f"{'trace':>6} {'smoke':>6} {'compile':>8} {'total':>6} {'cpu':>6} {'coverage':>8}")
    print(header)
    print("-" * len(header))
    over = []
    for path in paths:
        cpu_started = cpu_seconds()
        report = measure(path)
        cpu = cpu_seconds() - cpu_started
        timings, reduction = report["timings"], report["reduction"]
        print(f"{path.stem:<48} {reduction['layers']:>3}/{reduction['full_layers']:<3} "
              f"{reduction['parameters'] / 1e6:>8.2f}M {len(report['operators']):>4} "
              f"{report['trace']['operator_calls']:>6} {timings['reduce']:>6.2f}s {timings['build']:>5.2f}s "
              f"{timings['trace']:>5.2f}s {timings.get('smoke', 0):>5.2f}s {timings['compile']:>7.2f}s "
              f"{timings['total']:>5.2f}s {cpu:>5.2f}s {report['coverage']:>8.1%}", flush=True)
        if timings["total"] >= GOAL_S:
            over.append(path.stem)
    print(f"goal < {GOAL_S:.0f} s per model: {'met' if not over else 'NOT met by ' + ', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
