"""The real engine: vLLM's CPU build (``.venv-vllm``, made by ``scripts/vllm-env.sh``; ``scripts/test.sh`` makes it
beside the run, the ``vllm_python`` fixture waits for it) serving validation checkpoints, through real Celery
workers where a job is involved.

Each engine start costs 40-100 s on a 2-core machine, so the tests start as few as prove the point, with
``enforce_eager`` (vLLM's torch.compile warm-up was ~40% of a start): the CI's time goes to d0's behaviour, not to
compiling the same tiny model again. (The compiled path is what a GPU node
runs by default; scripts/gpu-validation.sh serves with it.)"""

import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import job_status, load_config, node_online
from tests.harness import wait_for
from workers.engine.serving.checkpoint import write_validation_checkpoint
from workers.engine.serving.correctness import check_correctness
from workers.engine.serving.engines import Engine
from workers.engine.serving.serve_sweep import Session, run_trials
from workers.engine.sweep.workload import Workload

REPO = Path(__file__).parent.parent


# The tests of what d0 leaves behind when an engine dies or is cancelled keep vLLM's default process tree (API
# server, engine core, workers); the rest run the engine core in the API server's process, which saves a process
# start and its imports (~6 s of ~20 s per engine start on this machine) and changes nothing d0 does.
KEEP_ENGINE_CORE_PROCESS = {"test_an_engine_killed_mid_trial_ends_the_trial_with_the_reason_and_no_engine_left",
                            "test_cancelling_a_serve_sweep_mid_trial_leaves_no_engine_behind"}


@pytest.fixture(autouse=True)
def _engine_core_in_process(request, monkeypatch):
    # Autouse, so it runs before the worker stack copies this environment for its nodes.
    if request.node.originalname not in KEEP_ENGINE_CORE_PROCESS:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def engine_processes() -> list[psutil.Process]:
    """Processes started by d0 as engines (they carry D0_ENGINE_RUN in their environment)."""
    found = []
    for process in psutil.process_iter():
        try:
            if "D0_ENGINE_RUN" in process.environ():
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def llama_session(tmp_path, vllm_python):
    checkpoint = tmp_path / "checkpoint"
    write_validation_checkpoint(load_config("llama-3.1-8b.json"), checkpoint)
    engine = Engine("vllm", vllm_python)
    described = engine.probe()
    assert described["usable"] and described["version"] == "0.32.0", described
    return Session(engine, described, checkpoint, tmp_path / "logs", max_model_len=512)


EAGER = {"enforce_eager": True}


@pytest.mark.timeout(15 * 60)
def test_tp2_engine_gives_the_greedy_tokens_of_tp1_and_of_transformers(llama_session):
    report = check_correctness(llama_session, {"tensor_parallel_size": 2, **EAGER}, vocab=512, tokens=8,
                               startup_timeout_s=600)
    print({key: report.get(key) for key in ("verdict", "versus_engine_tp1", "versus_transformers")})
    assert report["verdict"] == "agree", report.get("reason")
    assert report["versus_engine_tp1"]["tokens_equal"] and report["versus_transformers"]["tokens_equal"]
    assert report["versus_transformers"]["max_logprob_difference"] < 1e-3
    assert "--tensor-parallel-size 2" in report["engine"]["command"]
    assert not engine_processes()


@pytest.mark.timeout(10 * 60)
def test_a_trial_past_its_timeout_ends_with_the_reason_and_no_engine_left(llama_session):
    slow = Workload.from_dict({"requests": 64, "prompt_len": 32, "output_len": 200, "timeout_s": 3})
    trials = run_trials(llama_session, {"max_num_seqs": 2, **EAGER}, [{}], slow, 600, 0, lambda message: None)
    assert trials[0]["status"] == "failed" and trials[0]["cause"] == "timed out"
    assert "not all answered within 3 s" in trials[0]["reason"]
    assert not engine_processes()


