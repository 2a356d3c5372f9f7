"""The job state machine through adaptation.jobs.services, with the broker recorded (no workers here)."""

import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from adaptation.clusters import services as clusters
from adaptation.clusters import trust
from adaptation.errors import Conflict
from adaptation.jobs import recovery, reports
from adaptation.jobs import services as jobs
from adaptation.models import AdaptationJob, ControlWorker, EnvReport, Node, RejectedNodeMessage, StageRun
from workers import protocol, signing


def submit(cluster, owner, django_capture_on_commit_callbacks, **extra):
    with django_capture_on_commit_callbacks(execute=True):
        return jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"], **extra)


def test_a_submitted_job_starts_with_its_first_stage_on_each_online_node_sent_after_commit(
        cluster, owner, node, broker, django_capture_on_commit_callbacks):
    """The submit dispatches: the job starts and its first stage is queued on every online node (not a draining
    one) in the transaction that creates it; the nodes' messages go only once it commits."""
    Node.objects.create(cluster=cluster, hostname="gpu-02", queue_name="q2", last_heartbeat=timezone.now())
    Node.objects.create(cluster=cluster, hostname="gpu-03", queue_name="q3", status="draining")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe", "env_check"])
    assert broker.sent == []
    for callback in callbacks:
        callback()
    job = AdaptationJob.objects.get(pk=job.pk)
    assert (job.status, job.started is not None) == ("running", True)
    assert "started" in job.log and "stage env_probe queued on gpu-01" in job.log
    runs = list(job.stage_runs.order_by("node_name"))
    assert [(run.kind, run.node_name, run.status) for run in runs] == [("env_probe", "gpu-01", "queued"),
                                                                       ("env_probe", "gpu-02", "queued")]
    assert broker.names() == [protocol.RUN_STAGE] * 2
    assert sorted((task["queue"], task["task_id"], task["signed"]["args"][0]) for task in broker.sent) == sorted(
        (run.node.queue_name, run.celery_task_id, run.pk) for run in runs)


def test_a_job_left_queued_is_dispatched_once(cluster, owner, node, broker, django_capture_on_commit_callbacks):
    """A job made outside a submit (the admin) is left queued; the reconciler dispatches it, and a second dispatch
    racing the first finds it started: the job starts once."""
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_probe"], submitted_by=owner)
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs.dispatch_job(job.pk) is True
        assert jobs.dispatch_job(job.pk) is False
    job.refresh_from_db()
    assert job.status == "running" and job.stage_runs.get().node == node
    assert broker.names() == [protocol.RUN_STAGE]


