"""Faults through real workers on a broker of the test's own (the embedded Valkey server, on a unix socket in the
test's folder, so it can be stopped and started) and PostgreSQL: a broker restart mid-stage, a database outage
mid-stage (the workers reach PostgreSQL through a relay the test cuts), a node restart within the node timeout, a
control-worker restart under a backlog. Every job must end terminal with its true reason, no
live node may be marked offline, and no process or work folder of the test may be left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
import redis
from celery import Celery
from django.db import connection

from adaptation.jobs import services as jobs
from adaptation.models import AdaptationJob, Node, StageRun
from d0web import embedded_broker
from tests.conftest import database_url, failed, job_status, node_online
from tests.harness import WorkerStack, control_key_file, wait_for
from workers import protocol
from workers.engine.workdirs import PREFIXES

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

TERMINAL = ("succeeded", "failed", "cancelled")


class Broker:
    """The test's own broker, restartable; its append-only file keeps the queues across a restart."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.url = embedded_broker.broker_url(folder)
        self.process = None

    def start(self) -> None:
        self.process = embedded_broker.start(self.folder)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # a clean restart: the server writes its file out first
            self.process.wait(timeout=30)
        self.process = None


class DatabaseLink:
    """The workers' way to PostgreSQL through a relay the test can cut: every connection through it dropped and new
    ones refused until it is restored, which is what a database restart or failover looks like to its clients (the
    test's own connection goes straight to the database)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.target = (parts.hostname, parts.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        credentials = parts.netloc.rpartition("@")[0]
        self.url = parts._replace(netloc=f"{credentials}@127.0.0.1:{self.listener.getsockname()[1]}").geturl()
        self.up, self.open, self.lock = True, set(), threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:  # not while a cut is under way
                if not self.up:
                    client.close()
                    continue
                server = socket.create_connection(self.target)
                self.open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, sink)

    @staticmethod
    def _drop(*ends: socket.socket) -> None:
        # shutdown, not only close: the other direction's thread is blocked reading the same socket, and closing it
        # under that thread would neither wake it nor end the TCP connection (the database would keep its session).
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def cut(self) -> None:
        with self.lock:
            self.up = False
            self._drop(*self.open)
            self.open.clear()

    def restore(self) -> None:
        with self.lock:
            self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def database_link():
    """A ``DatabaseLink`` to the test database; a test asks for it before ``faults``, so that it is closed after
    the workers using it have stopped."""
    link = DatabaseLink(database_url())
    yield link
    link.close()


class Faults:
    """A worker stack on its own broker; jobs are submitted through the control plane's service and their dispatch
    sent to that broker (the test process's Celery app is bound to the shared one). ``database``: the workers' URL of
    the test database (default: the test's own)."""

    def __init__(self, folder: Path, broker: Broker, recorder, database: str | None = None, **settings):
        self.broker = broker
        self.temp = folder / "tmp"  # the workers' system temp folder, checked for left work folders at the end
        self.temp.mkdir()
        self.stack = WorkerStack(folder, database or database_url(), broker.url, TMPDIR=str(self.temp), **settings)
        self.recorder = recorder
        self.dispatcher = Celery("dispatcher", broker=broker.url, fixups=[])

    def submit(self, cluster, user, stages, parameters=None, model=None) -> int:
        job = jobs.submit_job(team=cluster.team, user=user, cluster=cluster, stages=stages, parameters=parameters,
                              model=model)
        for task in self.recorder.sent:
            self.dispatcher.send_task(task["name"], args=task["args"], queue=task["queue"], task_id=task["task_id"])
        self.recorder.sent.clear()
        return job.pk

    def our_processes(self) -> list[psutil.Process]:
        """Every process started for this test (workers and what they started), by the control queue in its
        environment, which they all inherit."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("D0_CONTROL_QUEUE") == self.stack.control_queue:
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def close(self) -> None:
        self.stack.stop_all()
        self.dispatcher.close()
        self.broker.stop()

    def assert_nothing_left(self) -> None:
        wait_for(lambda: not self.our_processes(), 15, "every process the test started to end")
        left = [path.name for path in self.temp.iterdir() if path.name.startswith(PREFIXES)]
        assert not left, f"work folders left behind: {left}"


@pytest.fixture
def faults(tmp_path, monkeypatch, broker, request):
    if connection.vendor != "postgresql":
        pytest.skip("needs DATABASE_URL (PostgreSQL), as scripts/test.sh sets")
    own = Broker(tmp_path / "broker")
    own.folder.mkdir()
    own.start()
    made = []

    def make(**settings) -> Faults:
        stack = Faults(tmp_path, own, broker, **settings)
        monkeypatch.setenv("D0_CONTROL_QUEUE", stack.stack.control_queue)  # what submit_job's dispatch names
        made.append(stack)
        return stack

    try:
        yield make
    finally:
        for stack in made:
            if failed(request):
                print(stack.stack.logs())
            stack.close()
        own.stop()
    for stack in made:
        stack.assert_nothing_left()


def outbox(stack: Faults, hostname: str) -> Path:
    return stack.stack.log_dir / "node-keys" / protocol.node_queue("alpha/h100-pod", hostname) / "outbox"


def env_check_in_its_last_phases(stack: Faults, hostname: str, cluster, owner) -> int:
    """The stack's control worker and a node started, and an env check on it that has reached its last phases
    (collectives, then checks, from 80 %): where an outage begins in the tests below. Returns the job's id."""
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", hostname)
    wait_for(node_online(hostname), 90, "node registration")
    job_id = stack.submit(cluster, owner, ["env_check"], {"env_check": {"measure_seconds": 0.5}})
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, status="running", progress__gte=0.8).first(), 90,
             "the stage's last phases")
    return job_id


