"""The job state machine through adaptation.jobs.services, with the broker recorded (no workers here)."""

import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from adaptation.clusters import services as clusters
from adaptation.jobs import services as jobs
from adaptation.models import AdaptationJob, Node, StageRun
from workers import protocol


def submit(cluster, owner, django_capture_on_commit_callbacks, **extra):
    with django_capture_on_commit_callbacks(execute=True):
        return jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"], **extra)


def test_a_submitted_job_is_enqueued_only_after_commit(cluster, owner, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"])
    assert broker.sent == []
    for callback in callbacks:
        callback()
    assert broker.sent == [{"name": protocol.DISPATCH_JOB, "args": [job.pk], "queue": protocol.control_queue(),
                            "task_id": job.celery_task_id}]
    assert job.status == "queued"


def test_dispatch_fans_the_stage_out_to_each_online_node_queue(cluster, owner, node, broker,
                                                               django_capture_on_commit_callbacks):
    second = Node.objects.create(cluster=cluster, hostname="gpu-02", queue_name="q2", last_heartbeat=timezone.now())
    Node.objects.create(cluster=cluster, hostname="gpu-03", queue_name="q3", status="draining")
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.status == "running"
    runs = list(job.stage_runs.order_by("node_name"))
    assert [run.node_name for run in runs] == ["gpu-01", "gpu-02"]
    node_tasks = [task for task in broker.sent if task["name"] == protocol.RUN_STAGE]
    assert sorted(task["queue"] for task in node_tasks) == sorted([node.queue_name, second.queue_name])
    assert {task["task_id"] for task in node_tasks} == {run.celery_task_id for run in runs}


def test_a_job_succeeds_when_every_stage_run_reports_success(cluster, owner, node, broker,
                                                            django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    jobs.dispatch_job(job.pk)
    run = job.stage_runs.get()
    jobs.record_stage_started(run.pk, sender=run.node)
    jobs.record_stage_progress(run.pk, 0.5, "halfway", sender=run.node)
    job.refresh_from_db()
    assert job.progress == pytest.approx(0.5)
    jobs.record_stage_finished(run.pk, True, {"devices": [{"kind": "cpu"}]}, "", "", sender=run.node)
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, job.progress) == ("succeeded", 1.0)
    assert run.result == {"devices": [{"kind": "cpu"}]}
    assert "stage env_probe succeeded on gpu-01" in job.log


def test_a_failed_stage_fails_the_job_with_the_nodes_error(cluster, owner, node, broker,
                                                           django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    jobs.dispatch_job(job.pk)
    run = job.stage_runs.get()
    jobs.record_stage_finished(run.pk, False, None, "RuntimeError: CUDA error", "Traceback ...", sender=run.node)
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error == "Stage env_probe failed on gpu-01: RuntimeError: CUDA error"
    assert job.error_traceback == "Traceback ..."


def test_a_job_fails_at_once_when_the_cluster_has_no_online_node(cluster, owner, broker,
                                                                django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    jobs.dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.status == "failed"
    assert "No online node in cluster 'h100-pod'" in job.error


def test_cancel_revokes_node_work_and_a_late_report_does_not_undo_it(cluster, owner, node, broker,
                                                                    django_capture_on_commit_callbacks):
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    jobs.dispatch_job(job.pk)
    run = job.stage_runs.get()
    jobs.record_stage_started(run.pk, sender=run.node)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.cancel_job(job, owner)
    assert ([run.celery_task_id], True) in broker.revoked
    jobs.record_stage_progress(run.pk, 0.9, "late", sender=run.node)
    jobs.record_stage_finished(run.pk, True, {"late": True}, "", "", sender=run.node)
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, run.status, run.result) == ("cancelled", "cancelled", None)


def test_cancel_of_a_finished_job_is_a_conflict(job, owner, broker):
    job.start()
    job.finish()
    with pytest.raises(jobs.Conflict, match="already succeeded"):
        jobs.cancel_job(job, owner)


def test_retry_makes_a_new_job_with_the_same_inputs(job, owner, broker, django_capture_on_commit_callbacks):
    job.start()
    job.fail("boom")
    with django_capture_on_commit_callbacks(execute=True):
        again = jobs.retry_job(job, owner)
    assert (again.retry_of, again.stages, again.model, again.status) == (job, job.stages, job.model, "queued")
    with pytest.raises(jobs.Conflict):
        jobs.retry_job(again, owner)


def test_the_sweep_marks_a_silent_node_offline_and_fails_its_job(cluster, owner, node, broker, settings,
                                                                 django_capture_on_commit_callbacks):
    settings.D0_NODE_TIMEOUT = 30
    job = submit(cluster, owner, django_capture_on_commit_callbacks)
    jobs.dispatch_job(job.pk)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=31))
    assert jobs.sweep_nodes() == ["gpu-01"]
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.status == "offline"
    assert job.status == "failed"
    assert job.error.startswith("Node gpu-01 went offline (no heartbeat since")
    assert job.stage_runs.get().status == "failed"