def test_a_stage_the_broker_would_not_take_fails_its_job_with_that_reason(cluster, owner, node, broker, monkeypatch,
                                                                         django_capture_on_commit_callbacks):
    """Committed but never sent, a stage run would wait in "queued" for ever: its job fails at once, saying why."""
    from kombu.exceptions import OperationalError

    def refused(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(broker, "send_task", refused)
    with django_capture_on_commit_callbacks(execute=True):
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"])
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error.startswith("Stage env_probe could not be sent to gpu-01: the message broker did not take it "
                                "(Error 111 connecting")
    assert job.stage_runs.get().status == "failed"


def test_a_job_succeeds_when_every_stage_run_reports_success(cluster, owner, node, broker,
                                                            django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    run = job.stage_runs.get()
    reports.record_stage_started(run.pk, sender=run.node)
    reports.record_stage_progress(run.pk, 0.5, "halfway", sender=run.node)
    job.refresh_from_db()
    assert job.progress == pytest.approx(0.5)
    reports.record_stage_finished(run.pk, True, {"devices": [{"kind": "cpu"}]}, "", "", sender=run.node)
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, job.progress) == ("succeeded", 1.0)
    assert run.result == {"devices": [{"kind": "cpu"}]}
    assert "stage env_probe succeeded on gpu-01" in job.log


@pytest.mark.parametrize("verdict", [{"verdict": "confirmed", "winner": {"median": 1.0}}, ["pass"], 3, None])
def test_a_result_whose_verdict_is_no_env_check_verdict_still_ends_the_stage(cluster, owner, node, broker, verdict,
                                                                            django_capture_on_commit_callbacks):
    """A sweep's verdict is an object (its judgement of the pick), and a node may send anything: the job's log line
    names only an env check's verdict, and the job goes on whatever the field holds."""
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    run = job.stage_runs.get()
    reports.record_stage_finished(run.pk, True, {"devices": [], "verdict": verdict}, "", "", sender=run.node)
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert job.log.rstrip().endswith("succeeded") and "s: " not in job.log.splitlines()[-2]


def test_a_stage_that_sent_no_started_report_is_dated_by_how_long_it_ran(cluster, owner, node, broker,
                                                                        django_capture_on_commit_callbacks):
    """A node says "started" only after half a second; a shorter stage's finished report says how long it ran."""
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    run = job.stage_runs.get()
    reports.record_stage_finished(run.pk, True, {"devices": []}, "", "", sender=run.node, ran_for=0.25)
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.status == "succeeded"
    assert (run.finished - run.started).total_seconds() == pytest.approx(0.25, abs=0.05)
    assert "stage env_probe succeeded on gpu-01 in 0.2s" in job.log or "in 0.3s" in job.log


def test_a_finished_report_carries_its_duration_signed_and_checked(node):
    """``ran_for`` is read from the signed payload; a value that is no duration is ignored, not trusted."""
    key = signing.NodeKey.generate()
    Node.objects.filter(pk=node.pk).update(public_key=key.public_key, key_id=key.key_id)
    for value, read in ((1.5, 1.5), (0, 0.0), (-3, None), (float("nan"), None), ("9", None), (True, None)):
        message = key.message(protocol.STAGE_FINISHED, [1, True, {}, "", ""], ran_for=value)
        assert trust.sender_of(protocol.STAGE_FINISHED, message).ran_for == read


def test_a_failed_stage_fails_the_job_with_the_nodes_error(cluster, owner, node, broker,
                                                           django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    run = job.stage_runs.get()
    reports.record_stage_finished(run.pk, False, None, "RuntimeError: CUDA error", "Traceback ...", sender=run.node)
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error == "Stage env_probe failed on gpu-01: RuntimeError: CUDA error"
    assert job.error_traceback == "Traceback ..."


def test_a_job_fails_at_once_when_the_cluster_has_no_online_node(cluster, owner, broker,
                                                                django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.status == "failed"
    assert "No online node in cluster 'h100-pod'" in job.error


def test_cancel_revokes_node_work_and_a_late_report_does_not_undo_it(cluster, owner, node, broker,
                                                                    django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    run = job.stage_runs.get()
    reports.record_stage_started(run.pk, sender=run.node)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.cancel_job(job, owner)
    assert ([run.celery_task_id], True) in broker.revoked
    reports.record_stage_progress(run.pk, 0.9, "late", sender=run.node)
    reports.record_stage_finished(run.pk, True, {"late": True}, "", "", sender=run.node)
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, run.status, run.result) == ("cancelled", "cancelled", None)


def test_cancel_of_a_finished_job_is_a_conflict(job, owner, broker):
    job.start()
    job.finish()
    with pytest.raises(Conflict, match="already succeeded"):
        jobs.cancel_job(job, owner)


def test_retry_makes_a_new_job_with_the_same_inputs(job, owner, broker, django_capture_on_commit_callbacks):
    job.start()
    job.fail("boom")
    with django_capture_on_commit_callbacks(execute=True):
        again = jobs.retry_job(job, owner)
    assert (again.retry_of, again.stages, again.model, again.status) == (job, job.stages, job.model, "running")
    with pytest.raises(Conflict):
        jobs.retry_job(again, owner)


def control_worker(name, *, seen, listening):
    """A control worker whose latest sweep was ``seen`` seconds ago, the control plane listening since
    ``listening`` seconds ago as it recorded then."""
    now = timezone.now()
    return ControlWorker.objects.create(name=name, last_seen=now - timedelta(seconds=seen),
                                        listening_since=now - timedelta(seconds=listening))


@pytest.fixture
def listening():
    """The control plane has heard heartbeats for an hour: the sweep may blame a silent node."""
    return control_worker("control@a", seen=1, listening=3600)


def test_the_sweep_marks_a_silent_node_offline_and_fails_its_job(cluster, owner, node, broker, settings, listening,
                                                                 django_capture_on_commit_callbacks):
    settings.D0_NODE_TIMEOUT = 30
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=31))
    assert recovery.mark_silent_nodes_offline() == ["gpu-01"]
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.status == "offline"
    assert job.status == "failed"
    assert job.error.startswith("Node gpu-01 went offline (no heartbeat since")
    assert job.stage_runs.get().status == "failed"


def test_the_sweep_leaves_a_node_with_a_recent_heartbeat_alone(node, settings, listening):
    settings.D0_NODE_TIMEOUT = 30
    assert recovery.mark_silent_nodes_offline() == []
    assert Node.objects.get(pk=node.pk).status == "online"


def test_the_sweep_blames_no_node_for_silence_the_control_plane_could_not_hear(job, node, settings, caplog):
    """After the control worker was down (or the broker away) longer than the node timeout, its first
    sweep ran before the node's first fresh heartbeat was taken, and a live node was marked offline."""
    settings.D0_NODE_TIMEOUT, settings.D0_LIVENESS_INTERVAL = 30, 10
    job.start()
    job.stage_runs.get().start()
    control_worker("control@a", seen=60, listening=3600)  # its previous sweep: a minute ago, then it was down
    _age(Node, node.pk, "last_heartbeat", 45)
    recovery.control_worker_seen("control@a")
    with caplog.at_level("INFO", logger="adaptation.jobs.recovery"):
        assert recovery.mark_silent_nodes_offline() == []
    assert "less than the node timeout" in caplog.text
    assert Node.objects.get(pk=node.pk).status == "online"
    assert AdaptationJob.objects.get(pk=job.pk).status == "running"

    # The control plane has now listened for the whole timeout and still heard nothing from the node.
    ControlWorker.objects.update(listening_since=timezone.now() - timedelta(seconds=31))
    recovery.control_worker_seen("control@a")
    assert recovery.mark_silent_nodes_offline() == ["gpu-01"]
    assert AdaptationJob.objects.get(pk=job.pk).status == "failed"


def test_a_control_worker_up_all_along_heard_the_heartbeats_while_another_was_down(node, settings):
    """Listening is the control plane's, not one worker's: the beat sends each sweep to one control worker, and
    one that was up all along took the heartbeats while the other was down."""
    settings.D0_NODE_TIMEOUT, settings.D0_LIVENESS_INTERVAL = 30, 10
    steady = control_worker("control@a", seen=5, listening=3600)
    control_worker("control@b", seen=600, listening=7200)  # down for ten minutes, back now
    _age(Node, node.pk, "last_heartbeat", 45)
    recovery.control_worker_seen("control@b")
    assert ControlWorker.objects.get(name="control@b").listening_since == steady.listening_since
    assert recovery.mark_silent_nodes_offline() == ["gpu-01"]
    assert Node.objects.get(pk=node.pk).status == "offline"


def test_a_sweep_within_the_schedule_keeps_listening_and_one_after_a_gap_starts_again(db, settings):
    settings.D0_LIVENESS_INTERVAL = 10
    control_worker("control@a", seen=20, listening=3600)  # a sweep or two late: the worker was busy
    recovery.control_worker_seen("control@a")
    assert timezone.now() - recovery.listening_since() > timedelta(seconds=3500)
    ControlWorker.objects.update(last_seen=timezone.now() - timedelta(seconds=26))  # more than 2 intervals + 5 s
    assert recovery.listening_since() is None  # nobody listens now
    recovery.control_worker_seen("control@a")
    assert timezone.now() - recovery.listening_since() < timedelta(seconds=5)


def test_a_heartbeat_brings_an_offline_node_back(node):
    Node.objects.filter(pk=node.pk).update(status="offline")
    clusters.record_heartbeat(node)
    assert Node.objects.get(pk=node.pk).status == "online"


def test_registration_creates_the_node_and_keeps_its_device_list_current(cluster):
    devices = [{"index": 0, "kind": "cpu", "name": "EPYC", "memory_bytes": 10},
               {"index": 0, "kind": "cuda", "name": "H100", "memory_bytes": 80 * 2**30}]
    node = clusters.register_node(cluster, "gpu-09", {"cpu_model": "EPYC"}, devices)
    assert sorted(node.devices.values_list("kind", flat=True)) == ["cpu", "cuda"]
    clusters.register_node(cluster, "gpu-09", {}, devices[:1], node=node)
    assert list(node.devices.values_list("kind", flat=True)) == ["cpu"]
    node = Node.objects.get(hostname="gpu-09")
    assert node.status == "online"
    assert node.queue_name == "d0.node.alpha.h100-pod.gpu-09"  # named by the control plane, not by the node


def test_registration_keeps_a_draining_node_draining(node):
    Node.objects.filter(pk=node.pk).update(status="draining")
    clusters.register_node(node.cluster, "gpu-01", {}, [], node=Node.objects.get(pk=node.pk))
    assert Node.objects.get(pk=node.pk).status == "draining"


def test_status_changes_are_conditional(job):
    assert job.start()
    assert not job.start()
    assert job.cancel()
    assert not job.finish()
    assert not AdaptationJob.objects.filter(pk=job.pk).set_progress(0.7)
    assert AdaptationJob.objects.get(pk=job.pk).status == "cancelled"


def test_a_job_rejects_unknown_or_repeated_stages(cluster, owner):
    with pytest.raises(ValidationError) as error:
        jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe", "env_probe"])
    assert "Each stage can appear only once." in error.value.message_dict["stages"]
    with pytest.raises(ValidationError, match="Unknown stage"):
        jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["teleport"])


