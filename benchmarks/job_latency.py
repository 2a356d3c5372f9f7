"""Submit-to-succeeded latency of an env_probe job: the zero-setup broker (the embedded Valkey server on a unix
socket under var/) against a Redis server over TCP.

Runs `manage.py up` twice in fresh var/ folders (SQLite both times, so only the broker differs), submits jobs
one after another over HTTP and prints the latency percentiles and their ratio to the Redis run.

    python benchmarks/job_latency.py [--jobs 10] [--redis redis://127.0.0.1:6379/14]
"""

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import Processes, wait_for  # noqa: E402
from tests.test_zero_setup import call, free_port, quietly  # noqa: E402


def measure(broker_url: str | None, jobs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp) / "var"
        env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
        env.update(D0_VAR_DIR=str(var))
        if broker_url:
            env["D0_BROKER_URL"] = broker_url
        base = f"http://127.0.0.1:{free_port()}"
        processes = Processes(Path(tmp))
        up = processes.start("up", [sys.executable, "manage.py", "up", "--bind", base[7:], "--web-workers", "1"], env)
        try:
            wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
            username, password = (var / "demo-credentials.txt").read_text().split()
            form = f"username={username}&password={password}".encode()
            with urllib.request.urlopen(urllib.request.Request(f"{base}/api/token/", data=form)) as response:
                token = json.load(response)["token"]
            wait_for(quietly(lambda: all(call(f"{base}/api/status/", token=token)["workers"].values())), 120,
                     "d0's workers to come up")
            cluster = call(f"{base}/api/clusters/", token=token)["results"][0]["id"]
            latencies = []
            for _ in range(jobs + 1):  # the first job warms the worker processes up and is not counted
                started = time.perf_counter()
                job = call(f"{base}/api/jobs/", {"cluster": cluster, "stages": ["env_probe"]}, token=token)
                url = f"{base}/api/jobs/{job['id']}/"
                wait_for(lambda url=url: call(url, token=token)["status"] == "succeeded", 60, "the job", interval=0.02)
                latencies.append(time.perf_counter() - started)
            return latencies[1:]
        finally:
            os.kill(up.pid, signal.SIGTERM)
            up.wait(timeout=30)


def summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {"p50": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "mean": statistics.fmean(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    baseline = summary(measure(args.redis, args.jobs))
    zero_setup = summary(measure(None, args.jobs))
    print(f"{'broker':<12}{'p50 s':>8}{'p90 s':>8}{'mean s':>8}{'p50 vs redis':>14}")
    for name, figures in (("redis", baseline), ("embedded", zero_setup)):
        print(f"{name:<12}{figures['p50']:>8.3f}{figures['p90']:>8.3f}{figures['mean']:>8.3f}"
              f"{figures['p50'] / baseline['p50']:>13.2f}x")


if __name__ == "__main__":
    main()
