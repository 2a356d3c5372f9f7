"""Quantized variants of the demo checkpoint, made with the engine's interpreter and served by vLLM's CPU build:
each answers a greedy chat question as the model does. One quantization and one engine start per variant."""

import json
import time
import urllib.request
from pathlib import Path

import pytest

from workers.engine.serving.launchers import VllmLauncher
from workers.engine.serving.server import EngineServer, free_port
from workers.engine.serving.variants import VariantFailed, check_variants, missing_cpu_flags, prepare_variant

CPU_SETTINGS = {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1, "max_model_len": 1024, "enforce_eager": True}


def four_bit_variant() -> str:
    """The 4-bit variant this CPU serves best: weight-only where vLLM's CPU build has its kernel (AVX-512)."""
    return "w4a8-int" if missing_cpu_flags("w4a16") else "w4a16"


def test_it_takes_known_variants_once_each():
    assert check_variants(["as_shipped", "w8a8-int8"]) == ["as_shipped", "w8a8-int8"]
    with pytest.raises(ValueError, match="unknown variants: w3; known: as_shipped, w8a8-int8"):
        check_variants(["w3"])
    with pytest.raises(ValueError, match="more than once: w4a16"):
        check_variants(["w4a16", "w4a16"])
    with pytest.raises(ValueError, match="non-empty list"):
        check_variants("w4a16")


def test_it_names_the_cpu_flags_a_variant_needs_that_the_cpu_lacks(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert missing_cpu_flags("w4a16", tmp_path / "cpuinfo") == ["avx512f"]
    assert missing_cpu_flags("w4a8-int", tmp_path / "cpuinfo") == []
    assert missing_cpu_flags("w4a16", tmp_path / "absent") == []


def test_the_checkpoint_as_shipped_is_served_from_where_it_is(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"0" * 10)
    variant = prepare_variant("as_shipped", checkpoint=tmp_path, engine_python="unused", out=tmp_path / "x")
    assert variant == {"name": "as_shipped", "path": str(tmp_path), "settings": {}, "bits": None,
                       "method": "as shipped", "made_by": "as shipped", "seconds": 0.0, "disk_bytes": 10,
                       "threshold": None}


@pytest.mark.slow
def test_a_failed_quantization_says_what_the_tool_said(tmp_path, vllm_python):
    with pytest.raises(VariantFailed, match=r"making w8a8-int8 failed \(exit 1\)(.|\n)*not-a-checkpoint"):
        prepare_variant("w8a8-int8", checkpoint=tmp_path / "not-a-checkpoint", engine_python=vllm_python,
                        out=tmp_path / "out")


def chat(base_url: str, question: str) -> str:
    body = json.dumps({"model": "d0", "messages": [{"role": "user", "content": question}], "max_tokens": 16,
                       "temperature": 0}).encode()
    request = urllib.request.Request(base_url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"]


@pytest.mark.slow
@pytest.mark.timeout(15 * 60)
@pytest.mark.parametrize("name", ["w8a8-int8", four_bit_variant()])
def test_a_quantized_variant_serves_and_answers_as_the_model_does(name, demo_checkpoint, vllm_python, tmp_path):
    variant = prepare_variant(name, checkpoint=demo_checkpoint, engine_python=vllm_python, out=tmp_path / name)
    config = json.loads((Path(variant["path"]) / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    shipped = sum(path.stat().st_size for path in demo_checkpoint.glob("*.safetensors"))
    assert variant["disk_bytes"] < shipped
    port = free_port()
    launch = VllmLauncher.launch(vllm_python, Path(variant["path"]), {**CPU_SETTINGS, **variant["settings"]},
                                 port=port, cpu_build=True)
    started = time.perf_counter()
    with EngineServer(launch.command, env={**launch.env, "HF_HUB_OFFLINE": "1"}, port=port,
                      log_path=tmp_path / "engine.log") as server:
        server.wait_healthy(600)
        answer = chat(server.base_url, "What is the capital of France?")
    print(json.dumps({**variant, "answer": answer, "engine_start_s": round(server.healthy_after_s, 1),
                      "engine_s": round(time.perf_counter() - started, 1)}))
    assert "Paris" in answer, (answer, server.log_text()[-3000:])
