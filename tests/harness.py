"""Real worker processes for tests: started on the real broker with their own queue names, waited on with
deadlines (never fixed sleeps), and stopped — process group and all — even when the test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


class Processes:
    """Starts processes in their own process groups, with their output in log files for failure reports."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, name: str, command: list[str], env: dict) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.running[name] = process
        return process

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        process = self.running.pop(name)
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def stop_all(self, grace: float = 15) -> None:
        """SIGTERM to every process group at once (each shuts down while the others do: one after the other,
        a control worker and two nodes took 2-4 s of every test's teardown), SIGKILL what is left after
        ``grace`` seconds."""
        for process in self.running.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for process in self.running.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for name in list(self.running):
            self.kill(name)


def join_token(cluster_ref: str) -> str:
    """A fresh join token of the cluster ``<team>/<name>``, as a team admin would make on the cluster page."""
    from adaptation.clusters.trust import create_join_token
    from adaptation.models import Cluster

    team, _, name = cluster_ref.partition("/")
    return create_join_token(Cluster.objects.get(team__slug=team, name=name), None, hours=1)[1]


def _secret_key() -> str:
    from django.conf import settings

    return settings.SECRET_KEY


def control_key_file() -> str:
    from django.conf import settings

    return str(settings.D0_CONTROL_KEY_FILE)


def control_public_key() -> str:
    """What a node is given to pin: the test process's control-plane key, which the stack's control worker shares."""
    from adaptation import control_messages

    return control_messages.public_key()


class WorkerStack(Processes):
    """A control-plane worker (with beat) and node workers, sharing the test process's database and broker."""

    def __init__(self, log_dir: Path, database_url: str, broker_url: str, node_broker_url: str | None = None,
                 **settings):
        super().__init__(log_dir)
        # Nodes may reach the broker as a user of their own (the production Redis ACL has one per role).
        self.node_broker_url = node_broker_url or broker_url
        self.prefix = f"d0test-{uuid.uuid4().hex[:8]}"
        self.control_queue = f"{self.prefix}.control"
        self.broker_url = broker_url
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "D0_BROKER_URL": broker_url,
            "D0_CONTROL_QUEUE": self.control_queue,
            "D0_VAR_DIR": str(log_dir),
            # The web tier (this process) and the control plane share one SECRET_KEY, as a deployment's must: the
            # control worker decrypts what the web tier stored (an endpoint's API key).
            "D0_SECRET_KEY": _secret_key(),
            # Likewise the control plane's signing key: the test process dispatches stages, the control worker too.
            "D0_CONTROL_KEY_FILE": control_key_file(),
            # Env checks in tests check behaviour, not figures: 0.2 s of timed work per measurement, not 1 s.
            "D0_ENVCHECK_MEASURE_SECONDS": "0.2",
            **{key: str(value) for key, value in settings.items()},
        }

    def start_control(self) -> None:
        self.start("control", [sys.executable, "-m", "celery", "-A", "d0web", "worker", "--beat",
                               "--schedule", str(self.log_dir / "beat-schedule"), "--queues",
                               f"{self.control_queue},{self.control_queue}.heartbeat",
                               "--hostname", f"{self.prefix}-control@%h", "--concurrency", "4", "--loglevel",
                               "info", "--without-gossip", "--without-mingle"], self.env)

    def start_node(self, cluster_ref: str, hostname: str, heartbeat: float = 1.0, token: str | None = None,
                   extra: tuple[str, ...] = (), env: dict | None = None) -> None:
        """A node worker joining ``cluster_ref`` with a fresh join token of it (or ``token``; "" for none). Its
        key lives in this stack's folder, so starting the same hostname again is a restart of that node."""
        if token is None:
            token = join_token(cluster_ref)
        self.start(f"node-{hostname}", [sys.executable, "-m", "workers.node", "--broker", self.node_broker_url,
                                        "--cluster", cluster_ref, "--hostname", hostname,
                                        "--heartbeat", str(heartbeat), "--state-dir", str(self.log_dir / "node-keys"),
                                        *extra],
                   {**self.env, "D0_JOIN_TOKEN": token, "D0_CONTROL_KEY": control_public_key(), **(env or {})})

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
                         for path in sorted(self.log_dir.glob("*.log")))
