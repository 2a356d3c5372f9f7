"""Time operator coverage per model on this machine: reduce, build, trace (prefill + decode), classify, smoke.

Prints one row per model with the reduced size, the operators traced and the coverage, after one cold run
(transformers' lazy imports, first kernel launches) that is reported on its own line and not in the table.

    python benchmarks/coverage_speed.py [--dtype bf16] [--device cpu] [--compile] [CONFIG.json ...]
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.coverage import run_coverage  # noqa: E402

CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
DEFAULT_MODELS = ["deepseek-v3.json", "qwen3-30b-a3b.json", "llama-4-scout-17b-16e-instruct.partial.json",
                  "llama-4-maverick-17b-128e-instruct.partial.json", "gpt-oss-20b.json", "glm-4.7.json",
                  "mixtral-8x7b-v0.1.json", "llama-3.1-8b.json", "qwen3-0.6b.json", "jamba-v0.1.json"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="config.json files (default: the shipped models)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", help="default: this node's accelerator, else cpu")
    parser.add_argument("--compile", action="store_true", help="include the torch.compile check")
    args = parser.parse_args()
    paths = args.configs or [CONFIGS / name for name in DEFAULT_MODELS]
    # transformers' deprecation and rope-validation warnings say nothing about speed.
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()

    def measure(path: Path) -> dict:
        return run_coverage(json.loads(path.read_text()), dtype=args.dtype, device=args.device,
                            check_compile=args.compile)

    started = time.perf_counter()
    cold = measure(paths[0])
    print(f"cold run ({paths[0].name}): {time.perf_counter() - started:.2f} s on {cold['device']}")
    header = (f"{'model':<48} {'layers':>7} {'params':>9} {'ops':>4} {'calls':>6} {'reduce':>7} {'build':>6} "
              f"{'trace':>6} {'smoke':>6} {'compile':>8} {'total':>6} {'coverage':>8}")
    print(header)
    print("-" * len(header))
    for path in paths:
        report = measure(path)
        timings, reduction = report["timings"], report["reduction"]
        print(f"{path.stem:<48} {reduction['layers']:>3}/{reduction['full_layers']:<3} "
              f"{reduction['parameters'] / 1e6:>8.2f}M {len(report['operators']):>4} "
              f"{report['trace']['operator_calls']:>6} {timings['reduce']:>6.2f}s {timings['build']:>5.2f}s "
              f"{timings['trace']:>5.2f}s {timings.get('smoke', 0):>5.2f}s {timings['compile']:>7.2f}s "
              f"{timings['total']:>5.2f}s {report['coverage']:>8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
