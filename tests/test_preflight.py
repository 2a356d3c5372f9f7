"""Env-check results on the control plane: reports kept per node, devices and links updated, and the pre-flight
gate refusing nodes whose latest check failed or is stale (stages through services, broker recorded)."""

import dataclasses
from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.clusters import services as clusters
from adaptation.jobs import reports
from adaptation.jobs import services as jobs
from adaptation.models import EnvReport, Link
from workers import protocol
from workers.engine import stages
from workers.engine.envcheck import env_check


@pytest.fixture(scope="module")
def report_expecting_eight():
    """A real env check of this machine for a cluster that expects 8 devices per node."""
    return env_check({"expected_devices_per_node": 8, "measure_seconds": 0.05}, lambda *_: None)


@pytest.fixture
def gated_probe(monkeypatch):
    """Stands in for a later, gated stage (op coverage, sharded runs) so the gate can be exercised today."""
    monkeypatch.setitem(stages.STAGES, "env_probe", dataclasses.replace(stages.STAGES["env_probe"], gated=True))


def run_job(cluster, owner, stage, capture, result=None):
    """Submit a one-stage job (the submit dispatches it); if ``result`` is given, report it from the node."""
    with capture(execute=True):
        job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, stages=[stage])
    if result is not None:
        for run in job.stage_runs.all():
            reports.record_stage_started(run.pk, sender=run.node)
            reports.record_stage_finished(run.pk, True, result, "", "", sender=run.node)
    job.refresh_from_db()
    return job


def test_an_env_check_stage_is_told_how_many_devices_the_cluster_expects(cluster, owner, node, broker,
                                                                         django_capture_on_commit_callbacks):
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks)
    [task] = [task for task in broker.sent if task["name"] == protocol.RUN_STAGE]
    assert task["signed"]["args"][1:] == ["env_check", {"expected_devices_per_node": 8}]


def test_a_failed_check_is_stored_and_said_in_the_job_log(cluster, owner, node, broker, report_expecting_eight,
                                                          django_capture_on_commit_callbacks):
    node.devices.update(name="AMD EPYC")
    job = run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, report_expecting_eight)
    assert job.status == "succeeded"
    report = EnvReport.objects.get(node=node)
    assert report.verdict == "fail" and report.job == job
    assert report.failed_checks[0]["message"].startswith("Found 1 CPU device(s) but the cluster expects 8")
    assert ": FAIL (Found 1 CPU device(s) but the cluster expects 8 per node." in job.log
    cpu = node.devices.get(kind="cpu", index=0)
    assert cpu.measured["copy_bandwidth_bytes_per_s"] > 1e8
    assert cpu.measured["matmul_flops_per_s"]["fp32"] > 1e8
    loopback = Link.objects.get(cluster=cluster)
    assert (loopback.kind, loopback.source_device, loopback.target_device) == ("loopback", cpu, cpu)
    assert loopback.measured_bandwidth_gbps > 0


def test_the_gate_refuses_a_node_whose_latest_check_failed(cluster, owner, node, broker, gated_probe,
                                                           report_expecting_eight,
                                                           django_capture_on_commit_callbacks):
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, report_expecting_eight)
    job = run_job(cluster, owner, "env_probe", django_capture_on_commit_callbacks)
    assert job.status == "failed"
    assert job.error.startswith("The pre-flight gate refused every node for stage env_probe: node gpu-01 failed "
                                "its latest env check")
    assert "the cluster expects 8 per node" in job.error
    assert not job.stage_runs.exists()


def test_the_gate_refuses_a_node_never_checked_or_checked_too_long_ago(cluster, owner, node, broker, gated_probe,
                                                                       settings, report_expecting_eight,
                                                                       django_capture_on_commit_callbacks):
    job = run_job(cluster, owner, "env_probe", django_capture_on_commit_callbacks)
    assert "node gpu-01 has no env check yet: run an env_check job first" in job.error
    passing = {**report_expecting_eight, "verdict": "pass"}
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, passing)
    settings.D0_PREFLIGHT_MAX_AGE_HOURS = 24
    EnvReport.objects.update(created=timezone.now() - timedelta(hours=25))
    job = run_job(cluster, owner, "env_probe", django_capture_on_commit_callbacks)
    assert "older than 24 h: run env_check again" in job.error


def test_the_gate_lets_a_recently_passed_node_through_and_skips_a_refused_one(
        cluster, owner, node, broker, gated_probe, report_expecting_eight, django_capture_on_commit_callbacks):
    other = clusters.register_node(cluster, "gpu-02", {}, [])
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, {**report_expecting_eight,
                                                                             "verdict": "warn"})
    EnvReport.objects.filter(node=other).update(verdict="fail")
    job = run_job(cluster, owner, "env_probe", django_capture_on_commit_callbacks)
    assert job.status == "running"
    assert [run.node_name for run in job.stage_runs.all()] == ["gpu-01"]
    assert "pre-flight gate: node gpu-02 failed its latest env check" in job.log


def test_ungated_stages_run_whatever_the_checks_say(cluster, owner, node, broker, report_expecting_eight,
                                                    django_capture_on_commit_callbacks):
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, report_expecting_eight)
    job = run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks)
    assert job.status == "running" and job.stage_runs.count() == 1


def test_env_reports_and_topology_are_in_the_api(cluster, owner, node, broker, member_api, outsider_api,
                                                 report_expecting_eight, django_capture_on_commit_callbacks):
    run_job(cluster, owner, "env_check", django_capture_on_commit_callbacks, report_expecting_eight)
    listed = member_api.get("/api/env-reports/").json()["results"]
    assert [(row["hostname"], row["verdict"]) for row in listed] == [("gpu-01", "fail")]
    assert listed[0]["checks"][0]["name"] == "device_count"
    detail = member_api.get(f"/api/env-reports/{listed[0]['id']}/").json()
    assert "measurements" in detail["report"]
    topology = member_api.get(f"/api/clusters/{cluster.pk}/topology/").json()
    [topology_node] = topology["nodes"]
    assert topology_node["latest_env_check"]["verdict"] == "fail"
    assert topology["links"][0]["kind"] == "loopback"
    assert outsider_api.get(f"/api/env-reports/{listed[0]['id']}/").status_code == 404
    assert outsider_api.get(f"/api/clusters/{cluster.pk}/topology/").status_code == 404