def test_a_broker_restart_mid_stage_loses_no_report(faults, cluster, owner):
    """The stage's progress and its finished report fall in a broker outage; the node keeps the
    report and sends it when the broker is back, so the job ends succeeded rather than running for hours."""
    # The outage (the stage's last seconds, the node's retries, the workers' reconnection back-off) stays within
    # the node timeout: a longer one is the node timeout's to judge.
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1)
    job_id = env_check_in_its_last_phases(stack, "restart-broker", cluster, owner)
    # A control task in flight (unacknowledged) when the broker goes, while the worker polls with its free processes:
    # a heartbeat waiting on the node's row, which the test holds. kombu's Redis transport stopped such a worker
    # ("Unrecoverable error", workers/broker_fix.py), and the report then waited with no one to take it.
    lock = NodeRowLock(Node.objects.get(hostname="restart-broker").pk)
    try:
        wait_for(lock.waiters, 30, "a heartbeat to wait on the node's row")
        stack.broker.stop()
    finally:
        lock.release()
    # The broker stays away until the stage has finished, so its result has nowhere to go but the node's outbox.
    kept = wait_for(lambda: [path.read_text() for path in outbox(stack, "restart-broker").glob("*.json")], 60,
                    "the finished report to be kept in the outbox")
    assert protocol.STAGE_FINISHED in kept[0]
    # ... and past the node's retries, so the heartbeat thread is what sends it once the broker answers again.
    wait_for(lambda: "report(s) wait in" in stack.stack.log("node-restart-broker"), 30, "the node's last retry")
    stack.broker.start()

    job = wait_for(job_status(job_id, *TERMINAL), 60, "the job to end after the broker came back")
    assert job.status == "succeeded", job.error
    assert job.env_reports.get().report["measurements"]["per_device"][0]["copy_bandwidth"]["bytes_per_s"] > 0
    assert not list(outbox(stack, "restart-broker").glob("*.json"))
    assert Node.objects.get(hostname="restart-broker").status == "online"
    log = stack.stack.log("node-restart-broker")
    assert "progress report dropped" in log  # the outage did fall on the stage's progress
    assert stack.stack.running["control"].poll() is None, "the control worker stopped"


def test_a_database_outage_mid_stage_loses_no_report(database_link, faults, cluster, owner):
    """The stage's finished report reaches the control plane while PostgreSQL cannot be reached (a restart, a
    failover): the report's task is tried again with back-off instead of failing, which would drop the report (the
    broker has handed it over) and leave the job running until the stage timeout. Once the database answers, the
    report is applied once and the job ends succeeded."""
    stack = faults(database=database_link.url, D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1)
    job_id = env_check_in_its_last_phases(stack, "database-away", cluster, owner)
    database_link.cut()
    wait_for(lambda: [line for line in stack.stack.log("control").splitlines()
                      if f"{protocol.STAGE_FINISHED}[" in line and " retry: Retry in " in line], 60,
             "the finished report's task to meet the outage and be tried again")
    assert StageRun.objects.get(job_id=job_id).status == "running"
    database_link.restore()

    job = wait_for(job_status(job_id, *TERMINAL), 90, "the job to end once the database answered again")
    assert job.status == "succeeded", job.error
    assert job.env_reports.count() == 1
    assert job.log.count("stage env_check succeeded") == 1
    assert Node.objects.get(hostname="database-away").status == "online"


