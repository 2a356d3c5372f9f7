"""Sharded runs as jobs: submitted through the API, run by real Celery workers on real Redis and PostgreSQL, the
engine's report stored on the stage run and shown on the run and comparison pages.

Sharded runs are gated stages; instead of an env_check job (tested with the gate elsewhere) each node gets a
passing EnvReport row. Models are the shipped config.json files, which the engine reduces through the one model
path (every layer kind, the release's head dims).
"""

import json
import re
import time
from pathlib import Path

import psutil
import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from adaptation.models import AdaptationJob, EnvReport, ModelSpec, Node, StageRun
from adaptation.sharding.stage import ShardedRun
from tests.harness import wait_for
from tests.test_query_counts import queries_for
from tests.conftest import job_status, node_online
from workers.engine.sharding import run_sharded

CATALOG = Path(__file__).resolve().parents[1] / "adaptation" / "intake" / "catalog" / "configs"
# A run of two CPU ranks takes seconds; this leaves room for a machine whose cores other tests share.
RUN_DEADLINE = 120


def catalog_config(slug: str) -> dict:
    return json.loads((CATALOG / f"{slug}.json").read_text())


def through_workers(test):
    return pytest.mark.workers(pytest.mark.django_db(transaction=True)(test))


def model(team, user, slug: str) -> ModelSpec:
    return ModelSpec.objects.create(team=team, name=slug, config=catalog_config(slug), created_by=user)


def passing_env_check(node: Node) -> EnvReport:
    """What a passing env_check job leaves behind, so the pre-flight gate lets the node run sharded_run."""
    job = AdaptationJob.objects.create(team=node.cluster.team, cluster=node.cluster, stages=["env_check"],
                                       status="succeeded")
    run = StageRun.objects.create(job=job, kind="env_check", node=node, node_name=node.hostname, status="succeeded")
    return EnvReport.objects.create(node=node, job=job, stage_run=run, verdict="pass", report={"checks": []})


def start_gated_node(stack, hostname: str) -> Node:
    stack.start_node("alpha/h100-pod", hostname)
    node = wait_for(node_online(hostname), 60, f"{hostname} to register")
    passing_env_check(node)
    return node


def submit_sharded_run(api, cluster, spec, **parameters) -> AdaptationJob:
    response = api.post("/api/jobs/", {"cluster": cluster.pk, "model": spec.pk, "stages": ["sharded_run"],
                                       "parameters": {"sharded_run": parameters}}, format="json")
    assert response.status_code == 201, response.json()
    return wait_for(job_status(response.json()["id"], "succeeded", "failed", "cancelled"), RUN_DEADLINE,
                    f"the sharded run {parameters} to finish")


def assert_matches_the_fp32_reference(report: dict) -> None:
    assert report["correct"], {key: report[key] for key in ("max_abs_diff", "greedy_tokens_matching", "tokens")}
    assert report["max_abs_diff"] <= 1e-4
    assert report["greedy_match"] and report["greedy_tokens"] == 17  # the prefill's token + 16 decode steps
    assert report["tokens"]["sharded"] == report["tokens"]["reference"]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


LAYOUTS = [
    # (catalog config, layout): dense and MoE under tensor parallelism, a pipeline, experts spread over ranks.
    ("llama-3.2-1b", {"tp": 2}),
    ("llama-3.2-1b", {"pp": 2}),
    ("mixtral-8x7b-v0.1", {"tp": 2}),
    ("qwen3-30b-a3b", {"ep": 2}),
]


@through_workers
def test_each_layout_runs_as_a_celery_job_on_two_cpu_processes_and_matches_the_reference(
        stack, cluster, team, owner, member, member_api):
    start_gated_node(stack, "shard-node")
    specs = {slug: model(team, owner, slug) for slug in dict(LAYOUTS)}
    figures = []
    for slug, layout in LAYOUTS:
        job = submit_sharded_run(member_api, cluster, specs[slug], **layout, dtype="fp32", decode_steps=16)
        assert job.status == "succeeded", job.error
        run = job.stage_runs.get()
        report = run.result
        assert_matches_the_fp32_reference(report)
        assert report["world_size"] == 2 and len(report["ranks"]) == 2
        assert {axis: report["layout"][axis] for axis in layout} == layout
        assert {rank["host"] for rank in report["ranks"]} and run.node_name == "shard-node"
        figures.append(f"{slug} {layout}: max abs diff {report['max_abs_diff']:.2e}, greedy match "
                       f"{report['greedy_match']}, {run.duration_seconds:.1f} s on the node, "
                       f"{(job.finished - job.created).total_seconds():.1f} s submit to finish")
        if layout.get("pp"):
            assert [rank["layers"] for rank in report["ranks"]] == [[0, 0], [1, 1]]
        if layout.get("ep"):
            # The reduced MoE keeps 4 experts (at least twice its top-2): 2 per rank.
            assert report["layout"]["experts_per_rank"] == 2 and "random weights" in report["routing"]["warning"]
    print("\n".join(figures))

    client = logged_in(member)
    page = client.get(f"/stage-runs/{run.pk}/sharded/").content.decode()
    assert "Correct" in page and "expert-load-chart" in page and "random weights" in page
    compare = client.get(f"/models/{specs['llama-3.2-1b'].pk}/sharded-runs/").content.decode()
    assert compare.count("/sharded/\">run ") == 2 and "PP2" in compare and "TP2" in compare


