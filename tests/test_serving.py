"""The serving engine's pieces that need no engine running: launch command lines, causes read from engine logs,
the safetensors header check (one small checkpoint per quantization format), engine probes and the recipe."""

import json
import os
import sys

import pytest

from tests.conftest import load_config
from tests.quantized_checkpoints import FORMATS, edit_tensors, quantize_folder
from workers.engine.serving.checkpoint import write_validation_checkpoint
from workers.engine.serving.engines import Engine, parse_engines
from workers.engine.serving.launchers import LAUNCHERS, check_settings
from workers.engine.serving.server import EngineServer, log_cause
from workers.engine.serving.tensors import CheckpointRefused, check_checkpoint


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