def test_a_node_restarted_within_the_timeout_fails_the_stage_it_was_running(faults, cluster, owner):
    """End to end: the restarted node's registration fails what its old worker was running, with
    that reason, long before the node timeout; the node then takes new work."""
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1)
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", "restart-node")
    wait_for(node_online("restart-node"), 90, "node registration")

    job_id = stack.submit(cluster, owner, ["env_check"], {"env_check": {"measure_seconds": 2.0}})
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, status="running").first(), 60, "the stage to start")
    killed = time.monotonic()
    stack.stack.kill("node-restart-node")  # SIGKILL, process group and all
    stack.stack.start_node("alpha/h100-pod", "restart-node", token="")  # its key is its credential now

    job = wait_for(job_status(job_id, *TERMINAL), 60, "the job to end after the node restarted")
    assert job.status == "failed"
    assert "Node restart-node restarted while stage env_check was running" in job.error, job.error
    assert time.monotonic() - killed < 60  # settled by the registration, not by the node timeout
    assert Node.objects.get(hostname="restart-node").status == "online"

    next_job = wait_for(job_status(stack.submit(cluster, owner, ["env_probe"]), *TERMINAL), 60, "the next job")
    assert next_job.status == "succeeded", next_job.error


def test_a_control_restart_under_a_backlog_marks_no_live_node_offline(faults, cluster, owner):
    """40 jobs wait for the control worker while it is down longer than the node timeout. When it
    is back, its sweeps queue behind that backlog; the node's heartbeats, on their own queue, are read in turn with
    it (on the control queue they expired behind it, and the sweep failed the node's work), so the sweep finds the
    node alive and every job ends."""
    stack = faults(D0_NODE_TIMEOUT=4, D0_LIVENESS_INTERVAL=1)
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", "backlog-node")
    node = wait_for(node_online("backlog-node"), 90, "node registration")

    stack.stack.kill("control", signal.SIGTERM)
    job_ids = [stack.submit(cluster, owner, ["env_probe"]) for _ in range(40)]
    time.sleep(6)  # the control plane stays down past the node timeout (4 s): what is waited on is the time itself
    stack.stack.start_control()

    statuses = []

    def all_ended():
        statuses.append(Node.objects.get(pk=node.pk).status)
        return AdaptationJob.objects.filter(pk__in=job_ids, status__in=TERMINAL).count() == len(job_ids)

    wait_for(all_ended, 150, "every job of the backlog to end", interval=0.5)
    assert set(statuses) == {"online"}  # never marked offline (that would also have failed its queued jobs)
    outcomes = list(AdaptationJob.objects.filter(pk__in=job_ids).values_list("status", "error"))
    assert all(status == "succeeded" for status, _ in outcomes), outcomes


class JobRowLock:
    """The job's row locked FOR UPDATE from a connection of the test's own: the control worker's transaction that
    needs it (a dispatch, a finished report) waits on it, so the test can kill the worker at that very point."""

    def __init__(self, job_id: int):
        self.connection = psycopg.connect(database_url())
        self.connection.execute("SELECT id FROM adaptation_adaptationjob WHERE id = %s FOR UPDATE", [job_id])

    def waiters(self) -> list[int]:
        """The backends of the transactions waiting for this lock (the control plane's, to take the row)."""
        with psycopg.connect(database_url(), autocommit=True) as other:
            return [pid for pid, in other.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY("
                                                  "pg_blocking_pids(pid))", [self.connection.info.backend_pid])]

    def release(self) -> None:
        self.connection.rollback()
        self.connection.close()


class NodeRowLock(JobRowLock):
    """The node's row locked FOR UPDATE: the control worker's next heartbeat task of that node waits on it."""

    def __init__(self, node_id: int):
        self.connection = psycopg.connect(database_url())
        self.connection.execute("SELECT id FROM adaptation_node WHERE id = %s FOR UPDATE", [node_id])


