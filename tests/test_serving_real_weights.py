"""Validated means accurate: the demo model (SmolLM2-135M-Instruct, real weights) served by vLLM's CPU build and
checked against transformers in float32 on the release's checkpoint: chat-template parity, the answers (greedy
divergence, teacher-forced top-1 agreement, |Δ logprob|, top-k KL, alone and batched), and the accuracy gate
(lm-evaluation-harness against the served endpoint and against the reference) decide which configuration may be
the recipe. A checkpoint with an altered chat template and one corrupted tensor is caught, each named."""

import json
import shutil
from pathlib import Path

import pytest

from workers.engine.serving.accuracy import gate, perplexity_change
from workers.engine.serving.client import Endpoint
from workers.engine.serving.engines import Engine
from workers.engine.serving.reference_check import Reference, check_engine
from workers.engine.serving.serve_sweep import Session
from workers.engine.serving.stage import serve_sweep

pytestmark = pytest.mark.slow

ENGINE = {"enforce_eager": True, "max_num_seqs": 2, "block_size": 32}
WORKLOAD = {"requests": 4, "prompt_len": 32, "output_len": 8, "warmup_requests": 1}


@pytest.fixture(autouse=True)
def _engine_core_in_process(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="module")
def dtype_sweep(demo_checkpoint, vllm_python):
    """One serve sweep of the demo model over float32 and bfloat16, with the accuracy gate."""
    config = json.loads((demo_checkpoint / "config.json").read_text())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("D0_ENGINES", f"vllm={vllm_python}")
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return serve_sweep({"config": config, "weights_path": str(demo_checkpoint), "settings": ENGINE,
                            "grid": {"dtype": ["float32", "bfloat16"]}, "workload": WORKLOAD,
                            "startup_timeout_s": 600}, lambda fraction, message: None)


@pytest.mark.timeout(30 * 60)
def test_float32_and_bfloat16_are_each_checked_against_the_float32_reference(dtype_sweep):
    entries = {entry["numerics"]["dtype"]: entry for entry in dtype_sweep["quality"]["entries"]}
    assert set(entries) == {"float32", "bfloat16"}
    reference = dtype_sweep["quality"]["reference"]
    assert reference["implementation"] == "transformers" and reference["dtype"] == "float32"
    # The demo model answers: the reference's greedy answer to the capital question names Paris.
    assert "Paris" in next(p["answer"] for p in reference["prompts"] if p["name"] == "capital")
    # Prompts shorter and longer than a KV-cache block (32 tokens here).
    lengths = [prompt["prompt_tokens"] for prompt in reference["prompts"]]
    assert min(lengths) < ENGINE["block_size"] < max(lengths) and max(lengths) > 4 * ENGINE["block_size"]
    for dtype, entry in entries.items():
        correctness = entry["correctness"]
        assert correctness["parity"]["equal"], correctness["parity"]
        for mode in ("single", "batched"):
            figures = correctness[mode]
            assert figures["tokens_compared"] == 5 * reference["tokens"]
            for key in ("top1_agreement", "mean_abs_logprob", "max_abs_logprob", "mean_topk_kl"):
                assert figures[key] is not None, (dtype, mode, key)
            assert figures["top1_agreement"] >= correctness["thresholds"]["top1_agreement"]
        assert correctness["verdict"] == "pass", correctness["reasons"]
    # float32 matches the reference to kernel order; bfloat16 rounding moves logprobs by far more.
    assert entries["float32"]["correctness"]["single"]["max_abs_logprob"] < 1e-3
    assert entries["float32"]["correctness"]["precision_class"] == "float32"
    assert entries["bfloat16"]["correctness"]["precision_class"] == "16-bit"
    assert (entries["bfloat16"]["correctness"]["single"]["mean_abs_logprob"]
            > 10 * entries["float32"]["correctness"]["single"]["mean_abs_logprob"])
    # The recipe's configuration is one that passed, and its correctness says against what.
    assert dtype_sweep["correctness"]["kind"] == "real weights"
    assert dtype_sweep["correctness"]["verdict"] == "pass"
    assert dtype_sweep["recipe"]["settings"]["dtype"] in ("float32", "bfloat16")
    assert all(trial["quality"]["verdict"] == "pass" for trial in dtype_sweep["trials"] if trial["status"] == "ok")


