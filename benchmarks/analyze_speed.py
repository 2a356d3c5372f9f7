"""Whole-command time of analysing a >= 1T-parameter config (Kimi-K2): ``python -m workers.engine analyze CONFIG
--json`` next to accelerate's whole command, a script that builds the model on the meta device
(``with init_empty_weights(): AutoModelForCausalLM.from_config(config)``) and counts its parameters.

Each command runs in a fresh subprocess and is timed from start to exit, so the interpreter's start, every import
and the exit are counted: what an operator waits for. The two run interleaved (d0, accelerate, d0, ...) for several
rounds, so load spikes and disk-cache warm-up hit both alike, and each round gives a ratio d0 / accelerate; the
median of those ratios is the figure, and the ratio of CPU seconds (user + system, from ``wait4``) is printed next
to it because it moves less than wall time when the machine is shared. Peak RSS is each child's ``ru_maxrss``.
accelerate gets the config already resolved to DeepseekV3Config: without d0 it would need ``trust_remote_code`` to
read a ``kimi_k2`` config at all. Goal: d0 <= 0.6x accelerate. Figures are printed, not asserted.

    python benchmarks/analyze_speed.py [--config adaptation/intake/catalog/configs/kimi-k2-instruct.json] [--rounds 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "adaptation" / "intake" / "catalog" / "configs" / "kimi-k2-instruct.json"
GOAL = 0.6

# accelerate's whole command, written as a user would: read the config, build on the meta device, count, exit.
ACCELERATE = r"""
import json, sys
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

raw = json.load(open(sys.argv[1]))
kwargs = {key: value for key, value in raw.items() if key not in ("model_type", "auto_map", "quantization_config")}
config = AutoConfig.for_model("deepseek_v3", **kwargs)
with init_empty_weights():
    model = AutoModelForCausalLM.from_config(config)
print(json.dumps({"params": sum(parameter.numel() for parameter in model.parameters())}))
"""


def commands(config: Path) -> dict[str, list[str]]:
    return {"d0": [sys.executable, "-m", "workers.engine", "analyze", str(config), "--json"],
            "accelerate": [sys.executable, "-c", ACCELERATE, str(config)]}


def timed(command: list[str]) -> dict:
    """Wall seconds, CPU seconds and peak RSS of one whole command, and the parameter count it printed."""
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{command[:4]} exited with {child.returncode}")
    report = json.loads(output)
    params = report.get("params", report.get("total_params"))
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "params": params}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median ratio)")
    args = parser.parse_args()
    config = args.config.resolve()
    runs: dict[str, list[dict]] = {"d0": [], "accelerate": []}
    timed(commands(config)["d0"])  # one unrecorded run of each first, so both find the same warm disk cache
    timed(commands(config)["accelerate"])
    for _ in range(args.rounds):
        for name, command in commands(config).items():
            runs[name].append(timed(command))
    rounds = list(zip(runs["d0"], runs["accelerate"], strict=True))
    wall_ratios = [ours["wall_s"] / theirs["wall_s"] for ours, theirs in rounds]
    cpu_ratios = [ours["cpu_s"] / theirs["cpu_s"] for ours, theirs in rounds]
    print(f"config: {args.config.name}, {args.rounds} interleaved rounds of whole commands (start, imports, work, "
          f"exit), medians")
    print(f"{'command':12} {'params':>18} {'wall s':>8} {'cpu s':>8} {'peak RSS MiB':>13}")
    for name, name_runs in runs.items():
        print(f"{name:12} {name_runs[0]['params']:>18,} {statistics.median(r['wall_s'] for r in name_runs):>8.2f} "
              f"{statistics.median(r['cpu_s'] for r in name_runs):>8.2f} "
              f"{statistics.median(r['peak_rss_bytes'] for r in name_runs) / 2**20:>13.1f}")
    wall, cpu = statistics.median(wall_ratios), statistics.median(cpu_ratios)
    print(f"d0 / accelerate, per round: wall {', '.join(f'{r:.2f}' for r in wall_ratios)}; "
          f"cpu {', '.join(f'{r:.2f}' for r in cpu_ratios)}")
    print(f"median d0 / accelerate: wall x{wall:.2f}, cpu x{cpu:.2f} (goal <= {GOAL}x: "
          f"{'met' if wall <= GOAL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
