"""What keeping torch and transformers out of the web tier saves, and what it costs an upload.

1. A web process after ``django.setup()`` and importing the URLconf, in fresh subprocesses: wall time, RSS and PSS
   (``/proc/self/smaps_rollup``), as d0 is now next to the same process that also imports torch and transformers
   (what every web worker imported before: the stage registry pulled in torch, an upload transformers).
2. The analysis of an uploaded config: in the web process (before: ``analyze()`` in-process) next to the analysis
   process (now: ``AnalysisProcess``, a child that keeps torch), cold (the first upload of a process: imports, or
   the child's start) and warm (the uploads after it), over a few catalog configs.

Rounds alternate the two variants. Figures are printed, not asserted.

    DATABASE_URL=... python benchmarks/web_without_torch.py [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
WARM_CONFIGS = ("qwen3-0.6b.json", "llama-3.1-8b.json", "deepseek-v3.json", "mixtral-8x7b-v0.1.json")

WEB_PROCESS = r"""
import json, sys, time
started = time.perf_counter()
import django
django.setup()
import d0web.urls  # noqa: F401
if sys.argv[1] == "with-torch":
    import torch, transformers  # noqa: F401
seconds = time.perf_counter() - started
figures = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if "kB" in line}
print(json.dumps({"seconds": seconds, "rss_mib": figures["Rss"] / 1024, "pss_mib": figures["Pss"] / 1024,
                  "torch": "torch" in sys.modules}))
"""

UPLOADS = r"""
import json, sys, time
from pathlib import Path
configs = [json.loads(Path(path).read_text()) for path in sys.argv[2:]]
if sys.argv[1] == "in-process":
    def analyse(config):
        from workers.engine.analysis import analyze
        return analyze(config)
else:
    from workers.engine.analysis.worker import AnalysisProcess
    process = AnalysisProcess()
    def analyse(config):
        return process.analyze(config, timeout_s=300, idle_s=60)
times = []
for config in [configs[0], *configs, *configs]:
    started = time.perf_counter()
    analyse(config)
    times.append(time.perf_counter() - started)
print(json.dumps({"cold": times[0], "warm": times[1:]}))
"""


def child(code: str, *args: str) -> dict:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "d0web.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=environment, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds

    web: dict[str, list[dict]] = {"without-torch": [], "with-torch": []}
    uploads: dict[str, list[dict]] = {"in-process": [], "analysis-process": []}
    paths = [str(CONFIGS / name) for name in WARM_CONFIGS]
    for _ in range(rounds):
        for variant in web:
            web[variant].append(child(WEB_PROCESS, variant))
        for variant in uploads:
            uploads[variant].append(child(UPLOADS, variant, *paths))

    print("web process after django.setup() + URLconf (median of", rounds, "fresh processes)")
    for variant, runs in web.items():
        assert all(run["torch"] == (variant == "with-torch") for run in runs)
        print(f"  {variant:14} {statistics.median(run['seconds'] for run in runs):6.2f} s  "
              f"RSS {statistics.median(run['rss_mib'] for run in runs):6.1f} MiB  "
              f"PSS {statistics.median(run['pss_mib'] for run in runs):6.1f} MiB")
    print("analysis of an uploaded config (first of a process; then the median over", len(WARM_CONFIGS),
          "configs x 2, per process)")
    for variant, runs in uploads.items():
        cold = statistics.median(run["cold"] for run in runs)
        warm = statistics.median(statistics.median(run["warm"]) for run in runs)
        print(f"  {variant:17} first {cold:6.2f} s   next {warm * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
