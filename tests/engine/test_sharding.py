"""Sharded validation runs on CPU: real torch.distributed (gloo) ranks started as processes, each run checked
against the single-process fp32 reference. Models are 2 layers of width 64 with a 512-token vocabulary, built
from the shipped config.json files, so a run of two ranks takes a few seconds."""

import contextlib
import json
import subprocess
import sys
import time
import os
from pathlib import Path

import psutil
import pytest

from workers.engine.models import build_random_model, load_config, reduce_for_layout
from workers.engine.sharding import ShardedRunError, run_sharded, shard_stage
from workers.engine.sharding.layout import Layout

from .conftest import CONFIGS, ROOT



def load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def assert_matches_reference(report: dict) -> None:
    assert report["correct"], {key: report[key] for key in ("max_abs_diff", "greedy_tokens_matching", "tokens")}
    assert report["max_abs_diff"] <= 1e-4
    assert report["greedy_match"] and report["greedy_tokens"] == 17  # the prefill's token + 16 decode steps
    assert report["top1_agreement"] == 1.0


def rank_processes_left() -> list:
    # The analysis process an earlier test's upload started (it outlives the request by design) is not a rank.
    left = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # gone between the listing and the look
            if "workers.engine.analysis.worker" not in process.cmdline():
                left.append(process)
    return left


def test_the_reduction_for_a_layout_keeps_deepseek_v3s_layer_kinds_and_routing_shape():
    reduction = reduce_for_layout(load("deepseek-v3.json"), tp=2, ep=2)
    small = reduction.config
    assert small["num_hidden_layers"] == 2 and small["first_k_dense_replace"] == 1  # one dense, one MoE layer
    assert small["num_attention_heads"] % 2 == 0 and small["kv_lora_rank"] == 32  # tp splits the heads; MLA kept
    assert small["n_routed_experts"] == 8 and small["n_routed_experts"] % 2 == 0 and small["n_shared_experts"] == 1
    assert small["n_group"] == 2 and small["topk_group"] == 1  # still group-limited routing
    assert small["qk_rope_head_dim"] == 64  # the release's head dims: what attention kernels care about
    assert "quantization_config" not in small and "auto_map" not in small


def test_the_reduction_serves_every_layout_from_one_model_path():
    """Kimi-K2's model_type is unknown to transformers: it resolves as DeepSeek-V3, as analysis resolves it (the
    sharded run once refused it). DBRX keeps its sizes in nested configs: reduced, it is small (it was OOM-killed)."""
    kimi = reduce_for_layout(load("kimi-k2-instruct.json"), tp=2)
    assert kimi.layers == 2 and kimi.config["num_attention_heads"] % 2 == 0
    dbrx = reduce_for_layout(load("dbrx.json"), tp=2, ep=2)
    assert dbrx.config["ffn_config"]["moe_num_experts"] % 2 == 0
    dense = reduce_for_layout(load("llama-3.1-8b.json"), pp=4)
    assert dense.layers == 4 and "repeated to 4 layers" in dense.notes[-1]
    mqa = reduce_for_layout({**load("llama-3.1-8b.json"), "num_key_value_heads": 1}, tp=4)
    assert mqa.config["num_key_value_heads"] % 4 == 0 and "x4" in mqa.notes[-1]
    with pytest.raises(ValueError, match="ep=2 needs routed experts"):
        reduce_for_layout(load("llama-3.1-8b.json"), ep=2)


def test_expert_parallel_across_other_ranks_than_the_tensor_split_is_refused():
    with pytest.raises(ValueError, match="ep must equal tp"):
        Layout(tp=2, ep=4)


@pytest.mark.slow
def test_tensor_parallel_llama_on_two_processes_matches_the_reference():
    report = run_sharded(load("llama-3.1-8b.json"), tp=2, timeout_s=120)
    assert_matches_reference(report)
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    assert "model.layers.*.self_attn.q_proj" in report["layout"]["tensor_plan"]["colwise"]
    for rank in report["ranks"]:
        assert rank["collectives"]["by_kind"]["all_reduce"]["calls"] > 0
        assert rank["prefill_s"] > 0 and rank["decode_s_per_step"] > 0 and rank["peak_rss_bytes"] > 0
    assert report["ranks"][0]["held_parameter_bytes"] == report["ranks"][1]["held_parameter_bytes"]


