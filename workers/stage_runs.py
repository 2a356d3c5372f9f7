"""The stage runs a node worker holds, as its heartbeat names them: so the control plane can fail a run whose
process died on the node (the kernel's OOM killer, a kill, a hard time limit) instead of leaving it "running" until
the stage timeout, hours later.

Kept in the worker's main process, where Celery sees every stage message arrive and every pool process end, and
where the heartbeat thread runs: a run is *held* from the moment its message reaches this worker (before its pool
process starts it, so before its "started" report leaves) until its request ends there. What ended stays named for
``ENDED_KEPT_S`` (its "finished" report may wait behind a backlog on the control queue, or in the outbox, and the
control plane must leave it to that report), and what ended without a report says why: *lost*, with the exit
signal Celery's pool saw. A heartbeat carries ``beat()``: when it was taken (the node's clock, before the runs
were read), the interval, and the running, ended and lost runs. Imports nothing from Django.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import OrderedDict

from . import protocol

ENDED_KEPT_S = 3600.0
# A heartbeat names at most this many ended or lost runs (the newest): a node runs a handful of stages at once.
MAX_NAMED = protocol.MAX_FINISHED_RUNS
OUT_OF_MEMORY_SIGNALS = (signal.SIGKILL,)  # what the kernel's OOM killer (and a cgroup's memory.max) sends


def loss_reason(error: BaseException) -> str:
    """Why a stage's process ended without a report, from what Celery's pool raised in the worker's main process:
    billiard's WorkerLostError says "Worker exited prematurely: signal 9 (SIGKILL)" or "exitcode 1"."""
    text = str(error)
    if (found := re.search(r"signal (\d+)", text)) is not None:
        number = int(found.group(1))
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        reason = f"its process ended (killed by signal {number}, {name}"
        if number in OUT_OF_MEMORY_SIGNALS:
            reason += " — likely out of memory: the kernel's OOM killer sends it"
        return reason + ")"
    if (found := re.search(r"exitcode (-?\d+)", text)) is not None:
        return f"its process ended (exit code {found.group(1)})"
    name = type(error).__name__
    if name == "Terminated":
        return f"its process was terminated (signal {text or '?'}): a revoke reached this node"
    if name == "TimeLimitExceeded":
        return f"its process was killed at the hard time limit ({text}s)"
    return f"its process ended ({name}: {text})"[:200]


class StageRuns:
    """Thread-safe: the consumer records arrivals and ends, the heartbeat thread reads."""

    def __init__(self, kept_s: float = ENDED_KEPT_S):
        self.kept_s = kept_s
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # task id -> stage run, from arrival until the request ends here
        self._ended: OrderedDict[int, float] = OrderedDict()  # stage run -> when it ended (time.time())
        self._lost: OrderedDict[int, tuple[float, str]] = OrderedDict()  # stage run -> (when, why)

    def arrived(self, task_id: str, run: int) -> None:
        """The stage message ``task_id`` for ``run`` reached this worker (the node read ``run`` from a message the
        control plane signed for it: a message nobody signed names no run in its heartbeats)."""
        with self._lock:
            self._held[task_id] = run

    def ended(self, task_id: str, reason: str | None = None) -> None:
        """The request ``task_id`` ended here; ``reason``: it ended without a report (the process died). A run once
        lost stays lost: its redelivered message, dropped unrun (workers/delivered.py), ends "normally"."""
        with self._lock:
            run = self._held.pop(task_id, None)
            if run is None:
                return
            now = time.time()
            if reason is not None:
                self._lost[run] = (now, reason[:200])
                self._lost.move_to_end(run)
            self._ended[run] = now
            self._ended.move_to_end(run)

    def reported(self, runs: list[int]) -> None:
        """Runs whose finished reports an earlier worker kept and this one sent at its start: named as ended, so
        the control plane leaves them to those reports."""
        with self._lock:
            for run in runs:
                self._ended[run] = time.time()

    def beat(self, interval: float, finished_kept: list[int] = ()) -> dict:
        """A heartbeat's account: ``as_of`` is read before the runs, so every run whose "started" report was sent
        before ``as_of`` arrived here before this account was taken and is in it. ``finished_kept``: runs whose
        finished reports wait in the outbox (named as ended for as long as they wait)."""
        as_of = time.time()
        with self._lock:
            for kept in (self._ended, self._lost):
                while kept and as_of - _when(next(iter(kept.values()))) > self.kept_s:
                    kept.popitem(last=False)
            running = sorted(set(self._held.values()))
            ended = [run for run in self._ended if run not in self._lost]
            lost = [[run, why] for run, (_, why) in self._lost.items()]
        ended = list(dict.fromkeys([*ended, *finished_kept]))
        return {"as_of": as_of, "interval": interval, "running": running, "ended": ended[-MAX_NAMED:],
                "lost": lost[-MAX_NAMED:]}


def _when(entry) -> float:
    return entry[0] if isinstance(entry, tuple) else entry