@pytest.mark.timeout(10 * 60)
def test_an_engine_killed_mid_trial_ends_the_trial_with_the_reason_and_no_engine_left(llama_session):
    long = Workload.from_dict({"requests": 200, "prompt_len": 32, "output_len": 64})

    def kill_when_serving(message):
        if message.startswith("serving"):
            def kill():
                time.sleep(2)
                for process in engine_processes():
                    if "api_server" in " ".join(process.cmdline()):
                        process.send_signal(signal.SIGKILL)
            threading.Thread(target=kill, daemon=True).start()

    trials = run_trials(llama_session, {"max_num_seqs": 2, **EAGER}, [{}], long, 600, 0, kill_when_serving)
    assert trials[0]["status"] == "failed" and trials[0]["cause"] in ("exited", "error"), trials[0]
    assert "exited" in trials[0]["reason"]
    wait_for(lambda: not engine_processes(), 30, "the engine's processes to end")


# --- through real workers ------------------------------------------------------------------------------


# Block sizes the CPU build takes (multiples of 32: it refuses 16 with "No common block size for 16"). Each listed
# configuration is an engine start of its own.
LLAMA_CONFIGURATIONS = [{"max_num_seqs": 2, "block_size": 32}, {"max_num_seqs": 4, "block_size": 64},
                        {"kv_cache_space_gib": 200}]  # more KV cache than the machine has: vLLM refuses to start
SMALL = {"requests": 8, "prompt_len": 16, "output_len": 8}
STAGES = ["env_check", "serve_sweep"]  # the engine sweep is gated: the node proves itself fit first


def _serve_node(stack, team, vllm_python, hostname):
    cluster = team.clusters.create(name="serve", expected_devices_per_node=1)
    stack.start_node("alpha/serve", hostname, extra=("--engine", f"vllm={vllm_python}"))
    node = wait_for(node_online(hostname), 60, "node registration")
    wait_for(lambda: node.__class__.objects.get(pk=node.pk).host_facts.get("engines"), 30, "the engine probe")
    return cluster


