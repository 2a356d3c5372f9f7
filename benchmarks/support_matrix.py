"""Which stage works on which architecture: every catalog config through analyze, coverage, sharded runs (tp2, pp2,
and ep2 where the model has experts) and a two-trial sweep, each as the node operators' command
(``python -m workers.engine <verb> --json``) in a process of its own, with its wall time and peak memory.

    python benchmarks/support_matrix.py [--only deepseek-v3 kimi-k2-instruct] [--stages analyze,shard]
                                        [--timeout 180] [--out docs/support-matrix.md]

A cell is ``ok`` when the command exited 0 and its report says it worked (a sharded run matched the reference, a
sweep completed a trial), else the one-line reason. A command above ``--rss-limit-gib`` is killed and so marked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
STAGES = ("analyze", "coverage", "shard-tp2", "shard-pp2", "shard-ep2", "sweep")


@dataclass
class Cell:
    ok: bool
    reason: str
    seconds: float
    peak_rss_bytes: int

    def text(self) -> str:
        if self.ok:
            return f"ok ({self.seconds:.0f} s, {self.peak_rss_bytes / 2**30:.1f} GiB)"
        return f"{self.reason[:110]} ({self.seconds:.0f} s)"


def has_experts(config: dict) -> bool:
    scopes = [config, config.get("text_config") or {}, config.get("ffn_config") or {}]
    return any(isinstance(scope.get(key), int) and scope[key] > 1 for scope in scopes for key in EXPERT_KEYS)


def command(stage: str, path: Path) -> list[str]:
    engine = [sys.executable, "-m", "workers.engine"]
    if stage == "analyze":
        return [*engine, "analyze", str(path), "--json"]
    if stage == "coverage":
        return [*engine, "coverage", str(path), "--json", "--no-compile", "--decode-steps", "1"]
    if stage.startswith("shard-"):
        axis = stage.removeprefix("shard-")[:2]
        return [*engine, "shard", str(path), f"--{axis}", "2", "--decode-steps", "4", "--device", "cpu", "--json",
                *(["--tp", "2"] if axis == "ep" else [])]
    return [*engine, "sweep", str(path), "--json", "--batch-sizes", "1,2", "--requests", "2", "--prompt-len", "8",
            "--output-len", "4", "--precisions", "fp32"]


def verdict(stage: str, report: dict) -> tuple[bool, str]:
    if stage.startswith("shard-"):
        if report.get("error"):
            return False, report["error"].splitlines()[0]
        return bool(report.get("correct")), "" if report.get("correct") else "does not match the reference"
    if stage == "sweep":
        if report.get("best"):
            return True, ""
        reasons = sorted({(trial.get("reason") or trial.get("status") or "?").splitlines()[0]
                          for trial in report.get("trials", [])})
        return False, "no trial completed: " + "; ".join(reasons)
    if stage == "coverage" and (report.get("trace") or {}).get("error"):
        return False, f"trace stopped: {report['trace']['error'].splitlines()[0]}"
    return True, ""


def run(stage: str, path: Path, timeout: float, rss_limit: int) -> Cell:
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command(stage, path), cwd=ROOT, stdout=out, stderr=err)
        peak, killed = 0, ""
        while process.poll() is None:
            try:
                tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
                peak = max(peak, max(member.memory_info().rss for member in tree))
            except psutil.Error:
                pass
            if peak > rss_limit:
                killed = f"killed above {rss_limit / 2**30:.0f} GiB RSS"
            elif time.monotonic() - started > timeout:
                killed = f"killed after {timeout:.0f} s"
            if killed:
                for member in psutil.Process(process.pid).children(recursive=True):
                    member.kill()
                process.kill()
                break
            time.sleep(0.2)
        process.wait()
        seconds = time.monotonic() - started
        if killed:
            return Cell(False, killed, seconds, peak)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if process.returncode != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("error:") or "Error" in line), None)
        return Cell(False, reason or (lines[-1] if lines else f"exit code {process.returncode}"), seconds, peak)
    try:
        ok, reason = verdict(stage, json.loads(stdout))
    except ValueError:
        ok, reason = False, "the command printed no JSON report"
    return Cell(ok, reason, seconds, peak)


def merged(path: Path, rows: list[tuple[str, dict]], stages: list[str]) -> list[tuple[str, dict]]:
    """The table already in ``path`` with this run's rows in place of theirs, in config order."""
    fresh = dict(rows)
    kept = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == len(stages) + 1 and cells[0] not in ("config", "---"):
            kept[cells[0]] = dict(zip(stages, cells[1:], strict=True))
    kept.update(fresh)
    return sorted(kept.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="catalog slugs (default: every config of the catalog)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per command")
    parser.add_argument("--rss-limit-gib", type=float, default=8.0, help="a command above this RSS is killed")
    parser.add_argument("--out", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--merge", action="store_true",
                        help="with --out: keep the rows of configs not run this time from the file already there")
    args = parser.parse_args()
    stages = [stage for stage in args.stages.split(",") if stage]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages: {', '.join(sorted(unknown))}")
    paths = sorted(CONFIGS.glob("*.json"))
    if args.only:
        paths = [path for path in paths if path.stem in args.only]
    rows = []
    for path in paths:
        config = json.loads(path.read_text(), parse_constant=str)
        cells = {}
        for stage in stages:
            if stage == "shard-ep2" and not has_experts(config):
                cells[stage] = "— (no experts)"
                continue
            cell = run(stage, path, args.timeout, int(args.rss_limit_gib * 2**30))
            cells[stage] = cell.text()
            print(f"{path.stem:48} {stage:10} {cell.text()}", flush=True)
        rows.append((path.stem, cells))
    if args.merge and args.out and args.out.exists():
        rows = merged(args.out, rows, stages)
    table = ["| config | " + " | ".join(stages) + " |", "|" + " --- |" * (len(stages) + 1)]
    table += [f"| {name} | " + " | ".join(cells[stage].replace("|", "/") for stage in stages) + " |"
              for name, cells in rows]
    ok = sum(text.startswith("ok") for _, cells in rows for text in cells.values())
    total = sum(not text.startswith("—") for _, cells in rows for text in cells.values())
    summary = f"{ok} of {total} cells ok on {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print("\n".join(table))
    print(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# Support matrix\n\n`python benchmarks/support_matrix.py`: {summary}.\n\n"
                            + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