def test_a_stage_run_status_change_leaves_other_rows_alone(job):
    run = StageRun.objects.get(job=job)
    assert run.start() and run.finish(result={"ok": 1})
    assert AdaptationJob.objects.get(pk=job.pk).status == "queued"


def test_a_result_that_cannot_be_stored_fails_the_job_instead_of_leaving_it_running(
        cluster, owner, node, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_check"])
    run = job.stage_runs.get()
    reports.record_stage_finished(run.pk, True, {"verdict": "pass", "measurements": {"per_device": [
        {"device": "not-a-label"}]}}, "", "", sender=run.node)
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error.startswith("Stage env_check on gpu-01 finished, but its result could not be stored: ValueError")


def test_a_stage_run_whose_report_was_lost_is_failed_by_the_sweep(job, settings):
    settings.D0_STAGE_TIMEOUT = 60
    job.start()
    run = job.stage_runs.get()
    run.start()
    StageRun.objects.filter(pk=run.pk).update(started=timezone.now() - timedelta(seconds=61))
    assert recovery.fail_overdue_stage_runs() == 1
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error == "Stage env_probe on gpu-01 sent no result within 60s; its report was lost."


def _age(model, pk, field, seconds):
    model.objects.filter(pk=pk).update(**{field: timezone.now() - timedelta(seconds=seconds)})


def test_the_reconciler_settles_jobs_a_lost_message_left_behind(cluster, owner, node, broker, settings,
                                                                django_capture_on_commit_callbacks):
    """A dispatch lost with a killed consumer left a job queued forever; a control worker killed between
    storing a stage's end and dispatching the next left it running forever."""
    settings.D0_RECONCILE_AFTER = 60

    def created(stages=("env_probe",)):
        """A job row left queued (made outside a submit: nothing dispatched it)."""
        return AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=list(stages), submitted_by=owner)

    lost_dispatch = created()
    _age(AdaptationJob, lost_dispatch.pk, "created", 61)
    fresh = created()  # its dispatch may still be on the way

    def job_after_its_first_stage(stages, status="succeeded", error=""):
        job = created(stages)
        job.start()
        run = StageRun.objects.create(job=job, kind=stages[0], node=node, node_name=node.hostname)
        run.start()
        run.finish(result={"devices": []}) if status == "succeeded" else run.fail(error)
        _age(AdaptationJob, job.pk, "started", 120)
        _age(StageRun, run.pk, "finished", 61)
        return job

    lost_advance = job_after_its_first_stage(["env_probe", "env_check"])
    lost_finish = job_after_its_first_stage(["env_probe"])
    lost_failure = job_after_its_first_stage(["env_probe"], status="failed", error="node said: disk full")
    never_advanced = created()
    never_advanced.start()  # the worker died right after job.start(), before advance_job
    _age(AdaptationJob, never_advanced.pk, "started", 61)
    broker.sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        settled = recovery.reconcile_jobs()
    assert settled == {"dispatched": 1, "resent": 0, "advanced": 3, "failed": 1}
    status = {job.pk: job.status for job in AdaptationJob.objects.all()}
    assert status[lost_dispatch.pk] == "running" and status[fresh.pk] == "queued"
    assert status[lost_finish.pk] == "succeeded"
    assert status[lost_advance.pk] == "running"
    assert lost_advance.stage_runs.get(kind="env_check").status == "queued"  # the next stage, dispatched
    failed = AdaptationJob.objects.get(pk=lost_failure.pk)
    assert failed.status == "failed" and failed.error == "node said: disk full"
    assert status[never_advanced.pk] == "running" and never_advanced.stage_runs.count() == 1
    assert sorted(task["name"] for task in broker.sent) == [protocol.RUN_STAGE] * 3
    # Once settled, a second sweep finds nothing to do
    with django_capture_on_commit_callbacks(execute=True):
        assert recovery.reconcile_jobs() == {"dispatched": 0, "resent": 0, "advanced": 0, "failed": 0}