def kill_control_inside_its_transaction(stack: Faults, lock: JobRowLock) -> None:
    try:
        wait_for(lock.waiters, 90, "the control worker to wait on the job's row inside its transaction")
        stack.stack.kill("control")  # SIGKILL, process group and all: no clean-up, no acknowledgement
    finally:
        lock.release()  # also when the wait failed: the test database's flush would wait on the lock for ever


def test_a_control_worker_killed_inside_dispatch_leaves_the_job_queued_and_it_runs_once(faults, cluster, owner):
    """Starting a job and dispatching its first stage are one transaction. A job left queued (made outside a submit,
    which dispatches its own job): the reconciler dispatches it; killed inside that dispatch, the worker commits
    nothing: the job is still queued, with no stage run; the next control worker's reconciler finds it queued again
    and dispatches it, once."""
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1, D0_CONTROL_REDELIVER_AFTER=3, D0_RECONCILE_AFTER=4)
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", "kill-dispatch")
    wait_for(node_online("kill-dispatch"), 90, "node registration")
    stack.stack.kill("control", signal.SIGTERM)

    job_id = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_probe"],
                                          submitted_by=owner).pk
    lock = JobRowLock(job_id)
    stack.stack.start_control()
    kill_control_inside_its_transaction(stack, lock)
    job = AdaptationJob.objects.get(pk=job_id)
    assert (job.status, job.started, job.stage_runs.count()) == ("queued", None, 0)

    stack.stack.start_control()
    job = wait_for(job_status(job_id, *TERMINAL), 90, "the job to run after the control worker came back")
    assert job.status == "succeeded", job.error
    assert job.stage_runs.count() == 1
    assert job.log.count(" started\n") == 1


class JobTableLock(JobRowLock):
    """The job table locked against writes (SHARE mode) from a connection of the test's own: a submit waits at its
    job's INSERT, inside its transaction, before anything of it can commit."""

    def __init__(self):
        self.connection = psycopg.connect(database_url())
        self.connection.execute("LOCK TABLE adaptation_adaptationjob IN SHARE MODE")


def test_a_submitter_killed_inside_its_transaction_leaves_no_job_and_sends_nothing(faults, tmp_path, cluster, owner,
                                                                                 node):
    """The submit inserts the job, starts it and queues its first stage in one transaction, and messages the node
    once it commits. A web worker killed inside it leaves nothing: no job, no stage run, no message on the node's
    queue (a job INSERT committed on its own, as the submit once was, would be left behind)."""
    stack = faults()
    lock = JobTableLock()
    submitter = subprocess.Popen(
        [sys.executable, "-c", "import django; django.setup(); "
         "from django.contrib.auth.models import User; from adaptation.jobs.services import submit_job; "
         f"from adaptation.models import Cluster; cluster = Cluster.objects.get(pk={cluster.pk}); "
         f"submit_job(team=cluster.team, user=User.objects.get(pk={owner.pk}), cluster=cluster, stages=['env_probe'])"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "d0web.settings", "DATABASE_URL": database_url(),
             "D0_BROKER_URL": stack.broker.url, "D0_VAR_DIR": str(tmp_path / "submitter"),
             "D0_CONTROL_KEY_FILE": control_key_file()})
    try:
        [backend] = wait_for(lock.waiters, 90, "the submit to wait inside its transaction")
        submitter.kill()
        submitter.wait(timeout=30)
    finally:
        lock.release()

    def backend_gone():
        with psycopg.connect(database_url(), autocommit=True) as other:
            return not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]).fetchone()

    wait_for(backend_gone, 30, "the killed submitter's database session to end")  # what it would commit, it has
    assert not AdaptationJob.objects.exists()
    assert not StageRun.objects.exists()
    broker = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(stack.broker.folder)))
    assert broker.llen(node.queue_name) == 0