def test_the_sweep_leaves_a_node_with_a_recent_heartbeat_alone(node, settings):
    settings.D0_NODE_TIMEOUT = 30
    assert jobs.sweep_nodes() == []
    assert Node.objects.get(pk=node.pk).status == "online"


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
    assert not job.set_progress(0.7)
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
    jobs.dispatch_job(job.pk)
    run = job.stage_runs.get()
    jobs.record_stage_finished(run.pk, True, {"verdict": "pass", "measurements": {"per_device": [
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
    assert jobs.sweep_stuck_stage_runs() == 1
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error == "Stage env_probe on gpu-01 sent no result within 60s; its report was lost."


def _age(model, pk, field, seconds):
    model.objects.filter(pk=pk).update(**{field: timezone.now() - timedelta(seconds=seconds)})


def test_the_reconciler_settles_jobs_a_lost_message_left_behind(cluster, owner, node, broker, settings,
                                                                django_capture_on_commit_callbacks):
    """Issue 15: a dispatch lost with a killed consumer left a job queued forever; a control worker killed between
    storing a stage's end and dispatching the next left it running forever."""
    settings.D0_RECONCILE_AFTER = 60
    lost_dispatch = submit(cluster, owner, django_capture_on_commit_callbacks)
    _age(AdaptationJob, lost_dispatch.pk, "created", 61)
    fresh = submit(cluster, owner, django_capture_on_commit_callbacks)  # its dispatch may still be on the way

    def job_after_its_first_stage(stages, status="succeeded", error=""):
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=stages)
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
    never_advanced = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=["env_probe"])
    never_advanced.start()  # the worker died right after job.start(), before advance_job
    _age(AdaptationJob, never_advanced.pk, "started", 61)
    broker.sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        settled = jobs.reconcile_jobs()
    assert settled == {"dispatched": 1, "advanced": 3, "failed": 1}
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
        assert jobs.reconcile_jobs() == {"dispatched": 0, "advanced": 0, "failed": 0}


def test_a_node_restarted_within_its_timeout_fails_the_stage_its_old_worker_was_running(job, node, broker):
    """Issue 15: the restart is seen by the re-registration, not by a missed heartbeat (it came back in time)."""
    job.start()
    running = job.stage_runs.get()
    running.start()
    _age(StageRun, running.pk, "started", 30)
    queued = StageRun.objects.create(job=job, kind="env_check", node=node, node_name=node.hostname)
    sent = time.time() - 5  # the new worker sent its registration 5 s ago, after the stage had started
    clusters.register_node(node.cluster, node.hostname, {}, [], node=Node.objects.get(pk=node.pk), signed_ts=sent)
    running.refresh_from_db()
    job.refresh_from_db()
    assert running.status == "failed" and "restarted while stage env_probe was running" in running.error
    assert job.status == "failed" and "restarted" in job.error
    assert StageRun.objects.get(pk=queued.pk).status == "cancelled"  # the job failed, so its other runs stop


def test_a_stage_started_after_the_registration_was_sent_is_left_running(job, node):
    job.start()
    run = job.stage_runs.get()
    run.start()
    clusters.register_node(node.cluster, node.hostname, {}, [], node=Node.objects.get(pk=node.pk),
                           signed_ts=time.time() - 60)
    assert StageRun.objects.get(pk=run.pk).status == "running"