def test_a_node_restarted_within_its_timeout_fails_the_stage_its_old_worker_was_running(job, node, broker):
    """The restart is seen by the re-registration, not by a missed heartbeat (it came back in time)."""
    job.start()
    running = job.stage_runs.get()
    running.start()
    _age(StageRun, running.pk, "started", 30)
    queued = StageRun.objects.create(job=job, kind="env_check", node=node, node_name=node.hostname)
    sent = time.time() - 5  # the new worker sent its registration 5 s ago, after the stage had started
    registered = clusters.register_node(node.cluster, node.hostname, {}, [], node=Node.objects.get(pk=node.pk),
                                        signed_ts=sent)
    recovery.node_registered(registered, sent)
    running.refresh_from_db()
    job.refresh_from_db()
    assert running.status == "failed" and "restarted while stage env_probe was running" in running.error
    assert job.status == "failed" and "restarted" in job.error
    assert StageRun.objects.get(pk=queued.pk).status == "cancelled"  # the job failed, so its other runs stop


def test_a_stage_started_after_the_registration_was_sent_is_left_running(job, node):
    job.start()
    run = job.stage_runs.get()
    run.start()
    sent = time.time() - 60
    registered = clusters.register_node(node.cluster, node.hostname, {}, [], node=Node.objects.get(pk=node.pk),
                                        signed_ts=sent)
    recovery.node_registered(registered, sent)
    assert StageRun.objects.get(pk=run.pk).status == "running"


