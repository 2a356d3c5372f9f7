"""One engine deployment across two node workers: each its own hostname, state folder and CPU, joined to one
cluster on this machine, serving through vLLM's own multi-node mechanism (``--nnodes/--node-rank`` for TP across
nodes, ``--data-parallel-*`` for DP), driven by real Celery workers. Every way a deployment ends is checked for
what it leaves: no engine process on either node.

Each engine start costs 40-100 s here, so the tests start as few as prove the point (``enforce_eager``, one
configuration each)."""

import signal
import time

import psutil
import pytest

from adaptation.models import AdaptationJob, Node, StageRun
from tests.conftest import job_status, node_online
from tests.harness import wait_for
from tests.test_serving_vllm import engine_processes
from tests.test_sharded_jobs import passing_env_check

EAGER = {"enforce_eager": True}
SMALL = {"requests": 4, "prompt_len": 16, "output_len": 8}


def two_nodes(stack, team, vllm_python, prefix: str) -> tuple:
    """Two node workers offering vLLM, reachable at 127.0.0.1, each engine bound to a CPU of its own, each past
    the pre-flight gate (a passing env check row: the env check job itself is tested elsewhere)."""
    cluster = team.clusters.create(name=f"{prefix}-pod", expected_devices_per_node=1)
    nodes = []
    for index, hostname in enumerate((f"{prefix}-a", f"{prefix}-b")):
        stack.start_node(f"alpha/{prefix}-pod", hostname, extra=("--engine", f"vllm={vllm_python}",
                                                                  "--address", "127.0.0.1"),
                         env={"VLLM_CPU_OMP_THREADS_BIND": str(index)})
    for hostname in (f"{prefix}-a", f"{prefix}-b"):
        node = wait_for(node_online(hostname), 60, f"{hostname} to register")
        wait_for(lambda node=node: Node.objects.get(pk=node.pk).host_facts.get("engines"), 30, "the engine probe")
        passing_env_check(node)
        nodes.append(node)
    return cluster, nodes


def submit(api, cluster, spec, **serve) -> int:
    response = api.post("/api/jobs/", {"cluster": cluster.pk, "model": spec.pk, "stages": ["serve_sweep"],
                                       "parameters": {"serve_sweep": {"node_count": 2, "settings": EAGER,
                                                                      "grid": {"max_num_seqs": [2]},
                                                                      "workload": SMALL, **serve}}}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def catalog_model(team, owner, slug: str):
    from adaptation.intake import services as intake

    return intake.add_from_catalog(team=team, user=owner, slug=slug)[0]


def finished(job_id: int, timeout: float) -> AdaptationJob:
    return wait_for(job_status(job_id, "succeeded", "failed", "cancelled"), timeout, "the job to end")


def no_engine_left() -> None:
    wait_for(lambda: not engine_processes(), 60, "every engine process on both nodes to end")


@pytest.mark.workers
@pytest.mark.timeout(20 * 60)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layout, correctness", [({"tensor_parallel_size": 2}, True),
                                                 ({"data_parallel_size": 2}, False)])
def test_a_layout_over_two_nodes_serves_its_workload_is_correct_and_leaves_no_engine(
        stack, team, owner, member_api, vllm_python, layout, correctness):
    from adaptation.jobs.outcomes import outcome

    cluster, nodes = two_nodes(stack, team, vllm_python, "mn")
    spec = catalog_model(team, owner, "llama-3.1-8b")
    job = finished(submit(member_api, cluster, spec, settings={**EAGER, **layout}, correctness=correctness), 15 * 60)
    assert job.status == "succeeded", job.error + job.log
    leader, follower = job.stage_runs.order_by("id")
    assert (leader.node_name, follower.node_name) == ("mn-a", "mn-b")
    result = leader.result
    assert result["deployment"]["nodes"] == 2 and result["deployment"]["hostnames"] == ["mn-a", "mn-b"]
    assert result["deployment"]["split"] == ("nnodes" if "tensor_parallel_size" in layout else "dp")
    [trial] = result["trials"]
    assert trial["status"] == "ok" and trial["metrics"]["completed"] == SMALL["requests"]
    flags = ("--nnodes 2 --node-rank 0" if "tensor_parallel_size" in layout else "--data-parallel-size-local 1")
    assert flags in trial["command"]
    assert follower.result["role"] == "follower" and follower.result["engine_starts"] >= 1
    assert "--headless" in follower.result["starts"][0]["command"]
    if correctness:
        # TP=2 over two nodes against the same engine at TP=1 and against transformers, greedy tokens equal
        assert result["correctness"]["verdict"] == "agree", result["correctness"]
        assert follower.result["engine_starts"] == 2  # the sweep's start and the correctness check's
    summary = outcome(leader)["summary"]
    shape = "tp=2" if "tensor_parallel_size" in layout else "dp=2"
    assert f"at {shape} over 2 nodes (mn-a, mn-b)" in summary, summary
    assert "of the deployment" in outcome(follower)["summary"]
    no_engine_left()