@pytest.mark.timeout(30 * 60)
def test_the_accuracy_gate_runs_lm_eval_on_both_sides_and_decides(dtype_sweep):
    quality = dtype_sweep["quality"]
    reference = quality["reference"]["accuracy"]
    assert reference["source"] == "measured" and reference["harness"] == "lm-eval 0.4.13 hf"
    for entry in quality["entries"]:
        served = entry["accuracy"]
        assert served["harness"] == "lm-eval 0.4.13 local-completions"
        for result in (served, reference):
            assert result["n"] == len(result["samples"]) >= 100 and result["metric"] == "acc"
            assert result["correct"] == sum(sample["correct"] for sample in result["samples"])
            assert result["wilson_lower_95"] < result["accuracy"] and 0 < result["stderr"] < 0.1
            assert result["accuracy"] > 0.6  # four choices: chance is 25%
        # The same model on the same items: an item or two may flip between bfloat16 and float32, no more.
        assert abs(served["accuracy"] - reference["accuracy"]) <= 0.03
        assert entry["gate"]["passed"] and entry["gate"]["reference_source"] == "measured", entry["gate"]["rule"]
        # A published score the served model does not reach fails the gate, as no drop allowed at all does.
        assert not gate(served, 0.98, max_drop_points=5)["passed"]
        assert not gate(served, reference, max_drop_points=0)["passed"]
        # Through the chat API (the engine applies the template) and on a local text.
        chat = entry["chat_accuracy"]
        assert chat["harness"] == "lm-eval 0.4.13 local-chat-completions" and chat["n"] == 27
        assert chat["accuracy"] > 0.6
        change = perplexity_change(entry["perplexity"], reference["perplexity"])
        assert abs(change["relative"]) < 0.05, change
    first = quality["entries"][0]["accuracy"]["samples"][0]
    assert first["prompt"] == "Question: What is the opposite of hot?\nAnswer:" and first["target"] == "cold"


def _altered_copy(original: Path, into: Path) -> str:
    """The checkpoint with its chat template's system prompt reworded and one attention projection's output rows
    reversed (a shard written in the wrong order); returns that tensor's name."""
    import torch
    from safetensors.torch import load_file, save_file

    into.mkdir()
    for item in original.iterdir():
        if item.name not in ("model.safetensors", "chat_template.jinja"):
            shutil.copy(item, into / item.name)
    template = (original / "chat_template.jinja").read_text()
    assert "named SmolLM" in template
    (into / "chat_template.jinja").write_text(template.replace("named SmolLM", "named Smol"))
    tensors = load_file(original / "model.safetensors")
    name = "model.layers.5.self_attn.o_proj.weight"
    tensors[name] = torch.flip(tensors[name], dims=[0]).contiguous()
    save_file(tensors, into / "model.safetensors", metadata={"format": "pt"})
    return name


@pytest.mark.timeout(20 * 60)
def test_an_altered_chat_template_and_a_corrupted_tensor_are_caught_and_named(demo_checkpoint, vllm_python,
                                                                              tmp_path):
    altered = tmp_path / "altered"
    corrupted = _altered_copy(demo_checkpoint, altered)
    engine = Engine("vllm", vllm_python)
    session = Session(engine, engine.probe(), altered, tmp_path / "logs", max_model_len=1024)
    reference = Reference(demo_checkpoint)
    from workers.engine.serving.reference_check import weights_versus_reference

    server, _ = session.server({**ENGINE, "dtype": "float32"})
    with server:
        server.wait_healthy(600)
        report = check_engine(Endpoint(server.base_url, "d0"), reference, dtype="float32",
                              weights=weights_versus_reference(altered, demo_checkpoint))
    print(json.dumps({key: report[key] for key in ("verdict", "reasons")}, indent=1))
    assert report["verdict"] == "fail"
    reasons = report["reasons"]
    # The template: the chat prompts that take its default system prompt differ from the reference's there (the
    # prompt with a system message of its own, and the raw one, keep the reference's tokens).
    assert any(reason.startswith("chat template parity") and "SmolLM" in reason for reason in reasons)
    assert {row["prompt"] for row in report["parity"]["mismatches"]} == {"capital", "arithmetic", "long"}
    # The weights: the answers leave the reference's (fed the reference's own ids), and the tensor is named.
    assert any(reason.startswith("answers (single): top-1 agreement") for reason in reasons)
    assert report["single"]["max_abs_logprob"] > 1.0
    assert any(reason.startswith("weights: 1 tensor(s)") and corrupted in reason for reason in reasons)
    # The first diverging prompt is shown side by side.
    shown = report["first_diverging_prompt"]
    assert shown["reference_answer"] != shown["engine_answer"]