def test_a_control_worker_killed_between_a_stage_end_and_the_next_step_loses_neither(faults, cluster, owner):
    """A finished report's stage end, its result and the job's next step are one transaction.
    Killed inside it, the worker commits none of it (no half-done job "running" with nothing active); the report
    is delivered again and does all of it: the env report stored once, the next stage run, the job succeeded."""
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1, D0_CONTROL_REDELIVER_AFTER=3)
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", "kill-finish")
    wait_for(node_online("kill-finish"), 90, "node registration")

    job_id = stack.submit(cluster, owner, ["env_check", "env_probe"], {"env_check": {"measure_seconds": 0.5}})
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, kind="env_check", status="running").first(), 60,
             "the env check to start")
    lock = JobRowLock(job_id)
    kill_control_inside_its_transaction(stack, lock)
    run = StageRun.objects.get(job_id=job_id, kind="env_check")
    assert (run.status, run.result) == ("running", None)
    assert AdaptationJob.objects.get(pk=job_id).env_reports.count() == 0

    stack.stack.start_control()
    job = wait_for(job_status(job_id, *TERMINAL), 90, "the job to end after the control worker came back")
    assert job.status == "succeeded", job.error
    assert job.env_reports.count() == 1
    assert [(run.kind, run.status) for run in job.stage_runs.order_by("id")] == [("env_check", "succeeded"),
                                                                               ("env_probe", "succeeded")]
    assert job.log.count("stage env_check succeeded") == 1


def stage_process(stack: Faults, hostname: str) -> psutil.Process:
    """The pool process that runs the node's stages (concurrency 1: the node worker's one child)."""
    [pool] = psutil.Process(stack.stack.running[f"node-{hostname}"].pid).children()
    return pool


def test_a_stage_process_killed_on_a_live_node_fails_its_job_within_two_heartbeats(faults, cluster, owner):
    """The kernel's OOM killer (or anyone) SIGKILLs the process running a stage; the node worker lives on. Its next
    heartbeat says the run was lost and why, and the job fails with that, not hours later at the stage timeout; the
    node stays online and takes the next job."""
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1)
    interval = 3.0
    stack.stack.start_control()
    stack.stack.start_node("alpha/h100-pod", "kill-stage", heartbeat=interval)
    wait_for(node_online("kill-stage"), 90, "node registration")
    job_id = stack.submit(cluster, owner, ["env_check"], {"env_check": {"measure_seconds": 2.0}})
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, status="running").first(), 60, "the stage to start")

    stage_process(stack, "kill-stage").kill()
    killed = time.monotonic()
    job = wait_for(job_status(job_id, *TERMINAL), 30, "the job to end after its stage's process was killed")
    took = time.monotonic() - killed
    assert job.status == "failed"
    assert job.error == ("Stage env_check on kill-stage was lost on the node: its process ended (killed by signal 9, "
                         "SIGKILL — likely out of memory: the kernel's OOM killer sends it).")
    # The next heartbeat says it (at most one interval); the second leaves the control worker its turn on a busy
    # test machine.
    assert took < 2 * interval, f"{took:.1f}s"
    print(f"failed {took:.1f}s after the kill (heartbeat every {interval:g}s)")

    assert Node.objects.get(hostname="kill-stage").status == "online"
    next_job = wait_for(job_status(stack.submit(cluster, owner, ["env_probe"]), *TERMINAL), 60, "the next job")
    assert next_job.status == "succeeded", next_job.error


def test_a_sweep_past_the_stage_memory_limit_fails_alone_with_out_of_memory(faults, team, owner, model_spec):
    """A node started with a 1 GiB stage memory limit: a sweep whose trial sizes a paged cache of gigabytes (64
    sequences of 16k tokens) fails within a minute with "out of memory", and the node takes the next job."""
    cluster = team.clusters.create(name="local", expected_devices_per_node=1)
    stack = faults(D0_NODE_TIMEOUT=60, D0_LIVENESS_INTERVAL=1)
    stack.stack.start_control()
    stack.stack.start_node("alpha/local", "small-node", extra=("--stage-memory", "1G"))
    wait_for(node_online("small-node"), 90, "node registration")

    job_id = stack.submit(cluster, owner, ["env_check", "sweep"], {
        "env_check": {"measure_seconds": 0.2},
        "sweep": {"grid": {"batch_size": [64], "max_batch_tokens": [256]},
                  "workload": {"requests": 64, "prompt_len": 16384, "output_len": 4}}}, model=model_spec)
    job = wait_for(job_status(job_id, *TERMINAL), 180, "the sweep job to end")
    assert job.status == "failed", job.log
    sweep = job.stage_runs.get(kind="sweep")
    assert sweep.status == "failed"
    assert "no trial of 1 completed: 1 × out of memory: " in job.error, job.error
    assert (sweep.finished - sweep.started).total_seconds() < 60

    assert Node.objects.get(hostname="small-node").status == "online"
    next_job = wait_for(job_status(stack.submit(cluster, owner, ["env_probe"]), *TERMINAL), 60, "the next job")
    assert next_job.status == "succeeded", next_job.error
