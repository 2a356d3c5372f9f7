"""No stage left hanging: a node's heartbeat names the stage runs it holds, those that ended lately and those whose
process died (with why); the control plane fails a running run its live node lost or no longer names, and leaves
alone a run that has not reached the node's account yet or whose report is on its way. The node's side is tested
here without a worker; the whole path through real workers is in tests/test_faults.py."""

import json
import resource
import subprocess
import sys
import time

import pytest

from adaptation.errors import Rejected
from adaptation.jobs import recovery, reports
from adaptation.jobs import services as jobs
from adaptation.models import StageRun
from workers import protocol, signing, stage_memory
from workers.control import node_heartbeat
from workers.stage_runs import StageRuns, loss_reason
from tests.harness import ROOT


# --- the node's account ----------------------------------------------------------------------------------


def test_the_account_names_held_ended_and_lost_runs_and_a_lost_run_stays_lost():
    held = StageRuns()
    held.arrived("task-a", 1)
    held.arrived("task-b", 2)
    held.arrived("task-c", 3)
    held.ended("task-b")
    held.ended("task-c", "its process ended (killed by signal 9, SIGKILL)")
    # The killed run's message comes back (acks late) and is dropped unrun: that end is not its story.
    held.arrived("task-c", 3)
    held.ended("task-c")
    before = time.time()
    beat = held.beat(2.0, finished_kept=[7])
    assert before <= beat["as_of"] <= time.time()
    assert (beat["interval"], beat["running"], beat["ended"]) == (2.0, [1], [2, 7])
    assert beat["lost"] == [[3, "its process ended (killed by signal 9, SIGKILL)"]]
    json.dumps(beat)  # it travels in the signed payload


def test_what_ended_long_ago_is_no_longer_named():
    held = StageRuns(kept_s=0.0)
    held.arrived("task-a", 1)
    held.ended("task-a", "its process ended (exit code 1)")
    time.sleep(0.01)
    assert held.beat(1.0)["lost"] == [] and held.beat(1.0)["ended"] == []


@pytest.mark.parametrize("error, says", [
    ("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.",
     "its process ended (killed by signal 9, SIGKILL — likely out of memory: the kernel's OOM killer sends it)"),
    ("Worker exited prematurely: signal 15 (SIGTERM) Job: 0.", "its process ended (killed by signal 15, SIGTERM)"),
    ("Worker exited prematurely: exitcode 3.", "its process ended (exit code 3)"),
])
def test_why_a_stage_process_ended_is_read_from_what_the_pool_saw(error, says):
    from billiard.exceptions import WorkerLostError

    assert loss_reason(WorkerLostError(error)) == says


# --- the control plane -----------------------------------------------------------------------------------


@pytest.fixture
def running(cluster, owner, node, broker, django_capture_on_commit_callbacks):
    """A job whose stage run on ``node`` runs: its "started" report sent at the node's time 1000.0."""
    with django_capture_on_commit_callbacks(execute=True):
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_check"])
    run = job.stage_runs.get()
    reports.record_stage_started(run.pk, sender=node, sent_at=1000.0)
    run.refresh_from_db()
    assert (run.status, run.started_on_node) == ("running", 1000.0)
    return run


def beat(as_of, running=(), ended=(), lost=(), interval=2.0):
    return [{"as_of": as_of, "interval": interval, "running": list(running), "ended": list(ended),
             "lost": [list(entry) for entry in lost]}]


def settled(run):
    run.refresh_from_db()
    return run.status, run.error, run.job.status


def test_a_run_the_node_says_it_lost_fails_with_the_nodes_reason(running, node):
    assert recovery.runs_the_node_let_go(node, beat(1000.5, lost=[(running.pk, "its process ended (killed by "
                                                                                "signal 9, SIGKILL)")])) == 1
    error = "Stage env_check on gpu-01 was lost on the node: its process ended (killed by signal 9, SIGKILL)."
    assert settled(running) == ("failed", error, "failed")
    assert running.job.error == error


def test_a_run_the_node_no_longer_names_fails_once_the_account_is_an_interval_past_its_start(running, node):
    # Taken before the run's "started" report was sent, or within an interval of it: the run may not have
    # reached the account (a race between the heartbeat thread and the stage's start). Left alone.
    for as_of in (999.0, 1001.9):
        assert recovery.runs_the_node_let_go(node, beat(as_of)) == 0
        assert settled(running)[0] == "running"
    # Named as running or as ended (its finished report may wait behind a backlog): left to its report.
    assert recovery.runs_the_node_let_go(node, beat(1010.0, running=[running.pk])) == 0
    assert recovery.runs_the_node_let_go(node, beat(1010.0, ended=[running.pk])) == 0
    assert settled(running)[0] == "running"
    assert recovery.runs_the_node_let_go(node, beat(1002.0)) == 1
    assert settled(running)[1] == ("Stage env_check on gpu-01 was lost on the node: its node worker no longer runs "
                                   "it and no result came.")