def signed_registration(node, key, **claim):
    """A known node's registration as its worker sends it (workers/node.py ``registration``), made by hand."""
    payload = signing.encode_payload({"task": protocol.REGISTER_NODE, "ts": time.time(),
                                      "cluster": node.cluster.join_name, "hostname": node.hostname,
                                      "public_key": key.public_key, "host_facts": {}, "devices": [], **claim})
    return [payload, key.sign(payload), "", ""]


@pytest.fixture
def keyed_node(node):
    key = signing.NodeKey.generate()
    Node.objects.filter(pk=node.pk).update(public_key=key.public_key, key_id=signing.key_id(key.public_key))
    return node, key


def running_run(job):
    run = job.stage_runs.get()
    job.start()
    run.start()
    _age(StageRun, run.pk, "started", 30)  # the old worker started it before the restart
    return run


def test_a_restart_leaves_the_runs_whose_kept_finished_reports_it_sent_first_to_those_reports(
        job, cluster, owner, model_spec, keyed_node):
    """The node sends the finished reports its outbox kept, then registers; two control processes may
    take both at once, and the registration's "restarted" must not win over the real result."""
    node, key = keyed_node
    reported = running_run(job)
    other_job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec,
                                             stages=["env_probe"], submitted_by=owner)
    StageRun.objects.create(job=other_job, kind="env_probe", node=node, node_name=node.hostname)
    cut_short = running_run(other_job)
    registration = trust.register(signed_registration(node, key, finished_runs=[reported.pk]))
    assert registration is not None
    recovery.node_registered(registration.node, registration.signed_ts, registration.finished_runs)
    assert StageRun.objects.get(pk=reported.pk).status == "running"  # its report is on its way
    cut_short.refresh_from_db()
    assert cut_short.status == "failed" and "restarted while stage env_probe was running" in cut_short.error


