"""The whole adaptation: one submission runs env check, operator coverage, a sharded validation run, and ends in the
engine's serve sweep at the planner's layout scaled to the cluster (through real workers on cluster-like
conditions; the per-stage times are printed and kept in the job log). A cluster with no engine still ends there,
and that stage says how to add one."""

import pytest
from django.test import Client
from django.urls import reverse

from adaptation.intake import services as intake
from adaptation.jobs.placement import stage_assignments
from adaptation.models import AdaptationJob, CoverageReport, EnvReport, Node
from adaptation.serving.services import NO_ENGINE
from tests.conftest import job_status, node_online
from tests.fake_engine import fake_vllm_python
from tests.harness import wait_for

ADD_AN_ENGINE = "no eligible node offers a usable vllm engine (start a node worker with --engine vllm="


@pytest.mark.django_db
def test_without_an_engine_the_adaptation_ends_in_the_serve_sweep_which_says_how_to_add_one(
        team, owner, member_api, cluster, node, broker):
    spec = intake.add_from_catalog(team=team, user=owner, slug="llama-3.1-8b")[0]
    response = member_api.post(f"/api/models/{spec.pk}/adapt/", {"cluster": cluster.pk}, format="json")
    assert response.status_code == 201, response.json()
    # No proxy sweep: its numbers would describe d0's 2-layer stand-in, not the model.
    assert response.json()["stages"] == ["env_check", "op_coverage", "sharded_run", "serve_sweep"]
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    assert "sweep" not in job.parameters and NO_ENGINE in job.log
    # When the checks are done, the serve sweep's placement fails the job with how to add an engine.
    with pytest.raises(ValueError, match=r"start a node worker with --engine vllm="):
        stage_assignments(job, "serve_sweep", [node])


@pytest.mark.django_db
def test_the_demo_models_adaptation_serves_its_real_weights_over_the_variants_and_gates_accuracy(
        team, owner, member_api, cluster, node, broker):
    demo = intake.add_from_catalog(team=team, user=owner, slug="smollm2-135m-instruct")[0]
    response = member_api.post(f"/api/models/{demo.pk}/adapt/", {"cluster": cluster.pk}, format="json")
    assert response.status_code == 201, response.json()
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    serve = job.parameters["serve_sweep"]
    assert serve["demo_weights"] is True and "weights_path" not in serve
    assert serve["variants"] == ["as_shipped", "w8a8-int8", "w4a16"]
    # On a CPU-only cluster the engine starts eager (vLLM CPU's torch.compile warm-up is minutes a start); a cluster
    # with accelerators keeps the engine's compiled default.
    cpu_only = not node.devices.exclude(kind="cpu").exists()
    assert serve["grid"].get("enforce_eager") == ([True] if cpu_only else None), (cpu_only, serve["grid"])
    assert "accuracy gate" in job.log and "no accuracy check" not in job.log
    # A model with no weights on the nodes is served from a validation checkpoint, and the log says what that means.
    llama = intake.add_from_catalog(team=team, user=owner, slug="llama-3.1-8b")[0]
    response = member_api.post(f"/api/models/{llama.pk}/adapt/", {"cluster": cluster.pk}, format="json")
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    assert "demo_weights" not in job.parameters["serve_sweep"] and "variants" not in job.parameters["serve_sweep"]
    assert "no accuracy check: random weights" in job.log


