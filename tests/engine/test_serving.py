"""The serving engine's pieces that need no engine running: launch command lines, causes read from engine logs,
the safetensors header check (one small checkpoint per quantization format), engine probes and the recipe."""

import json
import os
import sys

import pytest

from workers.engine.serving.checkpoint import write_validation_checkpoint
from workers.engine.serving.engines import Engine, parse_engines
from workers.engine.serving.launchers import LAUNCHERS, check_settings
from workers.engine.serving.server import EngineServer, log_cause
from workers.engine.serving.tensors import CheckpointRefused, check_checkpoint

from .conftest import load_config
from .quantized_checkpoints import FORMATS, edit_tensors, quantize_folder


def test_vllm_command_line_maps_each_setting_to_its_documented_argument(tmp_path):
    launch = LAUNCHERS["vllm"].launch("/opt/vllm/bin/python", tmp_path, {
        "tensor_parallel_size": 2, "enable_expert_parallel": True, "dtype": "bfloat16", "block_size": 32,
        "max_num_seqs": 8, "max_num_batched_tokens": 1024, "enable_chunked_prefill": False,
        "gpu_memory_utilization": 0.5, "max_model_len": 4096, "kv_cache_dtype": "fp8", "kv_cache_space_gib": 2},
        port=8123, cpu_build=True)
    command = launch.command
    assert command[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    pairs = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    assert pairs["--tensor-parallel-size"] == "2" and pairs["--block-size"] == "32"
    assert pairs["--max-num-seqs"] == "8" and pairs["--max-num-batched-tokens"] == "1024"
    assert pairs["--gpu-memory-utilization"] == "0.5" and pairs["--kv-cache-dtype"] == "fp8"
    assert pairs["--port"] == "8123" and pairs["--host"] == "127.0.0.1"
    assert "--enable-expert-parallel" in command and "--no-enable-chunked-prefill" in command
    assert pairs["--distributed-executor-backend"] == "mp"
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "|" in launch.env["VLLM_CPU_OMP_THREADS_BIND"] or \
        len(os.sched_getaffinity(0)) == 1
    assert "VLLM_CPU_KVCACHE_SPACE=2" in launch.shell()
    gpu = LAUNCHERS["vllm"].launch("python", tmp_path, {"kv_cache_space_gib": 2}, port=1, cpu_build=False)
    assert gpu.env == {}


def test_sglang_gets_the_same_settings_as_its_own_arguments(tmp_path):
    command = LAUNCHERS["sglang"].launch("python", tmp_path, {"tensor_parallel_size": 4, "block_size": 16,
                                                             "max_num_seqs": 64, "gpu_memory_utilization": 0.8,
                                                             "enable_prefix_caching": False}, port=30000,
                                         cpu_build=False).command
    assert command[1:3] == ["-m", "sglang.launch_server"]
    pairs = {command[i]: command[i + 1] for i in range(len(command) - 1)}
    assert pairs["--tp-size"] == "4" and pairs["--page-size"] == "16" and pairs["--max-running-requests"] == "64"
    assert pairs["--mem-fraction-static"] == "0.8" and "--disable-radix-cache" in command


@pytest.mark.parametrize("given, message", [
    ({"max_num_seqs": 0}, "max_num_seqs takes a positive int"),
    ({"gpu_memory_utilization": 1.5}, "fraction"),
    ({"dtype": "float8"}, "dtype takes one of"),
    ({"kv_cache_dtype": "fp8; rm -rf /"}, "takes a name"),
    ({"max_num_sequences": 4}, "unknown engine setting 'max_num_sequences'"),
])
def test_bad_engine_settings_are_refused_naming_the_setting(given, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_settings(given)


@pytest.mark.parametrize("line, cause", [
    ("(EngineCore pid=1) ERROR 12-01 12:31:13 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to "
     "allocate 2.00 GiB", "out of memory"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
     "out of memory"),
    ("ValueError: Model architectures ['FooForCausalLM'] are not supported for now.", "unsupported architecture"),
    ("NotImplementedError: Head dimension 80 is not supported by MLA", "unsupported architecture"),
    ("KeyError: 'layers.0.mlp.gate.e_score_correction_bias'", "bad weights"),
    ("RuntimeError: Worker failed with error 'No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).'",
     "unsupported setting"),
])
def test_an_engine_log_says_why_it_stopped(line, cause):
    log = "INFO starting\nTraceback (most recent call last):\n  File x\n" + line + "\nINFO shutting down\n"
    assert log_cause(log)[0] == cause
    assert log_cause(log)[1].endswith(line.split("] ", 1)[-1][:60]) or line[-40:] in log_cause(log)[1]


def test_a_server_that_exits_fails_with_its_logged_cause_and_leaves_no_process(tmp_path):
    script = "import sys; print('ValueError: Model architectures [\\'X\\'] are not supported for now.'); sys.exit(3)"
    server = EngineServer([sys.executable, "-c", script], env={}, log_path=tmp_path / "engine.log", port=1)
    with server, pytest.raises(Exception) as failed:
        server.wait_healthy(30)
    assert failed.value.cause == "unsupported architecture" and "exited with code 3" in failed.value.reason
    assert not server.group_alive()


def test_a_server_never_healthy_times_out_and_its_children_are_stopped(tmp_path):
    # The leader starts a child of its own (as vLLM starts its engine core): stop() must end both.
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    server = EngineServer([sys.executable, "-c", script], env={}, log_path=tmp_path / "engine.log", port=1)
    with server, pytest.raises(Exception) as failed:
        server.wait_healthy(2)
    assert failed.value.cause == "timed out"
    assert not server.group_alive()


def test_engine_specs_and_probes():
    assert parse_engines("vllm=/opt/v/bin/python")["vllm"] == Engine("vllm", "/opt/v/bin/python")
    with pytest.raises(ValueError, match="NAME=INTERPRETER"):
        parse_engines(["vllm"])
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        parse_engines(["tgi=/usr/bin/python"])
    assert Engine("vllm", "/nonexistent/python").probe()["reason"] == "no interpreter at /nonexistent/python"
    probe = Engine("vllm", sys.executable).probe()  # d0's own environment has no vLLM
    assert probe["usable"] is False and "not installed" in probe["reason"]


# --- the checkpoint check ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    write_validation_checkpoint(load_config("llama-3.1-8b.json"), folder)
    return folder


@pytest.fixture(scope="module")
def gpt_oss_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt-oss")
    write_validation_checkpoint(load_config("gpt-oss-20b.json"), folder)
    return folder


def _copy(source, target):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize("method", FORMATS)
def test_each_quantization_format_is_recognised_and_a_missing_layer_or_wrong_shape_refused(
        tmp_path, llama_folder, gpt_oss_folder, method):
    folder = _copy(gpt_oss_folder if method == "mxfp4" else llama_folder, tmp_path / "ok")
    quantize_folder(folder, method)
    report = check_checkpoint(folder, layout={"tensor_parallel_size": 2})
    assert report["quantization"] == method and report["quantized_weights"] > 0
    assert report["bytes_per_device"] == -(-report["total_bytes"] // 2)

    missing = _copy(folder, tmp_path / "missing")
    edit_tensors(missing, lambda tensors: {name: t for name, t in tensors.items()
                                           if not name.startswith("model.layers.0.self_attn.o_proj")})
    with pytest.raises(CheckpointRefused, match=r"missing tensors: model\.layers\.0\.self_attn\.o_proj") as refused:
        check_checkpoint(missing)
    assert refused.value.problems["missing"]

    shaped = _copy(folder, tmp_path / "shaped")
    config = json.loads((shaped / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2  # config.json now disagrees with the tensors
    (shaped / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointRefused, match="mis-shaped tensors: model.layers.0.mlp") as refused:
        check_checkpoint(shaped)
    assert all(entry["expected"] != entry["found"] for entry in refused.value.problems["mis_shaped"])


def test_unexpected_tensors_are_named_and_mtp_layers_only_reported(tmp_path, llama_folder):
    import torch

    folder = _copy(llama_folder, tmp_path / "extra")
    edit_tensors(folder, lambda tensors: {**tensors, "model.layers.1.mlp.up_proj.weight": torch.zeros(2, 2),
                                          "model.vision_tower.weight": torch.zeros(2)})
    with pytest.raises(CheckpointRefused, match="unexpected tensors: model.vision_tower.weight"):
        check_checkpoint(folder)
    edit_tensors(folder, lambda tensors: {k: v for k, v in tensors.items() if "vision" not in k})
    report = check_checkpoint(folder)
    assert report["extra_layer_tensors"] == 1 and "multi-token-prediction" in report["extra_layer_note"]


def test_smart_engine_search_halves_on_short_runs_skips_what_is_larger_than_an_oom_and_picks_a_full_run(
        monkeypatch):
    """Successive halving over engine configurations: the engine is the true edge here, so ``run_trials`` (one
    engine start) is replaced by a model of one: throughput grows with max_num_seqs, 200 GiB of KV cache is refused."""
    import importlib

    from workers.engine.sweep.workload import Workload

    module = importlib.import_module("workers.engine.serving.serve_sweep")  # the package exports the function

    starts = []

    def fake_run_trials(session, settings, clients, workload, timeout, first_id, progress):
        filled = session.settings(settings)
        starts.append((filled, workload.requests, len(clients)))
        if filled.get("kv_cache_space_gib", 0) >= 200:
            return [{"id": first_id, "settings": filled, "client": clients[0], "status": "failed",
                     "cause": "out of memory", "reason": "less than requested memory", "metrics": None,
                     "workload": {"requests": workload.requests}}]
        return [{"id": first_id + offset, "settings": filled, "client": client, "status": "ok", "reason": None,
                 "metrics": {"output_tokens_per_s": 100.0 * filled["max_num_seqs"] * client.get("concurrency", 1),
                             "goodput_requests_per_s": None},
                 "workload": {"requests": workload.requests}} for offset, client in enumerate(clients)]

    class FakeSession:
        def settings(self, settings):
            return {"kv_cache_space_gib": 1, **settings}

    monkeypatch.setattr(module, "run_trials", fake_run_trials)
    groups = [({"max_num_seqs": seqs}, [{"concurrency": 1}]) for seqs in (1, 2, 4)] + [
        ({"max_num_seqs": 1, "kv_cache_space_gib": gib}, [{"concurrency": 1}]) for gib in (200, 400)] + [
        ({"max_num_seqs": 4}, [{"concurrency": 2}])]
    workload = Workload.from_dict({"requests": 27, "prompt_len": 8, "output_len": 8})
    progress = []
    trials, search = module.run_search(FakeSession(), groups, workload,
                                       {"search": "smart", "startup_timeout_s": 60},
                                       lambda fraction, message: progress.append((fraction, message)))
    assert search["strategy"] == "smart" and search["configurations"] == 6
    skipped = [trial for trial in trials if trial["status"] == "skipped"]
    assert [trial["settings"]["kv_cache_space_gib"] for trial in skipped] == [400]
    assert "which ran out of memory" in skipped[0]["reason"]
    # rung 0: five starts on a short workload, one run each (the 400 GiB one never starts); rung 1: the best of
    # ceil(4/3) = 2 on the full workload, each served three times within its start: no start more for the verdict
    assert [(requests, runs) for _, requests, runs in starts[:5]] == [(9, 1)] * 5 and len(starts) == 7
    assert [(requests, runs) for _, requests, runs in starts[5:]] == [(27, 3), (27, 3)]
    assert search["repeats"] == {"runs": 4, "engine_starts": 0}
    best = module.best_trial(trials, workload)
    assert best["settings"]["max_num_seqs"] == 4 and best["client"] == {"concurrency": 2}
    assert best["workload"]["requests"] == 27 and best["runs"] == [800.0] * 3
    assert best["verdict"]["verdict"] == "confirmed" and best["verdict"]["runner_up"]["runs"] == [400.0] * 3
    assert all(0.05 <= fraction <= 0.85 for fraction, _ in progress)
    # A short run's figure never becomes the recipe, even when it was the fastest
    trials[0]["metrics"]["output_tokens_per_s"] = 1e9
    assert module.best_trial(trials, workload)["id"] == best["id"]


def test_the_recipe_prediction_is_the_roofline_of_the_served_checkpoint_and_flags_an_impossible_efficiency(
        llama_folder):
    from workers.engine.serving.prediction import prediction
    from workers.engine.sweep.roofline import model_cost
    from workers.engine.models.loading import build_meta_model, load_config as transformers_config

    lengths = [(32, 16)] * 8
    best = {"settings": {"max_num_seqs": 4}, "workload": {"concurrency": 4},
            "metrics": {"duration_s": 2.0, "output_tokens_per_s": 64.0}}
    assert not prediction(llama_folder, best, lengths, None)["available"]
    assert "run an env check" in prediction(llama_folder, best, lengths, {"flops_per_s": {"fp32": 1e12}})["reason"]
    hardware = {"memory_bandwidth_bytes_per_s": 20e9, "flops_per_s": {"bf16": 200e9}}
    predicted = prediction(llama_folder, best, lengths, hardware)
    assert predicted["available"] and predicted["precision"] == "bf16" and predicted["batched_tokens_assumed"]
    # The same cost model the proxy sweep uses, of the checkpoint's own architecture at 2 bytes an element
    config = json.loads((llama_folder / "config.json").read_text())
    cost = model_cost(build_meta_model(transformers_config(config)), lambda module, parameter: 2, 2)
    assert predicted["model"]["active_parameters"] == cost.active_parameters > 0
    decode = predicted["phases"]["decode"]
    assert decode["steps"] == 8 * 15 // 4  # 15 decode tokens per request after the prefill's first, 4 at a time
    assert predicted["efficiency"] == pytest.approx(predicted["predicted_seconds"] / 2.0)
    assert predicted["efficiency"] < 1 and predicted["note"] is None
    faster = prediction(llama_folder, {**best, "metrics": {"duration_s": predicted["predicted_seconds"] / 3,
                                                           "output_tokens_per_s": 1e6}}, lengths, hardware)
    assert faster["efficiency"] is None and faster["ceiling_ratio"] == pytest.approx(3.0)
    assert "faster than the predicted ceiling" in faster["note"]
    fp8 = prediction(llama_folder, {**best, "settings": {"kv_cache_dtype": "fp8"}}, lengths, hardware)
    assert not fp8["available"] and "quantized" in fp8["reason"]


def test_the_engine_sweeps_pick_is_served_three_times_beside_its_runner_up_and_a_fluke_does_not_win(monkeypatch):
    """A grid's one run per configuration is not a pick: each configuration is served three times within its engine
    start (a start costs far more than a workload), and the verdict is made on those runs. Here max_num_seqs 4's
    first run is a fluke (900 tok/s; then 150 and 160), and max_num_seqs 2's third run fails: it is served once more
    in an engine start of its own, so that the winner has three runs; it is confirmed against max_num_seqs 1."""
    import importlib

    from workers.engine.sweep.result import ServeSweepResult
    from workers.engine.sweep.workload import Workload

    module = importlib.import_module("workers.engine.serving.serve_sweep")
    scripted = {1: [200.0, 205.0, 210.0], 2: [300.0, 305.0, None, 310.0], 4: [900.0, 150.0, 160.0]}
    starts = []

    def fake_run_trials(session, settings, clients, workload, timeout, first_id, progress):
        starts.append((settings["max_num_seqs"], len(clients)))
        served = []
        for offset, client in enumerate(clients):
            tokens_per_s = scripted[settings["max_num_seqs"]].pop(0)
            served.append({"id": first_id + offset, "settings": settings, "client": client,
                           "status": "ok" if tokens_per_s else "failed", "reason": None,
                           "metrics": {"output_tokens_per_s": tokens_per_s, "goodput_requests_per_s": None},
                           "workload": {"requests": workload.requests}})
        return served

    class FakeSession:
        def settings(self, settings):
            return settings

    monkeypatch.setattr(module, "run_trials", fake_run_trials)
    workload = Workload.from_dict({"requests": 8, "prompt_len": 8, "output_len": 8})
    trials, search = module.run_search(FakeSession(), [({"max_num_seqs": seqs}, [{}]) for seqs in (1, 2, 4)],
                                       workload, {"search": "grid", "startup_timeout_s": 60},
                                       lambda fraction, message: None)
    assert starts == [(1, 3), (2, 3), (4, 3), (2, 1)]
    assert search["repeats"] == {"runs": 7, "engine_starts": 1} and search["trials_run"] == 10
    assert [trial["id"] for trial in trials] == list(range(10))
    best = module.best_trial(trials, workload)
    verdict = best["verdict"]
    assert best["settings"] == {"max_num_seqs": 2} and best["runs"] == [300.0, 305.0, 310.0]
    assert best["metrics"]["output_tokens_per_s"] == 305.0 == best["spread"]["median"]  # the median run's figures
    assert verdict["verdict"] == "confirmed" and verdict["runner_up"]["settings"] == {"max_num_seqs": 1}
    assert verdict["runner_up"]["runs"] == [200.0, 205.0, 210.0]
    # Stored and read back, and a report stored before verdicts still reads
    stored = ServeSweepResult.from_dict({"trials": trials, "verdict": verdict, "best": {
        "id": best["id"], "settings": best["settings"], "runs": best["runs"], "spread": best["spread"]}})
    assert stored.verdict.confirmed and stored.verdict.runner_up.label == "max_num_seqs=1"
    assert stored.best.runs == [300.0, 305.0, 310.0] and stored.trials[-1].repeat
    old = ServeSweepResult.from_dict({"trials": trials[:3], "best": {"id": 2, "settings": {"max_num_seqs": 4}}})
    assert old.verdict is None and old.best.runs is None


def test_an_engine_pick_within_the_noise_of_its_runner_up_is_a_tie_judged_on_goodput_under_slos(monkeypatch):
    import importlib

    from workers.engine.sweep.workload import Workload

    module = importlib.import_module("workers.engine.serving.serve_sweep")
    goodput = {2: [4.0, 2.0, 3.5], 4: [3.0, 3.2, 2.5]}

    def fake_run_trials(session, settings, clients, workload, timeout, first_id, progress):
        return [{"id": first_id + offset, "settings": settings, "client": client, "status": "ok",
                 "metrics": {"goodput_requests_per_s": goodput[settings["max_num_seqs"]].pop(0),
                             "output_tokens_per_s": 1000.0 * settings["max_num_seqs"]},  # not the deciding figure
                 "workload": {"requests": workload.requests}} for offset, client in enumerate(clients)]

    class FakeSession:
        def settings(self, settings):
            return settings

    monkeypatch.setattr(module, "run_trials", fake_run_trials)
    workload = Workload.from_dict({"requests": 8, "prompt_len": 8, "output_len": 8, "slo": {"ttft_s": 0.5}})
    trials, _ = module.run_search(FakeSession(), [({"max_num_seqs": seqs}, [{}]) for seqs in (2, 4)], workload,
                                  {"search": "grid", "startup_timeout_s": 60}, lambda fraction, message: None)
    best = module.best_trial(trials, workload)
    assert best["verdict"]["figure"] == "goodput_requests_per_s" and best["settings"] == {"max_num_seqs": 2}
    assert best["verdict"]["verdict"] == "inconclusive at this noise" and best["runs"] == [4.0, 2.0, 3.5]
    assert best["metrics"]["goodput_requests_per_s"] == 3.5  # the median run
