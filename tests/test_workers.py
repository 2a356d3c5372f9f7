"""Jobs through real Celery workers on real Redis and PostgreSQL: a control-plane worker and node workers."""

import time

import pytest
from django.utils import timezone

from adaptation.models import Node
from tests.conftest import job_status, node_online
from tests.harness import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]


def test_a_job_submitted_through_the_api_runs_on_a_real_node_worker(stack, cluster, member_api):
    stack.start_node("alpha/h100-pod", "worker-a")
    node = wait_for(node_online("worker-a"), 60, "node registration", )
    assert node.devices.filter(kind="cpu").exists()

    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    assert response.status_code == 201, response.json()
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "the job to finish")

    assert job.status == "succeeded", job.error
    run = job.stage_runs.get()
    assert (run.node_name, run.status) == ("worker-a", "succeeded")
    assert run.result["devices"][0]["kind"] == "cpu"
    assert run.result["host"]["cpu_cores_logical"] >= 1
    detail = member_api.get(f"/api/jobs/{job.pk}/").json()
    assert detail["stage_runs"][0]["result"]["software"]["torch"].startswith("2.13")


def test_a_killed_node_goes_offline_and_its_job_fails_with_a_clear_error(stack, cluster, member_api):
    stack.start_node("alpha/h100-pod", "worker-b", heartbeat=0.5)
    node = wait_for(node_online("worker-b"), 60, "node registration")
    stack.kill("node-worker-b")  # SIGKILL: no goodbye message, only silence

    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "failed", "succeeded"), 30, "the job to fail")

    node.refresh_from_db()
    assert node.status == "offline"
    assert timezone.now() - node.last_heartbeat > timezone.timedelta(seconds=4)
    assert job.status == "failed"
    assert job.error.startswith("Node worker-b went offline (no heartbeat since")
    assert job.stage_runs.get().status == "failed"


def test_cancel_through_the_api_ends_a_running_job_cancelled(stack, cluster, member_api):
    # No node worker runs for this cluster's node, so its stage waits in the node's queue until cancelled.
    Node.objects.create(cluster=cluster, hostname="idle", queue_name=f"{stack.prefix}.idle",
                        last_heartbeat=timezone.now() + timezone.timedelta(hours=1))
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "running"), 30, "the job to be dispatched")
    cancelled = member_api.post(f"/api/jobs/{job.pk}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["stage_runs"][0]["status"] == "cancelled"
    assert member_api.post(f"/api/jobs/{job.pk}/cancel/").status_code == 409
    retried = member_api.post(f"/api/jobs/{job.pk}/retry/")
    assert retried.status_code == 201 and retried.json()["retry_of"] == job.pk


def test_an_env_check_job_measures_the_node_through_real_workers(stack, cluster, member_api):
    stack.start_node("alpha/h100-pod", "worker-c")
    wait_for(node_online("worker-c"), 60, "node registration")
    started = timezone.now()
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "the env check to finish")
    assert job.status == "succeeded", job.error
    assert (job.finished - started).total_seconds() < 60
    report = job.env_reports.get().report
    cpu = report["measurements"]["per_device"][0]
    assert cpu["copy_bandwidth"]["bytes_per_s"] > 0
    assert cpu["matmul"]["fp32"]["flops_per_s"] > 0
    all_reduce = report["measurements"]["collectives"]["results"]["all_reduce"]
    assert (report["measurements"]["collectives"]["backend"], all_reduce["busbw"] > 0) == ("gloo", True)
    # The cluster expects 8 devices per node; this machine offers its CPU only.
    assert report["verdict"] == "fail"
    assert job.env_reports.get().node.devices.get(kind="cpu").measured["copy_bandwidth_bytes_per_s"] > 0