# Qwen3-MoE, and the trillion-scale DeepSeek family this exists for: Kimi-K2 (a model_type transformers does not
# know, resolved as DeepSeek-V3) and DeepSeek-V3 (MLA, which transformers' paged cache cannot serve).
# Kimi-K2 is DeepSeek-V3's architecture under a model_type transformers does not know (d0 resolves it): one run
# covers both the family and the resolution; DeepSeek-V3 itself is served by vLLM in test_serving_vllm.py.
@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("slug", ["qwen3-30b-a3b", "kimi-k2-instruct"])
def test_one_adapt_submission_runs_every_check_and_ends_in_the_serve_sweep(stack, team, owner, member_api, slug):
    cluster = team.clusters.create(name="local", expected_devices_per_node=1)
    stack.start_node("alpha/local", "adapt-node")
    wait_for(node_online("adapt-node"), 60, "node registration")
    spec = intake.add_from_catalog(team=team, user=owner, slug=slug)[0]

    response = member_api.post(f"/api/models/{spec.pk}/adapt/", {"cluster": cluster.pk}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["stages"] == ["env_check", "op_coverage", "sharded_run", "serve_sweep"]
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 14 * 60, "the adaptation")

    runs = {run.kind: run for run in job.stage_runs.all()}
    for kind, run in runs.items():
        print(f"{kind:12s} {run.duration_seconds:6.1f} s on {run.node_name}")
    print(f"{'total':12s} {(job.finished - job.started).total_seconds():6.1f} s")
    assert (job.finished - job.started).total_seconds() < 15 * 60
    assert EnvReport.objects.get(job=job).verdict in ("pass", "warn")
    assert CoverageReport.objects.get(job=job).coverage == 1.0
    assert runs["sharded_run"].result["correct"] is True
    # The node offers no engine: every check passed, and the final stage says how to add one.
    assert set(runs) == {"env_check", "op_coverage", "sharded_run"}
    assert job.status == "failed" and f"Stage serve_sweep cannot be placed: {ADD_AN_ENGINE}" in job.error, job.error


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_adapt_on_two_nodes_serves_the_planners_layout_scaled_to_both(stack, team, owner, member_api, tmp_path):
    """Acceptance 2 of issue 29: two node workers on this machine (own hostnames and state), each offering vLLM.
    Llama-3.1-405B needs more CPU nodes than two: the serve sweep gets the plan's shape scaled to both nodes, and
    the job's log names the layout and the nodes (the engines across nodes are the serving stage's own tests)."""
    cluster = team.clusters.create(name="pair", expected_devices_per_node=1)
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "llama").mkdir(parents=True)
    engine = fake_vllm_python(tmp_path / "engine")
    for hostname in ("pair-a", "pair-b"):
        stack.start_node("alpha/pair", hostname, extra=("--engine", f"vllm={engine}", "--data-root",
                                                        str(checkpoints)))
        wait_for(node_online(hostname), 60, f"{hostname} to register")
    spec = intake.add_from_catalog(team=team, user=owner, slug="llama-3.1-405b")[0]

    outside = member_api.post(f"/api/models/{spec.pk}/adapt/",
                              {"cluster": cluster.pk, "weights_path": str(tmp_path)}, format="json")
    assert outside.status_code == 400 and "serve_sweep.weights_path" in str(outside.json()), outside.json()
    response = member_api.post(f"/api/models/{spec.pk}/adapt/",
                               {"cluster": cluster.pk, "weights_path": str(checkpoints / "llama")}, format="json")
    assert response.status_code == 201, response.json()
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    try:
        serve = job.parameters["serve_sweep"]
        plan = serve["plan"]
        assert plan["planned"]["nodes"] > 2  # 810 GB of bf16 weights: more than two hosts' memory
        assert plan["served"]["nodes"] == serve["node_count"] == 2
        settings = serve["settings"]
        assert settings["tensor_parallel_size"] * settings["pipeline_parallel_size"] * \
            settings["data_parallel_size"] == 2
        assert settings["enable_expert_parallel"] is False and serve["weights_path"] == str(checkpoints / "llama")
        assert plan["why"].endswith("this cluster has 2 CPU nodes of 1 device: serving "
                                    f"tp={settings['tensor_parallel_size']} pp={settings['pipeline_parallel_size']} "
                                    f"dp={settings['data_parallel_size']} ep=1 on 2 nodes, the same shape scaled down")
        assert "the serve sweep serves tp=" in job.log and "on 2 nodes" in job.log and NO_ENGINE not in job.log
        # Where the checks lead: one engine launch per node, node rank 0 first, each told the plan it serves.
        nodes = list(Node.objects.filter(cluster=cluster).order_by("hostname"))
        assigned = stage_assignments(job, "serve_sweep", nodes)
        assert [(node.hostname, params["rendezvous"]["node_rank"]) for node, params in assigned] == [
            ("pair-a", 0), ("pair-b", 1)]
        assert all(params["plan"] == plan and params["settings"] == settings for _, params in assigned)
    finally:
        member_api.post(f"/api/jobs/{job.pk}/cancel/")
        wait_for(job_status(job.pk, "cancelled", "failed", "succeeded"), 60, "the job to end")


@pytest.mark.django_db
def test_the_proxy_sweep_stays_a_stage_one_can_pick_labelled_a_proxy(member):
    client = Client()
    client.force_login(member)
    form = client.get(reverse("job-create")).content.decode()
    assert 'value="sweep"' in form and "Proxy sweep (d0&#x27;s reduced model on transformers, not a serving engine)" \
        in form


def h200_nodes(cluster, count: int) -> None:
    from django.utils import timezone

    for index in range(count):
        node = Node.objects.create(cluster=cluster, hostname=f"h200-{index}", last_heartbeat=timezone.now(),
                                   queue_name=f"d0.node.alpha.{cluster.name}.h200-{index}", status="online")
        for device in range(8):
            node.devices.create(index=device, kind="cuda", name="NVIDIA H200", memory_bytes=141 * 10**9,
                                measured={"copy_bandwidth_bytes_per_s": 4.0e12})


@pytest.mark.django_db
def test_kimi_k2s_sharded_run_keeps_the_plans_expert_parallelism_scaled_to_the_ranks_at_hand(
        team, owner, member_api, cluster, node, broker):
    """Issue 31, item 2: the plan's axes, not TP2 on a copy. On 2 x 8 H200 the Kimi-K2 plan's expert-parallel
    group runs on one node's 8 GPUs; on a CPU node no device holds a share of it (no plan), and the run takes the
    model's own axes, experts spread over ranks included."""
    kimi = intake.add_from_catalog(team=team, user=owner, slug="kimi-k2-instruct")[0]
    pair = team.clusters.create(name="h200-pair")
    h200_nodes(pair, 2)
    response = member_api.post(f"/api/models/{kimi.pk}/adapt/", {"cluster": pair.pk}, format="json")
    assert response.status_code == 201, response.json()
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    sharded = job.parameters["sharded_run"]
    assert "planned" in sharded, job.log
    planned = sharded["planned"]
    assert planned["ep"] > 1 and planned["tp"] * planned["pp"] * planned["dp"] > 8, planned  # more than one node
    # Experts spread over TP x DP in the plan stay spread over this run's group; its pipeline stays a pipeline; all
    # on one node's 8 GPUs.
    world = max(sharded["tp"], sharded["ep"]) * sharded["pp"]
    assert sharded["ep"] > 1 and sharded["tp"] in (1, sharded["ep"]) and world <= 8 and sharded["node_count"] == 1
    assert (sharded["pp"] > 1) == (planned["pp"] > 1)
    assert f"on {world} ranks: the plan scaled to the 8 ranks at hand (" in job.log, job.log
    assert "sharded run uses EP" in job.log

    response = member_api.post(f"/api/models/{kimi.pk}/adapt/", {"cluster": cluster.pk}, format="json")
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    assert job.parameters["sharded_run"] == {"tp": 2, "ep": 2, "node_count": 1}
    assert "sharded run uses EP2 × TP2 on 2 ranks of one node, the model's own axes: there is no plan" in job.log