def test_a_node_speaks_only_for_its_own_runs_and_an_older_node_for_none(running, node, cluster):
    from adaptation.models import Node

    other = Node.objects.create(cluster=cluster, hostname="gpu-02", queue_name="q2")
    assert recovery.runs_the_node_let_go(other, beat(5000.0, lost=[(running.pk, "made up")])) == 0
    assert recovery.runs_the_node_let_go(node, []) == 0  # a node worker that names nothing
    assert settled(running)[0] == "running"


@pytest.mark.parametrize("args", [
    [[]], [{"as_of": "now", "interval": 1, "running": [], "ended": [], "lost": []}],
    [{"as_of": 1.0, "interval": 0, "running": [], "ended": [], "lost": []}],
    [{"as_of": float("inf"), "interval": 1, "running": [], "ended": [], "lost": []}],
    [{"as_of": 1.0, "interval": 1, "running": ["1"], "ended": [], "lost": []}],
    [{"as_of": 1.0, "interval": 1, "running": [], "ended": [], "lost": [[1]]}],
    [{"as_of": 1.0, "interval": 1, "running": list(range(5000)), "ended": [], "lost": []}],
    [{"as_of": 1.0, "interval": 1, "running": [], "ended": [], "lost": []}, "extra"],
])
def test_a_malformed_account_is_refused(args, node):
    with pytest.raises(Rejected, match="heartbeat's stage runs are malformed"):
        recovery.runs_the_node_let_go(node, args)


def test_the_heartbeat_task_applies_a_signed_account_and_records_a_malformed_one(running, node):
    from adaptation.models import Node, RejectedNodeMessage

    key = signing.NodeKey.generate()
    Node.objects.filter(pk=node.pk).update(public_key=key.public_key, key_id=key.key_id)
    # The task's own function, in this process (Celery's apply would close the test's database connection).
    node_heartbeat.run(*key.message(protocol.NODE_HEARTBEAT, [{"bogus": 1}]))
    assert RejectedNodeMessage.objects.get().reason == "heartbeat's stage runs are malformed"
    assert settled(running)[0] == "running"
    node_heartbeat.run(*key.message(protocol.NODE_HEARTBEAT, beat(time.time(), lost=[(running.pk, "gone")])))
    assert settled(running)[:2] == ("failed", "Stage env_check on gpu-01 was lost on the node: gone.")
    assert StageRun.objects.filter(status="running").count() == 0


# --- the stage memory limit ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, limit", [
    ("", 48 << 30), ("8G", 8 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("60%", int(0.6 * (64 << 30))),
    ("off", None), ("0", None),
])
def test_the_stage_memory_limit_is_a_size_a_share_of_the_ram_or_off(text, limit):
    assert stage_memory.parse_limit(text, total=64 << 30) == limit  # default: 75 % of a 64 GiB machine


@pytest.mark.parametrize("text", ["8", "lots", "150%", "-1G"])
def test_a_stage_memory_limit_that_is_no_usable_size_is_refused(text):
    with pytest.raises(ValueError):
        stage_memory.parse_limit(text, 64 << 30)


def test_a_stage_past_its_memory_limit_fails_with_out_of_memory_and_its_process_goes_on():
    """In a process of its own (the limit is the process's): the stage's allocation is refused, the engine says
    "out of memory", and after the stage the process has its own limit back and allocates as before."""
    script = """
import resource
from workers import stage_memory
from workers.engine.stages import register, run_stage, StageSpec

def greedy(params, progress):
    return {"size": len(bytearray(2 << 30))}

register(StageSpec(kind="greedy", run=greedy, gated=False, placement="one"))
stage_memory.configure(stage_memory.parse_limit("512M"))
before = resource.getrlimit(resource.RLIMIT_DATA)
stage_memory.enter()
try:
    run_stage("greedy", {}, lambda *_: None)
except MemoryError as error:
    print(type(error).__name__, error)
stage_memory.leave()
assert resource.getrlimit(resource.RLIMIT_DATA) == before
print("after", len(bytearray(1 << 30)))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "OutOfMemory out of memory: stage greedy could not allocate what it asked for (the node's stage memory "
        "limit or the machine's RAM)", f"after {1 << 30}"]
    assert resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY  # this process was not touched