@pytest.mark.workers
@pytest.mark.timeout(25 * 60)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("slug, parameters", [
    ("llama-3.1-8b", {"configurations": LLAMA_CONFIGURATIONS, "correctness": False, "settings": EAGER}),
    # One engine start each, serving both concurrencies.
    ("qwen3-30b-a3b", {"grid": {"max_num_seqs": [4], "concurrency": [1, 2]}, "correctness": False,
                       "settings": EAGER}),
    ("deepseek-v3", {"grid": {"max_num_seqs": [4], "concurrency": [1, 2]}, "correctness": False,
                     "settings": EAGER}),
])
def test_serve_sweep_job_serves_every_trial_on_vllm_and_writes_a_recipe(stack, team, owner, member, member_api,
                                                                        vllm_python, slug, parameters):
    from django.test import Client

    from adaptation.intake import services as intake
    from adaptation.models import Node

    cluster = _serve_node(stack, team, vllm_python, f"serve-{slug}")
    engines = Node.objects.get(hostname=f"serve-{slug}").host_facts["engines"]
    assert engines[0]["name"] == "vllm" and engines[0]["usable"] and engines[0]["version"] == "0.32.0"
    spec = intake.add_from_catalog(team=team, user=owner, slug=slug)[0]
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": spec.pk, "stages": STAGES,
                                              "parameters": {"serve_sweep": {**parameters, "workload": SMALL}}},
                               format="json")
    assert response.status_code == 201, response.json()
    job = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 20 * 60, "the serve sweep")
    assert job.status == "succeeded", job.error + job.log
    run = job.stage_runs.get(kind="serve_sweep")
    result = run.result
    trials = result["trials"]
    # Each configuration served three times within its engine start, for the verdict; no start more
    first_runs = [trial for trial in trials if not trial.get("repeat")]
    assert len(first_runs) == (3 if slug == "llama-3.1-8b" else 2)
    assert len(result["best"]["runs"]) == 3 and result["verdict"]["runner_up"]["count"] == 3
    failed = [trial for trial in trials if trial["status"] != "ok"]
    for trial in trials:
        if trial["status"] == "ok":
            metrics = trial["metrics"]
            assert metrics["completed"] == SMALL["requests"] and metrics["failed"] == 0
            assert metrics["output_tokens_per_s"] > 0 and metrics["ttft_s"]["p50"] > 0 and metrics["tpot_s"]["p50"] > 0
            assert trial["startup_s"] > 0 and metrics["peak_memory_bytes"] > 0
    if slug == "llama-3.1-8b":
        assert len(failed) == 1 and failed[0]["settings"]["kv_cache_space_gib"] == 200
        assert failed[0]["cause"] == "out of memory" and "less than requested memory" in failed[0]["reason"]
        assert result["engine_starts"] == 3
    else:
        assert not failed and result["engine_starts"] == 1  # concurrency reuses an engine start
        assert [trial["client"]["concurrency"] for trial in first_runs] == [1, 2]
    recipe = result["recipe"]
    assert recipe["engine"] == "vllm" and recipe["version"] == "0.32.0"
    assert "vllm.entrypoints.openai.api_server" in recipe["command"] and "--max-num-seqs" in recipe["command"]
    assert "--enforce-eager" in recipe["command"]
    # The env check ran first, so the recipe carries the roofline ceiling it is compared with
    predicted = recipe["prediction"]
    assert predicted["available"], predicted
    assert predicted["predicted_output_tokens_per_s"] > 0 and predicted["precision"] == "bf16"
    assert (predicted["efficiency"] is None) == (predicted["note"] is not None)
    assert result["tensors"]["tensors"] == result["tensors"]["expected"]
    # The prediction ledger: every served trial carries d0's prediction (the roofline from the env check it ran
    # first; the cluster had no measured trial, so not calibrated) beside its measurement, and the recipe its trial's.
    for trial in trials:
        if trial["status"] == "ok":
            assert trial["prediction"]["available"], trial["prediction"]
            assert trial["prediction"]["calibration"] is None and "not calibrated" in trial["prediction"]["basis"]
            assert all(value > 0 for value in trial["prediction"]["predicted"].values())
    assert predicted["ledger"]["available"] and recipe["trial"] == result["best"]["id"]
    client = Client()
    client.force_login(member)
    # The cluster page shows how far those predictions were, and the next sweep here is calibrated on them.
    cluster_page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    served = sum(trial["status"] == "ok" for trial in trials)
    assert 'id="prediction-ledger"' in cluster_page and f"calibrated on {served} trials of this cluster" in cluster_page
    page = client.get(f"/engines/{run.pk}/").content.decode()
    assert "Deployment recipe" in page and "vllm 0.32.0" in page and "validation checkpoint" in page
    assert "Roofline ceiling for this workload" in page
    script = client.get(f"/engines/{run.pk}/recipe.sh").content.decode()
    assert script.startswith("#!/bin/sh") and "${MODEL:?" in script
    assert member_api.get(f"/api/engine-reports/{run.pk}/").json()["result"]["recipe"] == recipe
    assert not engine_processes()


@pytest.mark.workers
@pytest.mark.timeout(15 * 60)
@pytest.mark.django_db(transaction=True)
def test_cancelling_a_serve_sweep_mid_trial_leaves_no_engine_behind(stack, team, owner, member_api, vllm_python):
    from adaptation.intake import services as intake
    from adaptation.models import StageRun

    cluster = _serve_node(stack, team, vllm_python, "serve-cancel")
    spec = intake.add_from_catalog(team=team, user=owner, slug="llama-3.1-8b")[0]
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": spec.pk, "stages": STAGES,
                                              "parameters": {"serve_sweep": {
                                                  "grid": {"max_num_seqs": [2]}, "correctness": False,
                                                  "settings": EAGER,
                                                  "workload": {"requests": 400, "prompt_len": 32,
                                                               "output_len": 64}}}}, format="json")
    job_id = response.json()["id"]
    wait_for(lambda: StageRun.objects.filter(job_id=job_id, message__startswith="configuration 1 of 1: serving")
             .first(), 10 * 60, "the trial to be serving")
    assert engine_processes()
    assert member_api.post(f"/api/jobs/{job_id}/cancel/").status_code == 200
    wait_for(job_status(job_id, "cancelled"), 30, "the job to be cancelled")
    wait_for(lambda: not engine_processes(), 60, "the engine's processes to end")