@pytest.mark.parametrize("finished_runs", ["7", [7, "8"], [True], list(range(protocol.MAX_FINISHED_RUNS + 1))])
def test_a_registration_with_malformed_finished_runs_is_refused(job, keyed_node, finished_runs):
    node, key = keyed_node
    run = running_run(job)
    assert trust.register(signed_registration(node, key, finished_runs=finished_runs)) is None
    assert RejectedNodeMessage.objects.filter(reason="registration's finished runs are malformed").exists()
    assert StageRun.objects.get(pk=run.pk).status == "running"  # nothing applied


def test_a_stage_run_whose_message_never_left_is_sent_again_once_as_it_was(cluster, owner, node, model_spec, broker,
                                                                          settings, django_capture_on_commit_callbacks):
    """The process that committed a stage run died before sending its message (a sub-millisecond window after the
    COMMIT): queued past the reconcile delay on an online node that runs nothing, the run's message is sent once
    more, same task id, same parameters (a sharded run's rendezvous included). A run queued behind a busy node's
    stage is left alone: its message waits in the node's queue."""
    settings.D0_RECONCILE_AFTER = 60
    second = Node.objects.create(cluster=cluster, hostname="gpu-02", queue_name="q2", last_heartbeat=timezone.now())
    third = Node.objects.create(cluster=cluster, hostname="gpu-03", queue_name="q3", last_heartbeat=timezone.now())
    checked = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_check"], status="succeeded")
    for each in (node, second):  # the pre-flight gate lets a node with a passing env check run sharded_run
        run = StageRun.objects.create(job=checked, kind="env_check", node=each, node_name=each.hostname,
                                      status="succeeded")
        EnvReport.objects.create(node=each, job=checked, stage_run=run, verdict="pass", report={"checks": []})
    with django_capture_on_commit_callbacks(execute=True):
        sharded = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=model_spec,
                                  stages=["sharded_run"], parameters={"sharded_run": {"tp": 2, "node_count": 2}})
        probe = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"],
                                parameters={"nodes": ["gpu-03"]})
    first_sent = {task["task_id"]: task for task in broker.sent}
    assert len(first_sent) == 3
    broker.sent.clear()
    StageRun.objects.update(created=timezone.now() - timedelta(seconds=61))  # every message "lost"
    busy = StageRun.objects.get(job=probe)  # gpu-03 is running something: its queued work waits behind it
    other = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_probe"], status="running")
    StageRun.objects.create(job=other, kind="env_probe", node=third, node_name="gpu-03", status="running")

    with django_capture_on_commit_callbacks(execute=True):
        assert recovery.reconcile_jobs()["resent"] == 2
    runs = list(StageRun.objects.filter(job=sharded).order_by("id"))
    assert [run.node for run in runs] == [node, second]
    assert sorted(task["task_id"] for task in broker.sent) == sorted(run.celery_task_id for run in runs)
    for task in broker.sent:  # the same queue, arguments and rendezvous (signed afresh)
        first = first_sent[task["task_id"]]
        assert (task["queue"], task["signed"]["args"]) == (first["queue"], first["signed"]["args"])
    assert StageRun.objects.get(pk=busy.pk).message == ""
    assert AdaptationJob.objects.get(pk=sharded.pk).log.count("message sent again") == 2
    broker.sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert recovery.reconcile_jobs()["resent"] == 0  # once
    assert broker.sent == []