def test_cancel_retry_cancel_leaves_the_node_taking_new_work(stack, cluster, member_api):
    """A node once stuck this way: two jobs cancelled while their stage ran on the node's only slot; the next job must
    still run there."""
    from adaptation.models import StageRun

    stack.start_node("alpha/h100-pod", "worker-slot")
    wait_for(node_online("worker-slot"), 60, "node registration")

    def running_on_the_node(job_id):
        return lambda: StageRun.objects.filter(job_id=job_id, status="running").first()

    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_check"]}, format="json")
    job_id = response.json()["id"]
    for attempt in range(2):
        wait_for(running_on_the_node(job_id), 60, f"stage {attempt + 1} to start on the node")
        assert member_api.post(f"/api/jobs/{job_id}/cancel/").json()["status"] == "cancelled"
        if attempt == 0:
            job_id = member_api.post(f"/api/jobs/{job_id}/retry/").json()["id"]
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 90, "the next job on the same node")
    assert job.status == "succeeded", job.error + job.log
    assert job.stage_runs.get().node_name == "worker-slot"


def test_a_stage_message_delivered_again_is_not_run_twice(stack, cluster, member_api):
    """A killed stage's message comes back (acks_late) and ran again for a job long failed."""
    from adaptation import control_messages
    from adaptation.jobs.services import celery_app
    from workers import protocol

    stack.start_node("alpha/h100-pod", "worker-dup")
    node = wait_for(node_online("worker-dup"), 60, "node registration")
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"]}, format="json")
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 60, "the job")
    run = job.stage_runs.get()
    # The same message again, as the broker redelivers it: same task id, same arguments
    celery_app().send_task(protocol.RUN_STAGE, args=control_messages.stage_message(run.pk, "env_probe", {}, node,
                                                                                  run.celery_task_id),
                           queue=node.queue_name, task_id=run.celery_task_id)
    wait_for(lambda: "was delivered again after this node started it" in stack.logs(), 30, "the node to drop it")
    assert f"stage run {run.pk} (task {run.celery_task_id})" in stack.logs()


def test_the_started_tasks_file_keeps_the_newest_ids(tmp_path, monkeypatch):
    from workers import delivered

    monkeypatch.setattr(delivered, "KEEP", 4)
    record = delivered.Delivered(tmp_path)
    assert [record.first_delivery(task) for task in ("a", "b", "a")] == [True, True, False]
    for task in ("c", "d", "e"):
        assert record.first_delivery(task)
    kept = (tmp_path / delivered.FILE_NAME).read_text().split()
    assert kept == ["c", "d", "e"] and record.first_delivery("a")  # the oldest forgotten, the newest kept


@pytest.mark.parametrize("kind", ["env_probe", "env_check"])
def test_an_instant_stage_is_reported_by_its_finished_report_alone(node_in_process, monkeypatch, kind):
    """A probe's job costs the control plane one report, not two: an instant stage (env_probe) sends no "started",
    its finished report carries how long it ran; any other stage says "started" first, then progress."""
    import time

    from workers import protocol

    node, sent = node_in_process.node, node_in_process.sent
    node_key, control_key = node_in_process.node_key, node_in_process.control_key

    def stage(kind, params, progress, data_roots):
        time.sleep(node.PROGRESS_MIN_INTERVAL + 0.05)
        progress(0.5, "on its way")
        return {"ran": kind}

    monkeypatch.setattr(node, "run_engine_stage", stage)
    node.run_stage.apply(args=control_key.message(protocol.RUN_STAGE, node_key.key_id, [7, kind, {}], max_age=60,
                                                  id="task-7"), task_id="task-7")
    tasks = [task for task, _ in sent]
    if kind == "env_probe":
        assert tasks == [protocol.STAGE_PROGRESS, protocol.STAGE_FINISHED]
    else:
        assert tasks == [protocol.STAGE_STARTED, protocol.STAGE_PROGRESS, protocol.STAGE_FINISHED]
    finished = sent[-1][1]
    assert finished["args"] == [7, True, {"ran": kind}, "", ""]
    assert node.PROGRESS_MIN_INTERVAL <= finished["ran_for"] < 10