@through_workers
def test_two_node_workers_form_one_world_with_one_rank_each_and_match_the_reference(
        stack, cluster, team, owner, member, member_api):
    for hostname in ("shard-a", "shard-b"):
        start_gated_node(stack, hostname)
    spec = model(team, owner, "llama-3.2-1b")

    started = time.monotonic()
    job = submit_sharded_run(member_api, cluster, spec, tp=2, node_count=2)
    print(f"two nodes, tp=2: {time.monotonic() - started:.1f} s submit to finish")

    assert job.status == "succeeded", job.error
    runs = list(job.stage_runs.order_by("id"))
    assert [(run.node_name, run.status) for run in runs] == [("shard-a", "succeeded"), ("shard-b", "succeeded")]
    for run in runs:
        assert_matches_the_fp32_reference(run.result)
        assert run.result["world_size"] == 2
        assert [(rank["rank"], rank["node_rank"], rank["local_rank"]) for rank in run.result["ranks"]] == \
            [(0, 0, 0), (1, 1, 0)]
    assert runs[0].result["tokens"] == runs[1].result["tokens"]
    print(f"two nodes: max abs diff {runs[0].result['max_abs_diff']:.2e}, greedy match "
          f"{runs[0].result['greedy_match']}, {max(run.duration_seconds for run in runs):.1f} s on the nodes")

    # The run page names each rank's node by its node_rank: the stage runs are created in that order.
    page = logged_in(member).get(f"/stage-runs/{runs[1].pk}/sharded/").content.decode()
    assert "shard-a <small>" in page and "shard-b <small>" in page


