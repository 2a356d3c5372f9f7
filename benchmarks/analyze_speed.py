"""Wall time and peak memory of analysing a >= 1T-parameter config (Kimi-K2): d0's ``analyze()`` next to
accelerate's approach (``with init_empty_weights(): AutoModelForCausalLM.from_config(config)``), measured in the
same run, each method in fresh subprocesses.

Each child imports torch and transformers first (not counted), then times the method twice: "cold" is the first
call, which also imports the architecture's modeling module, "warm" a second call in the same process. Memory is
the peak RSS growth over the post-import baseline (ru_maxrss). accelerate gets the config already resolved to
DeepseekV3Config: without d0 it would need ``trust_remote_code`` to read a ``kimi_k2`` config at all.
Target for d0: under 5 s and 1 GiB. Figures are printed, not asserted.

    python benchmarks/analyze_speed.py [--config adaptation/intake/catalog/configs/kimi-k2-instruct.json] [--repeat 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "adaptation" / "intake" / "catalog" / "configs" / "kimi-k2-instruct.json"

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
method, path = sys.argv[1], sys.argv[2]
import psutil, torch, transformers  # the baseline: both methods need these imported

baseline = psutil.Process().memory_info().rss


def d0_analyze():
    from workers.engine.analysis import analyze, load_config_file

    return analyze(load_config_file(path))["total_params"]


def d0_analyze_and_plan():
    from workers.engine.analysis import analyze, load_config_file

    cluster = {"devices_per_node": 8, "nodes": 2, "device_memory_bytes": 141 * 10**9, "device_name": "H200"}
    return analyze(load_config_file(path), devices=cluster, precision="fp8")["total_params"]


def accelerate_empty_weights():
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.load(open(path))
    kwargs = {key: value for key, value in raw.items() if key not in ("model_type", "auto_map", "quantization_config")}
    config = AutoConfig.for_model("deepseek_v3", **kwargs)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())


run = globals()[method]
timings = []
for _ in range(2):
    started = time.perf_counter()
    params = run()
    timings.append(time.perf_counter() - started)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports kilobytes
print(json.dumps({"params": params, "cold_s": timings[0], "warm_s": timings[1], "peak_growth_bytes": peak - baseline}))
"""

METHODS = {
    "d0_analyze": "d0 analyze()",
    "d0_analyze_and_plan": "d0 analyze() + plan, 2x8 H200, fp8",
    "accelerate_empty_weights": "accelerate init_empty_weights + from_config",
}


def run_child(method: str, config: Path) -> dict:
    child = subprocess.run([sys.executable, "-c", CHILD, method, str(config), str(ROOT)], capture_output=True,
                           text=True, timeout=600, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    return {"params": runs[0]["params"],
            "cold_s": statistics.median(run["cold_s"] for run in runs),
            "warm_s": statistics.median(run["warm_s"] for run in runs),
            "peak_growth_bytes": max(run["peak_growth_bytes"] for run in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeat", type=int, default=3, help="fresh subprocesses per method (median time)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {method: [] for method in METHODS}
    for _ in range(args.repeat):  # round-robin, so disk-cache warm-up and load spikes hit every method alike
        for method in METHODS:
            runs[method].append(run_child(method, args.config))
    results = {method: summary(method_runs) for method, method_runs in runs.items()}
    print(f"config: {args.config.name}, {args.repeat} subprocesses per method, median wall time, max peak RSS growth")
    print(f"{'method':46} {'params':>16} {'cold s':>8} {'warm s':>8} {'peak MiB':>9}")
    for method, label in METHODS.items():
        result = results[method]
        print(f"{label:46} {result['params']:>16,} {result['cold_s']:>8.2f} {result['warm_s']:>8.3f} "
              f"{result['peak_growth_bytes'] / 2**20:>9.1f}")
    ours, theirs = results["d0_analyze"], results["accelerate_empty_weights"]
    print(f"accelerate / d0: cold time x{theirs['cold_s'] / ours['cold_s']:.2f}, warm time "
          f"x{theirs['warm_s'] / ours['warm_s']:.2f}, peak memory x"
          f"{theirs['peak_growth_bytes'] / max(ours['peak_growth_bytes'], 1):.2f}")
    target = ours["cold_s"] < 5 and ours["peak_growth_bytes"] < 2**30
    print(f"d0 target (< 5 s, < 1 GiB): {'met' if target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