@pytest.mark.slow
def test_tensor_parallel_qwen3_moe_splits_each_expert_and_matches_the_reference():
    report = run_sharded(load("qwen3-30b-a3b.json"), tp=2, timeout_s=120)
    assert_matches_reference(report)
    assert "model.layers.*.mlp.experts.gate_up_proj" in report["layout"]["tensor_plan"]["packed_colwise"]
    assert "warning" in report["routing"]


@pytest.mark.slow
def test_pipeline_parallel_mixtral_from_a_local_safetensors_checkpoint_matches_the_reference(tmp_path):
    import torch

    reduced = reduce_for_layout(load("mixtral-8x7b-v0.1.json"), pp=2).config
    model = build_random_model(load_config(reduced), dtype=torch.float32, device=torch.device("cpu"), seed=3)
    model.save_pretrained(tmp_path)
    report = run_sharded(None, pp=2, weights_path=str(tmp_path), timeout_s=120)
    assert_matches_reference(report)
    assert report["layout"]["stages"] == [[0, 0], [1, 1]]
    assert [rank["layers"] for rank in report["ranks"]] == [[0, 0], [1, 1]]
    assert report["ranks"][0]["collectives"]["by_kind"]["send"]["calls"] == 17
    assert "warning" not in report["routing"]  # real (if tiny) weights: no random-routing caveat


@pytest.mark.slow
def test_expert_parallel_qwen3_moe_dispatches_tokens_and_reports_routing_imbalance():
    report = run_sharded(load("qwen3-30b-a3b.json"), ep=2, timeout_s=120)
    assert_matches_reference(report)
    assert report["layout"]["experts_per_rank"] == 2  # the reduced model keeps 4 of the 128 experts
    assert report["ranks"][0]["collectives"]["by_kind"]["all_to_all"]["calls"] > 0
    layer = report["routing"]["layers"]["0"]
    prompt_and_decode_tokens = 8 + 16
    assert sum(layer["tokens_per_expert"]) == prompt_and_decode_tokens * report["model"]["experts_per_token"]
    assert layer["imbalance"] >= 1.0 and len(layer["tokens_per_ep_rank"]) == 2
    assert "random weights" in report["routing"]["warning"]


@pytest.mark.slow
def test_deepseek_v3_with_experts_spread_over_the_tensor_parallel_ranks_matches_the_reference():
    report = run_sharded(load("deepseek-v3.json"), tp=2, ep=2, timeout_s=120)
    assert_matches_reference(report)
    assert report["world_size"] == 2 and report["layout"]["experts_per_rank"] == 4
    assert list(report["routing"]["layers"]) == ["1"]  # layer 0 stays dense, as first_k_dense_replace says


@pytest.mark.slow
def test_a_mis_split_fused_projection_is_reported_incorrect_with_the_diff():
    report = run_sharded(load("mixtral-8x7b-v0.1.json"), tp=2, fault="corrupt_shard", timeout_s=120)
    assert report["correct"] is False
    assert report["max_abs_diff"] > 1e-3
    assert report["ranks"][1]["corrupted"] == {"tensor": "model.layers.0.mlp.experts.gate_up_proj"}


@pytest.mark.slow
def test_bf16_on_the_node_device_is_within_the_bf16_bound_of_the_fp32_cpu_reference():
    # One rank: the comparison is the device and dtype against the CPU fp32 reference, not the split.
    report = run_sharded(load("llama-3.1-8b.json"), dtype="bf16", timeout_s=120)
    assert report["correct"] and report["dtype"] == "bf16" and report["reference"]["dtype"] == "fp32"
    assert 1e-4 < report["max_rel_diff"] <= report["thresholds"]["max_rel_diff"]  # rounding shows, within bound
    assert report["top1_agreement"] >= 0.9