def sharding_processes_under(pid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            if "workers.engine.sharding" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@through_workers
def test_a_killed_rank_fails_the_job_naming_the_rank_and_leaves_no_rank_processes(
        stack, cluster, team, owner, member, member_api):
    start_gated_node(stack, "shard-kill")
    node_worker = psutil.Process(stack.running["node-shard-kill"].pid)
    spec = model(team, owner, "llama-3.2-1b")

    job = submit_sharded_run(member_api, cluster, spec, tp=2, fault="kill_rank_1", timeout_s=60)

    assert job.status == "failed"
    assert (job.finished - job.started).total_seconds() < 60
    assert job.error.startswith("Stage sharded_run failed on shard-kill: ShardedRunError: sharded run failed: "
                                "rank 1 killed by SIGKILL"), job.error
    run = job.stage_runs.get()
    assert run.status == "failed" and "rank 1 killed by SIGKILL" in run.error
    # The launcher ends every rank before it reports, so nothing is left once the job has failed.
    assert sharding_processes_under(node_worker.pid) == []
    pool = node_worker.children(recursive=True)
    assert pool and all(child.cmdline() == node_worker.cmdline() for child in pool)  # Celery's prefork child(ren)

    page = logged_in(member).get(f"/stage-runs/{run.pk}/sharded/").content.decode()
    assert 'id="run-error"' in page and "rank 1 killed by SIGKILL" in page


# --- pages, with a report the engine made ----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_report() -> dict:
    return run_sharded(catalog_config("qwen3-30b-a3b"), tp=2, decode_steps=4, timeout_s=RUN_DEADLINE)


def finished_run(spec, node, report, status="succeeded", nodes=1) -> StageRun:
    """A sharded_run job as the control plane leaves it: one stage run per node, each with the world's report."""
    job = AdaptationJob.objects.create(team=spec.team, cluster=node.cluster, model=spec, stages=["sharded_run"],
                                       status=status, started=timezone.now(), finished=timezone.now(),
                                       error="" if status == "succeeded" else "rank 1 killed by SIGKILL")
    runs = [StageRun.objects.create(job=job, kind="sharded_run", node=node, node_name=f"{node.hostname}-{index}",
                                    status=status, result=report if status == "succeeded" else None,
                                    error=job.error) for index in range(nodes)]
    return runs[0]


@pytest.fixture
def sharded_run(model_spec, node, engine_report) -> StageRun:
    return finished_run(model_spec, node, engine_report)


def page_urls(run: StageRun) -> list[str]:
    return [f"/stage-runs/{run.pk}/sharded/", f"/models/{run.job.model_id}/sharded-runs/"]


@pytest.mark.django_db
def test_the_pages_redirect_anonymous_users_to_the_login(client, sharded_run):
    for url in page_urls(sharded_run):
        response = client.get(url)
        assert (response.status_code, response.url) == (302, f"/login/?next={url}")


@pytest.mark.django_db
def test_the_pages_are_404_for_another_team(outsider, sharded_run):
    for url in page_urls(sharded_run):
        assert logged_in(outsider).get(url).status_code == 404


@pytest.mark.django_db
def test_a_member_sees_the_verdict_each_rank_and_the_expert_load(member, sharded_run, engine_report):
    response = logged_in(member).get(f"/stage-runs/{sharded_run.pk}/sharded/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Correct" in page and f"{engine_report['max_abs_diff']:.2e}" in page
    assert "5 of 5 match" in page  # the prefill's token + 4 decode steps
    assert page.count("gpu-01-0 <small>") == 2  # both ranks ran on the run's one node
    data = response.context["chart_data"]
    assert [rank["rank"] for rank in data["ranks"]] == [0, 1]
    for rank in data["ranks"]:
        assert rank["compute_s"] > 0 and rank["collective_s"] > 0 and rank["collective_bytes"] > 0
    # Qwen3-MoE has one layer kind, so its reduced model has one MoE layer, of 4 experts.
    assert data["routing"]["layers"] == ["layer 0"] and len(data["routing"]["experts"]) == 4
    assert sum(data["routing"]["tokens"][0]) == (8 + 4) * 2  # every token's top-2 choices
    assert "random weights" in data["routing"]["warning"]
    assert re.search(r"each rank holds up to 50\.\d % of its stage's", page) and "Weakly sharded" not in page


@pytest.mark.django_db
def test_a_weakly_sharded_run_says_what_stays_whole(member, model_spec, node, engine_report):
    split = {"ideal_share": 0.5, "largest_share": 0.85, "weakly_sharded": True, "replicated_share": 0.69,
             "largest_replicated": [{"name": "model.layers.0.self_attn.q_proj.weight", "params": 1 << 20}]}
    page = logged_in(member).get(f"/stage-runs/{finished_run(model_spec, node, {**engine_report, 'split': split}).pk}"
                                 "/sharded/").content.decode()
    assert "<b>Weakly sharded:</b> each rank holds up to 85.0 %" in page and "ideal 50.0 %" in page
    assert "69.0 % stays whole on every rank" in page and "model.layers.0.self_attn.q_proj.weight" in page


@pytest.mark.django_db
def test_an_incorrect_run_says_so_with_its_diff_and_the_mis_split_shard(member, model_spec, node, engine_report):
    # The engine's own tests show a mis-split shard is caught (corrupt_shard); here only how the page tells it.
    corrupted = {**engine_report["ranks"][1], "corrupted": {"tensor": "model.layers.0.mlp.experts.gate_up_proj"}}
    report = {**engine_report, "correct": False, "max_abs_diff": 0.0831, "greedy_match": False,
              "greedy_tokens_matching": 2, "ranks": [engine_report["ranks"][0], corrupted]}
    page = logged_in(member).get(f"/stage-runs/{finished_run(model_spec, node, report).pk}/sharded/").content.decode()
    assert ">Incorrect</span>" in page and "8.31e-02" in page and "differ: 2 of 5 match" in page
    assert "Rank 1's shard was mis-split on purpose (test hook corrupt_shard): tensor " \
           "model.layers.0.mlp.experts.gate_up_proj" in page


@pytest.mark.django_db
def test_a_member_compares_every_run_of_the_model_newest_first(member, sharded_run, model_spec, node, engine_report):
    failed = finished_run(model_spec, node, None, status="failed")
    two_nodes = finished_run(model_spec, node, engine_report, nodes=2)
    response = logged_in(member).get(f"/models/{model_spec.pk}/sharded-runs/")
    assert response.status_code == 200
    assert [row["run"].pk for row in response.context["rows"]] == [two_nodes.pk, failed.pk, sharded_run.pk]
    assert [row["nodes"] for row in response.context["rows"]] == [2, 1, 1]
    summary = response.context["rows"][0]["summary"]
    slowest = max(rank["decode_s_per_step"] for rank in engine_report["ranks"]) * 1e3
    assert (summary["layout"], summary["world_size"], summary["correct"]) == ("TP2", 2, True)
    assert summary["slowest_decode_ms_per_step"] == pytest.approx(slowest)
    assert 0 < summary["collective_share"] < 1
    assert len(response.context["chart"]) == 2  # the failed run has no decode time to draw


@pytest.mark.django_db
def test_the_run_page_is_404_for_a_stage_of_another_kind(member, job):
    assert logged_in(member).get(f"/stage-runs/{job.stage_runs.get().pk}/sharded/").status_code == 404


@pytest.mark.django_db
def test_the_pages_run_a_fixed_number_of_queries_whatever_the_number_of_runs(member, model_spec, node,
                                                                            engine_report):
    client = logged_in(member)
    run = finished_run(model_spec, node, engine_report, nodes=2)
    # Both pages start with the session row, the user and the user's team ids. Run page: the stage run with
    # its job, model and cluster joined, then its job's stage runs for the node names. Comparison: the model, then
    # its stage runs with their jobs joined.
    assert queries_for(lambda: client.get(f"/stage-runs/{run.pk}/sharded/")) == 3 + 2
    assert queries_for(lambda: client.get(f"/models/{model_spec.pk}/sharded-runs/")) == 3 + 2
    for status in ("succeeded", "failed", "succeeded"):
        finished_run(model_spec, node, engine_report, status=status, nodes=2)
    assert queries_for(lambda: client.get(f"/models/{model_spec.pk}/sharded-runs/")) == 3 + 2


@pytest.mark.django_db
def test_a_run_of_the_generic_architecture_says_so_on_its_page(member, model_spec, node, engine_report):
    note = ("generic architecture: the release's own modeling code was not run; d0 built a Mixtral-shaped decoder "
            "(routed experts) from the config's standard keys; keys not interpreted: attn_output_multiplier")
    report = {**engine_report, "reduction": {"layers": 1, "full_layers": 64, "notes": [note, "64 layers -> 1"]}}
    page = logged_in(member).get(f"/stage-runs/{finished_run(model_spec, node, report).pk}/sharded/").content.decode()
    assert "reduced to 1 of 64 layers" in page
    assert f'<li class="notice">{escape(note)}</li>' in page and '<li class="hint">64 layers -&gt; 1</li>' in page


@pytest.mark.django_db
def test_the_page_and_the_job_headline_say_which_axes_ran_and_what_each_rank_holds(member, model_spec, node,
                                                                                  engine_report):
    """Issue 31, item 2: one summary line (it read "(group_size2 × tp2 × world_size2, world 2)"), the axes the run
    went through, each rank's held share beside its layout's ideal, and a misplaced expert block's reason."""
    outcome = ShardedRun().outcome(engine_report)
    assert outcome.summary == engine_report["summary"] and "group_size" not in outcome.summary
    assert outcome.summary.startswith("TP2 on 2 ranks: matched the reference") and not outcome.warnings
    page = logged_in(member).get(f"/stage-runs/{finished_run(model_spec, node, engine_report).pk}/sharded/") \
        .content.decode()
    assert f'<p id="summary"><b>{escape(engine_report["summary"])}</b></p>' in page
    assert "TP2 (tensor parallelism): exercised" in page
    share = engine_report["split"]["ranks"][1]
    assert f"({share['held_share'] * 100:.1f} % of its stage; ideal {share['ideal_share'] * 100:.1f} %)" in page

    reason = ("expert placement: model.layers.1.mlp.experts: rank 1 holds experts 0–1 but is sent the tokens of "
              "experts 2–3; experts 0–1 held by more than one rank; experts 2–3 held by no rank")
    misplaced = {**engine_report, "correct": False, "reason": reason, "layout": {**engine_report["layout"], "ep": 2},
                 "axes": {**engine_report["axes"], "ep": {"size": 2, "exercised": True, "placement_ok": False,
                                                          "experts_per_rank": 2, "all_to_all_calls": 8,
                                                          "placement": [reason.removeprefix("expert placement: ")]}}}
    misplaced.pop("summary")  # a report from before the summary: worded from its layout
    assert ShardedRun().outcome(misplaced).summary == "EP2 × TP2 on 2 ranks: did NOT match the reference"
    page = logged_in(member).get(f"/stage-runs/{finished_run(model_spec, node, misplaced).pk}/sharded/") \
        .content.decode()
    assert f'<p id="reason" class="message error">{reason}</p>' in page
    assert "EP2 (expert parallelism): exercised, 2 experts per rank, 8 all_to_all calls; experts on the wrong " \
           "ranks: model.layers.1.mlp.experts: rank 1 holds" in page
