"""The local node's serving engine under ``manage.py up`` (``make run``): vLLM's CPU build, its environment prepared in
the background by the project's own script (``scripts/vllm-env.sh``) while the dashboard is already up; the local
node is started again with ``--engine vllm=<its interpreter>`` once it is ready (and idle), so its registration lists
the engine.

Where it stands is one small JSON file under the var folder, which ``up`` writes and the cluster page reads:
``{"cluster", "state": preparing|restarting|ready|failed, "python", "log", "reason", "pid"}`` (``pid``: the ``up``
that writes it; a file whose ``up`` is gone says nothing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from workers.engine.processes import die_with_parent

STATUS_FILE = "local-engine.json"
LOG_FILE = "vllm-env.log"
ENGINE = "vllm"


def status_path(var: Path) -> Path:
    return Path(var) / STATUS_FILE


def write_status(var: Path, **status) -> None:
    path = status_path(var)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({**status, "pid": os.getpid()}))
    partial.replace(path)  # whole or not at all: the page may read it at any time


def clear_status(var: Path) -> None:
    status_path(var).unlink(missing_ok=True)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def read_status(var: Path, cluster_join_name: str) -> dict | None:
    """The local engine's status for that cluster, if an ``up`` that is still running wrote one for it."""
    try:
        status = json.loads(status_path(var).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or status.get("cluster") != cluster_join_name or not _alive(status.get("pid")):
        return None
    return status


class Preparation:
    """The preparation script running in the background: its output goes to the log; its last line is the
    engine's interpreter."""

    def __init__(self, var: Path, script: str, cluster_join_name: str):
        self.var, self.cluster = Path(var), cluster_join_name
        self.log = self.var / LOG_FILE
        self.python: str | None = None
        self.reason: str | None = None
        with open(self.log, "w") as log:
            # A session of its own, and it dies with `up`: no half-finished install outlives a Ctrl-C.
            self.process = subprocess.Popen([script], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
        self.status("preparing")

    def status(self, state: str) -> None:
        write_status(self.var, cluster=self.cluster, state=state, python=self.python, log=str(self.log),
                     reason=self.reason)

    def done(self) -> bool:
        """Whether the script has ended; then ``python`` is the interpreter, or ``reason`` says why there is none."""
        if self.process.poll() is None:
            return False
        if self.python or self.reason:
            return True
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if self.process.returncode == 0 and os.access(last, os.X_OK):
            self.python = last
        else:
            self.reason = (f"{Path(self.process.args[0]).name} exited with code {self.process.returncode}"
                           + (f": {last}" if last else ""))
            self.status("failed")
        return True

    def wait(self, seconds: float) -> bool:
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass
        return self.done()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait()