@pytest.mark.workers
@pytest.mark.timeout(15 * 60)
@pytest.mark.django_db(transaction=True)
def test_an_endpoint_someone_else_runs_is_benchmarked_with_its_stored_key(stack, team, owner, member_api,
                                                                        vllm_python, tmp_path):
    """The "someone else": a vLLM server started here with --api-key. A stored endpoint with the right key is
    benchmarked at each concurrency by a node of another cluster; the wrong key fails the job with the 401; the key
    is in no row."""
    import json

    from adaptation.models import ModelSpec
    from tests.test_serving_endpoints import stored_rows
    from workers.engine.serving.launchers import VllmLauncher
    from workers.engine.serving.server import EngineServer, free_port

    secret = "sk-d0-endpoint-test-5f2c"
    checkpoint = tmp_path / "checkpoint"
    write_validation_checkpoint(load_config("llama-3.1-8b.json"), checkpoint)
    port = free_port()
    launch = VllmLauncher.launch(vllm_python, checkpoint, {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1,
                                                           "max_model_len": 512, "max_num_seqs": 4, **EAGER},
                                 port=port, cpu_build=True)
    # The team's model is what the endpoint serves (prompts are drawn from its vocabulary).
    spec = ModelSpec.objects.create(team=team, name="served", created_by=owner,
                                    config=json.loads((checkpoint / "config.json").read_text()))
    cluster = team.clusters.create(name="clients", expected_devices_per_node=1)
    # The endpoint is on this machine's loopback, which a node reaches only when its operator lists it.
    stack.start_node("alpha/clients", "client-node", extra=("--endpoint-allow", "127.0.0.1"))
    wait_for(node_online("client-node"), 60, "node registration")
    with EngineServer([*launch.command, "--api-key", secret], env=launch.env, port=port,
                      log_path=tmp_path / "engine.log") as server:
        server.wait_healthy(900)
        jobs = {}
        for name, key in (("theirs", secret), ("wrong-key", "sk-wrong")):
            created = member_api.post("/api/serving-endpoints/", {"name": name, "base_url": server.base_url,
                                                                  "served_model": "d0", "api_key": key},
                                      format="json")
            assert created.status_code == 201, created.json()
            response = member_api.post("/api/jobs/", {
                "cluster": cluster.pk, "model": spec.pk, "stages": ["endpoint_bench"],
                "parameters": {"endpoint_bench": {"endpoint": created.json()["id"], "concurrency": [1, 2],
                                                  "workload": SMALL}}}, format="json")
            assert response.status_code == 201, response.json()
            jobs[name] = response.json()["id"]
        good = wait_for(job_status(jobs["theirs"], "succeeded", "failed"), 5 * 60, "the endpoint benchmark")
        bad = wait_for(job_status(jobs["wrong-key"], "succeeded", "failed"), 5 * 60, "the wrong key's benchmark")
    assert good.status == "succeeded", good.error + good.log
    result = good.stage_runs.get().result
    assert [trial["client"]["concurrency"] for trial in result["trials"]] == [1, 2]
    for trial in result["trials"]:
        assert trial["status"] == "ok" and trial["metrics"]["completed"] == SMALL["requests"]
        assert trial["metrics"]["tpot_s"]["p50"] > 0 and trial["metrics"]["output_tokens_per_s"] > 0
    assert result["endpoint"] == {"base_url": server.base_url, "served_model": "d0", "api_key": "set"}
    assert bad.status == "failed" and "HTTP 401" in bad.error, bad.error
    report = member_api.get(f"/api/endpoint-reports/{good.stage_runs.get().pk}/")
    assert report.status_code == 200 and report.json()["result"]["best"]["client"]["concurrency"] in (1, 2)
    assert secret not in stored_rows() and secret not in stack.logs()