@pytest.mark.slow
def test_two_launcher_calls_on_separate_nodes_form_one_world_and_match_the_reference():
    from workers.engine.sharding.launcher import free_port

    port = free_port()
    config = json.dumps(load("llama-3.1-8b.json"))
    callers = []
    try:
        for node_rank in (0, 1):
            code = ("import json, sys; from workers.engine.sharding import run_sharded; "
                    f"report = run_sharded(json.loads(sys.argv[1]), tp=2, device='cpu', timeout_s=90, rendezvous=dict("
                    f"master_addr='127.0.0.1', master_port={port}, world_size=2, node_rank={node_rank}, "
                    "nproc_per_node=1)); print(json.dumps(report))")
            callers.append(subprocess.Popen([sys.executable, "-c", code, config], cwd=ROOT,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [caller.communicate(timeout=100) for caller in callers]
    finally:
        for caller in callers:
            if caller.poll() is None:
                caller.kill()
                caller.wait()
    assert [caller.returncode for caller in callers] == [0, 0], [err[-2000:] for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    for report in reports:
        assert_matches_reference(report)
        assert report["world_size"] == 2
        assert [rank["node_rank"] for rank in report["ranks"]] == [0, 1]
    assert reports[0]["tokens"] == reports[1]["tokens"]


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_at_the_deadline_naming_it_and_leaves_no_processes():
    started = time.monotonic()
    with pytest.raises(ShardedRunError, match="did not finish within 20s") as raised:
        run_sharded(load("llama-3.1-8b.json"), tp=2, fault="hang_rank_1", timeout_s=20)
    assert time.monotonic() - started < 30
    assert "rank 1 running, last output: 'fault hang_rank_1: rank 1 stops responding after prefill'" \
        in str(raised.value)
    assert rank_processes_left() == []


def test_a_rank_that_raised_and_then_aborted_is_described_by_its_exception(tmp_path):
    # Seen 1 run in 8: a rank raised, then died by SIGABRT in gloo's threads at exit, and its last line was
    # "terminate called without an active exception", which said nothing of why it failed.
    from workers.engine.sharding.launcher import RankProcess, _describe

    log = tmp_path / "rank1.log"
    script = ("import os, sys; print('[rank1]: Traceback (most recent call last):'); "
              "print('[rank1]: ValueError: fault corrupt_shard: no shard to mis-split'); "
              "print('terminate called without an active exception'); sys.stdout.flush(); os.abort()")
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=output, stderr=subprocess.STDOUT)
        process.wait()
    described = _describe([RankProcess(rank=1, local_rank=1, process=process, log_path=log)])
    assert described == ("rank 1 killed by SIGABRT, after raising: "
                         "'[rank1]: ValueError: fault corrupt_shard: no shard to mis-split'")


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_at_once_with_a_clear_error_and_leaves_no_processes():
    started = time.monotonic()
    with pytest.raises(ShardedRunError, match="rank 1 killed by SIGKILL") as raised:
        run_sharded(load("llama-3.1-8b.json"), tp=2, fault="kill_rank_1", timeout_s=120)
    assert time.monotonic() - started < 60  # well before the deadline
    assert "kill_rank_1" in str(raised.value)  # what it printed last
    assert {rank["state"] for rank in raised.value.ranks} >= {"killed by SIGKILL"}
    assert rank_processes_left() == []


@pytest.mark.slow
def test_the_cli_prints_the_report_as_json_without_django():
    code = ("import sys; [sys.modules.__setitem__(n, None) for n in ('django', 'adaptation', 'd0web')]; "
            "import runpy; "
            f"sys.argv = ['x', 'shard', '{CONFIGS / 'mixtral-8x7b-v0.1.json'}', '--tp', '2', '--decode-steps', '4', "
            "'--device', 'cpu', '--timeout', '120', '--json']; runpy.run_module('workers.engine', run_name='__main__')")
    finished = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=150)
    assert finished.returncode == 0, finished.stderr[-2000:]
    report = json.loads(finished.stdout)
    assert {"world_size", "layout", "correct", "max_abs_diff", "greedy_match", "ranks"} <= set(report)
    assert report["correct"] and report["world_size"] == 2 and len(report["ranks"]) == 2


def test_the_shard_stage_refuses_an_unknown_parameter_before_starting_ranks():
    with pytest.raises(ValueError, match="tensor_parallel: sharded_run takes no such parameter; it takes: tp, pp"):
        shard_stage({"config": load("llama-3.1-8b.json"), "tensor_parallel": 2}, lambda fraction, message: None)


def test_every_tensor_parallel_style_transformers_plans_with_is_supported():
    """Fails when a transformers release (or a model added to it) plans with a style d0 cannot apply."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    from workers.engine.sharding.tensor_parallel import SUPPORTED_STYLES

    used: dict[str, set[str]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        try:
            plan = getattr(CONFIG_MAPPING[model_type], "base_model_tp_plan", None) or {}
        except (ImportError, KeyError, AttributeError):
            continue
        for style in plan.values():
            used.setdefault(style, set()).add(model_type)
    assert len(used) >= 10
    assert {style: sorted(models)[:3] for style, models in used.items() if style not in SUPPORTED_STYLES} == {}


@pytest.mark.parametrize("name, config", [
    # MLA with its latent projection (mla_kv_a_proj): heads split in q_b_proj, kv_b_proj and o_proj.
    ("deepseek-v3.2", lambda: load("deepseek-v3.2.json")),
    # GLM's dense MLP: down_proj's input arrives whole (rowwise_split_input).
    ("glm4", lambda: __import__("transformers").Glm4Config().to_dict() | {"model_type": "glm4"}),
    # Llama-4's experts: down_proj packed along its input (packed_rowwise).
    ("llama-4-scout", lambda: load("llama-4-scout-17b-16e-instruct.partial.json")),
])
@pytest.mark.slow
def test_styles_that_once_refused_to_shard_now_match_the_reference(name, config):
    report = run_sharded(config(), tp=2, decode_steps=4, timeout_s=240)
    assert report["correct"], (name, report["max_abs_diff"])
    assert report["greedy_match"]


@pytest.mark.slow
def test_a_layout_whose_plan_leaves_most_weights_whole_is_reported_weakly_sharded():
    """gpt-oss's plan in the pinned transformers splits only the embedding and the LM head: the run is correct, but
    each rank holds most of the model, and the report says so instead of calling it a tp=2 validation."""
    weak = run_sharded(load("gpt-oss-20b.json"), tp=2, decode_steps=2, timeout_s=240)
    assert weak["correct"] and weak["split"]["weakly_sharded"]
    assert weak["split"]["largest_share"] > 0.6 and abs(weak["split"]["ideal_share"] - 0.5) < 0.03
    assert any(".self_attn." in item["name"] for item in weak["split"]["largest_replicated"])
    even = run_sharded(load("llama-3.1-8b.json"), tp=2, decode_steps=2, timeout_s=240)
    assert not even["split"]["weakly_sharded"] and abs(even["split"]["largest_share"] - 0.5) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-3.1-8b.json", "qwen3-30b-a3b.json", "deepseek-v3.2.json", "jamba-v0.1.json",
                                  "llama-4-scout-17b-16e-instruct.partial.json", "kimi-k2-instruct.json",
                                  "gpt-oss-20b.json"])
def test_a_mis_split_shard_is_detected_on_every_family_or_the_fault_is_refused(name):
    """corrupt_shard must corrupt a split tensor (and the verdict must catch it), or refuse: a fault that touched
    nothing would let a correct verdict pass for a detection."""
    try:
        report = run_sharded(load(name), tp=2, decode_steps=2, fault="corrupt_shard", timeout_s=240)
    except ShardedRunError as refused:
        assert "no shard to mis-split" in str(refused)
        assert name == "gpt-oss-20b.json"  # its plan in the pinned transformers splits no layer
        return
    assert report["ranks"][1]["corrupted"]["tensor"]
    assert report["correct"] is False and report["max_abs_diff"] > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dbrx.json", "jamba-v0.1.json", "nemotron-h-56b-base-8k.json",
                                  "llama-4-scout-17b-16e-instruct.partial.json"])
def test_pipeline_stages_split_decoders_of_other_shapes_and_hybrid_caches(name):
    """DBRX keeps its layers in transformer.blocks (not model.layers), Llama-4's text model is its own decoder;
    Jamba's and Nemotron-H's caches hold Mamba state or nothing for some layers, which a stage that skips them must
    leave alone (and Nemotron-H picks each layer's mask by the layer's block_type)."""
    report = run_sharded(load(name), pp=2, decode_steps=2, timeout_s=240)
    assert report["correct"], report["max_abs_diff"]
    assert report["layout"]["stages"][1][0] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dbrx.json", "llama-4-scout-17b-16e-instruct.partial.json"])
def test_experts_without_a_transformers_ep_plan_are_spread_over_ranks_too(name):
    """The pinned transformers gives DBRX and Llama-4 no expert-parallel plan: their experts modules are found by
    what they are. DBRX's dispatch experts keep their GLU weights flattened in a child; Llama-4's run every expert on
    every (pre-weighted) token, so each rank runs its block and the outputs are summed."""
    report = run_sharded(load(name), ep=2, decode_steps=2, timeout_s=240)
    assert report["correct"], report["max_abs_diff"]
    assert report["layout"]["experts_per_rank"] >= 1


def test_work_folders_are_removed_on_return_on_error_and_after_a_kill(tmp_path, monkeypatch):
    import tempfile

    from workers.engine import workdirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with workdirs.workdir("d0-shard-") as folder:
        assert (Path(folder) / workdirs.OWNER_FILE).read_text() == str(os.getpid())
    assert not Path(folder).exists()
    with pytest.raises(RuntimeError), workdirs.workdir("d0-serve-") as folder:
        raise RuntimeError("a rank crashed")
    assert not Path(folder).exists()
    # A folder left by a killed node worker (its process is gone), one of a live process, and one not d0's
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for name, owner in (("d0-shard-killed", dead), ("d0-serve-running", str(os.getpid()))):
        (tmp_path / name).mkdir()
        (tmp_path / name / workdirs.OWNER_FILE).write_text(owner)
    (tmp_path / "d0-shard-no-owner").mkdir()
    assert workdirs.remove_stale() == [str(tmp_path / "d0-shard-killed")]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["d0-serve-running", "d0-shard-no-owner"]


def test_a_model_with_a_cache_class_of_its_own_gets_that_class():
    """MiniMax refuses any cache but its own MiniMaxCache (its lightning-attention states live apart): the reference
    and every rank must make the one the model accepts; others get transformers' DynamicCache from the config."""
    import torch
    from transformers import DynamicCache

    from workers.engine.sharding.reference import new_cache

    minimax = build_random_model(load_config(reduce_for_layout(load("minimax-m1.json")).config),
                                 dtype=torch.float32, device=torch.device("cpu"), seed=0)
    llama = build_random_model(load_config(reduce_for_layout(load("llama-3.2-1b.json")).config),
                               dtype=torch.float32, device=torch.device("cpu"), seed=0)
    assert type(new_cache(minimax)).__name__ == "MiniMaxCache"
    assert type(new_cache(llama)) is DynamicCache


@pytest.mark.slow
def test_minimax_lightning_attention_split_into_pipeline_stages_matches_the_reference():
    # Each stage's skipped layers take a placeholder in a cache that grows as it is updated (MiniMaxCache is made
    # without the config); the run used to stop on an IndexError there.
    report = run_sharded(load("minimax-m1.json"), pp=2, decode_steps=4, timeout_s=180)
    assert report["correct"], report.get("error")
    assert report["greedy_match"]
