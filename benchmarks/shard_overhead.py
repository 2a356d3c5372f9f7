"""What sharding costs on this machine: one small model of an architecture run unsharded and in each layout.

Prints, per layout, the prefill and mean decode-step time of the slowest rank, the share of that rank's time spent
in collectives, the bytes it passed to them, and the correctness figures. On one CPU host the ranks share cores,
so the times show communication overhead, not a speed-up. Figures are printed, not asserted.

    python benchmarks/shard_overhead.py [--config adaptation/intake/catalog/configs/qwen3-30b-a3b.json] [--dtype fp32]
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.engine.sharding import run_sharded  # noqa: E402  (after the path insert)

LAYOUTS = ({}, {"tp": 2}, {"pp": 2}, {"ep": 2})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path,
                        default=ROOT / "adaptation" / "intake" / "catalog" / "configs" / "qwen3-30b-a3b.json")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--decode-steps", type=int, default=32)
    arguments = parser.parse_args()
    config = json.loads(arguments.config.read_text())
    print(f"{'layout':<8} {'prefill ms':>10} {'decode ms':>10} {'comm %':>7} {'comm KiB':>9} "
          f"{'max abs diff':>13} greedy")
    for layout in LAYOUTS:
        try:
            report = run_sharded(config, dtype=arguments.dtype, decode_steps=arguments.decode_steps, **layout)
        except ValueError as error:  # e.g. ep on a dense architecture
            print(f"{json.dumps(layout) or 'none':<8} skipped: {error}")
            continue
        slowest = max(report["ranks"], key=lambda rank: rank["prefill_s"] + rank["decode_s_per_step"])
        busy = slowest["prefill_s"] + slowest["decode_s_per_step"] * report["decode_steps"]
        name = ",".join(f"{key}{value}" for key, value in layout.items()) or "none"
        print(f"{name:<8} {slowest['prefill_s'] * 1e3:>10.2f} {slowest['decode_s_per_step'] * 1e3:>10.2f} "
              f"{100 * slowest['collectives']['seconds'] / busy:>7.1f} {slowest['collectives']['bytes'] / 1024:>9.1f} "
              f"{report['max_abs_diff']:>13.2e} {report['greedy_match']}")


if __name__ == "__main__":
    main()