@pytest.mark.workers
@pytest.mark.timeout(15 * 60)
@pytest.mark.django_db(transaction=True)
def test_expert_parallel_over_two_nodes_fails_within_its_deadline_naming_the_node_and_the_engines_line(
        stack, team, owner, member_api, vllm_python):
    """On vLLM's CPU build a follower's expert-parallel worker dies at the first request: the trial fails with that
    node and its engine's own line, not as slow requests, and the stage with it."""
    cluster, _ = two_nodes(stack, team, vllm_python, "ep")
    spec = catalog_model(team, owner, "qwen3-30b-a3b")
    started = time.monotonic()
    job = finished(submit(member_api, cluster, spec, correctness=False, startup_timeout_s=400,
                          settings={**EAGER, "tensor_parallel_size": 2, "enable_expert_parallel": True}), 12 * 60)
    assert time.monotonic() - started < 10 * 60
    assert job.status == "failed"
    assert "node rank 1 (ep-b)" in job.error and "the log says:" in job.error, job.error
    leader = job.stage_runs.get(node_name="ep-a")
    if leader.result:  # the failed run stores no result; its error carries the trial's cause
        assert not [trial for trial in leader.result.get("trials", []) if trial["status"] == "ok"]
    no_engine_left()


def headless_engine() -> psutil.Process | None:
    """Node rank 1's engine: the process d0 started with --headless (its children inherit D0_ENGINE_RUN; its
    parent, the stage, does not)."""
    for process in engine_processes():
        try:
            if "--headless" in process.cmdline() and "D0_ENGINE_RUN" not in process.parent().environ():
                return process
        except psutil.Error:
            continue
    return None


@pytest.mark.workers
@pytest.mark.timeout(15 * 60)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("end", ["cancel", "sigkill rank 1's engine"])
def test_a_deployment_ended_mid_trial_ends_within_a_minute_with_the_reason_and_no_engine_left(
        stack, team, owner, member_api, vllm_python, end):
    cluster, _ = two_nodes(stack, team, vllm_python, "mid")
    spec = catalog_model(team, owner, "llama-3.1-8b")
    job_id = submit(member_api, cluster, spec, correctness=False, settings={**EAGER, "tensor_parallel_size": 2},
                    workload={"requests": 400, "prompt_len": 32, "output_len": 64})
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, message__startswith="configuration 1 of 1: serving")
             .first(), 10 * 60, "the trial to be serving")
    started = time.monotonic()
    if end == "cancel":
        assert member_api.post(f"/api/jobs/{job_id}/cancel/").status_code == 200
        job = wait_for(job_status(job_id, "cancelled"), 60, "the job to be cancelled")
    else:
        engine = wait_for(headless_engine, 30, "node rank 1's engine")
        engine.send_signal(signal.SIGKILL)
        job = wait_for(job_status(job_id, "failed"), 60, "the stage to fail")
        assert "node rank 1 (mid-b)" in job.error and "killed by a signal" in job.error, job.error
    assert time.monotonic() - started < 60
    no_engine_left()
    assert job.status in ("cancelled", "failed")


@pytest.mark.workers
@pytest.mark.timeout(10 * 60)
@pytest.mark.django_db(transaction=True)
def test_a_deployment_whose_node_never_joins_fails_within_its_deadline_naming_that_node(
        stack, team, owner, member_api, vllm_python):
    """Node mn-b is busy (a hung sharded run holds its one worker process), so its share of the deployment never
    starts: node rank 0 gives up at the join deadline, naming it, and starts no engine."""
    cluster, nodes = two_nodes(stack, team, vllm_python, "join")
    busy = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": catalog_model(team, owner, "llama-3.2-1b").pk,
                                          "stages": ["sharded_run"],
                                          "parameters": {"nodes": ["join-b"], "sharded_run": {
                                              "tp": 2, "fault": "hang_rank_0", "timeout_s": 300}}}, format="json")
    assert busy.status_code == 201, busy.json()
    wait_for(lambda: StageRun.objects.filter(job_id=busy.json()["id"], status="running").first(), 120,
             "join-b to be busy")
    started = time.monotonic()
    job = finished(submit(member_api, cluster, catalog_model(team, owner, "llama-3.1-8b"), join_timeout_s=20,
                          correctness=False, settings={**EAGER, "tensor_parallel_size": 2}), 3 * 60)
    assert job.status == "failed"
    assert "node rank 1 (join-b) never joined the deployment within 20 s" in job.error, job.error
    assert time.monotonic() - started < 90
    assert not engine_processes()
    member_api.post(f"/api/jobs/{busy.json()['id']}/cancel/")