def test_a_starting_node_names_the_stage_runs_whose_finished_reports_its_outbox_kept(tmp_path):
    """Sent in the registration, so the control plane does not fail those runs as cut short."""
    from workers import protocol, signing
    from workers.node import finished_runs_kept
    from workers.outbox import Outbox

    key = signing.NodeKey.generate()
    box = Outbox(tmp_path / "outbox")
    assert finished_runs_kept(box) == []  # no outbox folder yet: a first start
    box.put(protocol.STAGE_STARTED, key.message(protocol.STAGE_STARTED, [3]))
    box.put(protocol.STAGE_FINISHED, key.message(protocol.STAGE_FINISHED, [3, True, {}, "", ""]))
    box.put(protocol.STAGE_FINISHED, key.message(protocol.STAGE_FINISHED, [5, False, None, "boom", ""]))
    box.put(protocol.STAGE_FINISHED, ["key", "{not json", "signature"])  # not a report it could have signed
    (box.folder / "0-half.json").write_text("{half a messa")  # unreadable: flush sets it aside, never blocks
    assert finished_runs_kept(box) == [3, 5]
    assert len(box.pending()) == 5  # read, not sent or removed: the flush after it sends them


def test_a_process_forked_while_the_outbox_was_locked_can_lock_it_once_it_is_released(tmp_path):
    """The node worker forks a new pool process when one ends (a cancelled stage's); forked while the heartbeat
    thread held the outbox lock, that process once kept the lock through its copy of the descriptor and waited on
    itself at its first report: the node took no further work."""
    import os
    import threading

    from workers.outbox import Outbox

    box = Outbox(tmp_path / "outbox")
    released = tmp_path / "released"
    holding, forked = threading.Event(), threading.Event()

    def heartbeat_thread():
        with box.locked():
            holding.set()
            forked.wait(10)
        released.touch()

    thread = threading.Thread(target=heartbeat_thread)
    thread.start()
    holding.wait(10)
    child = os.fork()
    if child == 0:  # the new pool process: once the parent let go, it may send
        try:
            deadline = time.monotonic() + 10
            while not released.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            with box.locked(wait=False) as held:
                os._exit(0 if held else 1)
        finally:
            os._exit(2)
    forked.set()
    thread.join(10)
    assert os.waitpid(child, 0)[1] >> 8 == 0


def test_the_outbox_keeps_what_the_broker_refused_and_sends_it_oldest_first(tmp_path):
    from workers.outbox import Outbox

    sent, broker_up = [], [False]

    def send(task, message):
        if not broker_up[0]:
            raise ConnectionError("broker away")
        sent.append((task, message))

    box = Outbox(tmp_path / "outbox")
    assert box.deliver("started", ["a"], send, retry_delays=(0.01,)) == 1  # tried again once, then kept
    assert box.deliver("finished", ["b"], send) == 2  # behind the first, never before it
    assert len(box.pending()) == 2 and not list(box.folder.glob("*.tmp"))
    (box.folder / "0-bad.json").write_text("{half a messa")  # sorts first: it must not block the others
    broker_up[0] = True
    assert box.deliver("progress-free", ["c"], send) == 0  # the waiting ones go first, then this one
    assert sent == [("started", ["a"]), ("finished", ["b"]), ("progress-free", ["c"])]
    assert box.pending() == [] and (box.folder / "0-bad.bad").exists()
    with box.locked():  # another sender holds it: a flush that may not wait gives way
        assert box.flush(send, wait=False) == -1


def test_a_node_imports_what_its_stages_run_before_its_pool_forks():
    """The engine imports stage code lazily (the web tier reads its registry without torch); a node imports it at
    start, so a cancel's SIGTERM never lands inside a stage's first import of it."""
    import subprocess
    import sys

    code = ("import sys; from workers import node; node.import_stage_code(); "
            "missing = [name for spec in node.STAGES.values() for name in spec.preload if name not in sys.modules]; "
            "print(missing, 'workers.engine.sweep.backends' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.strip() == "[] True"
