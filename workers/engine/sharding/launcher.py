"""Start this node's ranks as subprocesses (torchrun-style env://) and wait for them with a deadline.

Ranks are started with ``subprocess``, not multiprocessing: a Celery prefork child is daemonic and may not fork
children through multiprocessing. Each rank gets its own session (process group), so ending the run kills the
whole group and nothing outlives it; each rank also exits when its launcher dies (see rank_main).

One node: all ranks here, rendezvous on 127.0.0.1 at a free port. Several nodes: each node's caller passes the
same master address and port, its ``node_rank`` and ``nproc_per_node``; global rank = node_rank * nproc_per_node +
local rank, as torchrun numbers them. A rank that exits with an error ends the run at once; a rank that hangs
ends it at the deadline. Either way the error names the ranks and what each printed last.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import workdirs

REPO_ROOT = Path(__file__).resolve().parents[3]
POLL_SECONDS = 0.1


class ShardedRunError(RuntimeError):
    """The run ended without a report; ``ranks`` holds each local rank's state and the tail of its output."""

    def __init__(self, message: str, ranks: list[dict]):
        super().__init__(message)
        self.ranks = ranks


@dataclass
class RankProcess:
    rank: int
    local_rank: int
    process: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 20) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def state(self) -> str:
        code = self.process.poll()
        if code is None:
            return "running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The line a Python traceback ends with (torch.distributed prefixes each of a rank's lines with "[rankN]: ").
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt): ")


def _describe(ranks: list[RankProcess]) -> str:
    """Each failed rank's state and why: the exception its traceback ended with, when it printed one (a rank that
    raised can still die by SIGABRT afterwards, in gloo's threads at exit, and print that last), else its last line."""
    parts = []
    for rank in ranks:
        tail = rank.tail(40)
        raised = [line for line in tail if EXCEPTION_LINE.match(line)]
        if raised:
            parts.append(f"rank {rank.rank} {rank.state()}, after raising: {raised[-1]!r}")
        elif tail:
            parts.append(f"rank {rank.rank} {rank.state()}, last output: {tail[-1]!r}")
        else:
            parts.append(f"rank {rank.rank} {rank.state()} without output")
    return "; ".join(parts)


def _end(ranks: list[RankProcess]) -> None:
    for rank in ranks:
        try:
            os.killpg(rank.process.pid, signal.SIGKILL)  # the session leader's pid is the group id
        except (ProcessLookupError, PermissionError):
            pass
    for rank in ranks:
        rank.process.wait()


def _forward_progress(rank: RankProcess, progress: Callable[[float, str], None] | None, last: list) -> None:
    if progress is None:
        return
    lines = [line for line in rank.tail(50) if line.startswith("progress ")]
    if lines and lines[-1] != last[0]:
        last[0] = lines[-1]
        _, fraction, message = lines[-1].split(" ", 2)
        progress(float(fraction), message)


def launch_ranks(job: dict, *, nproc_per_node: int, node_rank: int, world_size: int, master_addr: str,
                 master_port: int, timeout_s: float,
                 progress: Callable[[float, str], None] | None = None) -> dict:
    """Run ``nproc_per_node`` ranks of ``rank_main`` for ``job``; return the report of this node's first rank."""
    with workdirs.workdir("d0-shard-") as workdir:
        job_path = Path(workdir) / "job.json"
        job_path.write_text(json.dumps(job))
        base_env = {**os.environ, "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                    "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(nproc_per_node),
                    "NODE_RANK": str(node_rank),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        if job["device"] == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # Ranks sharing a host's cores: one thread pool each would oversubscribe them.
            base_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc_per_node))
        ranks: list[RankProcess] = []
        try:
            for local_rank in range(nproc_per_node):
                rank = node_rank * nproc_per_node + local_rank
                log_path = Path(workdir) / f"rank{rank}.log"
                with open(log_path, "w") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "workers.engine.sharding.rank_main", str(job_path)],
                        env={**base_env, "RANK": str(rank), "LOCAL_RANK": str(local_rank)}, cwd=REPO_ROOT,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                ranks.append(RankProcess(rank, local_rank, process, log_path))
            _wait(ranks, timeout_s, progress)
            result = Path(workdir) / f"result-rank{ranks[0].rank}.json"
            if not result.exists():
                raise ShardedRunError(f"rank {ranks[0].rank} exited without writing its report; "
                                      + _describe(ranks), _states(ranks))
            return json.loads(result.read_text())
        finally:
            _end(ranks)


def _states(ranks: list[RankProcess]) -> list[dict]:
    return [{"rank": rank.rank, "local_rank": rank.local_rank, "state": rank.state(), "output_tail": rank.tail()}
            for rank in ranks]


def _wait(ranks: list[RankProcess], timeout_s: float, progress) -> None:
    deadline = time.monotonic() + timeout_s
    last_progress = [None]
    while True:
        failed = [rank for rank in ranks if rank.process.poll() not in (None, 0)]
        if failed:
            # The others are waiting for the failed rank in a collective; they are ended in launch_ranks.
            raise ShardedRunError(f"sharded run failed: {_describe(failed)}", _states(ranks))
        running = [rank for rank in ranks if rank.process.poll() is None]
        if not running:
            return
        if time.monotonic() > deadline:
            raise ShardedRunError(f"sharded run did not finish within {timeout_s:g}s: {_describe(running)}",
                                  _states(ranks))
        _forward_progress(ranks[0], progress, last_progress)
        time.sleep(POLL_SECONDS)
