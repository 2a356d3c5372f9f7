"""The reducer on every form a config gives its layer pattern in: the reduced config must build, keep every layer
kind of the full model and name the same layers in each per-layer key, remapped to the reduced depth."""

import copy
import json
import subprocess
import sys

import pytest

from workers.engine.analysis import analyze
from workers.engine.models import build_meta_model, load_config, reduce_config
from workers.engine.models.generic_decoder import UnbuildableLayers
from workers.engine.models.loading import causal_lm_config, text_config_dict
from workers.engine.models.reducer import layer_kinds, layout_kinds
from workers.engine.sharding import run_sharded

from .conftest import CONFIGS, ROOT


def catalog(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def reduced_and_full(config: dict):
    """The reduction and both transformers configs; the reduced one built on the meta device, so it is valid."""
    reduction = reduce_config(config)
    full, reduced = causal_lm_config(load_config(config)), causal_lm_config(load_config(reduction.config))
    full_kinds = {signature for _, signature in layer_kinds(build_meta_model(full))}
    assert {signature for _, signature in layer_kinds(build_meta_model(reduced))} == full_kinds
    # ... and every kind of the one layer description (mixer, window, MLP), not only every module class.
    full_layout = layout_kinds(text_config_dict(config), full)
    assert layout_kinds(reduction.config, reduced).keys() == full_layout.keys()
    assert reduced.num_hidden_layers == reduction.layers < full.num_hidden_layers
    return reduction, full, reduced


def kinds_by_layer(transformers_config, *keys: str) -> list[tuple]:
    return list(zip(*(getattr(transformers_config, key) for key in keys), strict=True))


def test_kimi_linears_one_based_index_lists_under_linear_attn_config_are_remapped_to_the_reduced_depth():
    # KDA in layers 1-3, MLA in layer 4 (1-based, as Kimi's code and vLLM read them), dense MLP in layer 1 only.
    reduction, full, reduced = reduced_and_full(catalog("kimi-linear-48b-a3b-instruct"))
    assert reduction.layers == 4 and reduction.config["num_hidden_layers"] == 4
    assert reduction.config["linear_attn_config"]["full_attn_layers"] == [4]
    assert reduction.config["linear_attn_config"]["kda_layers"] == [1, 2, 3]
    layers = kinds_by_layer(reduced, "layer_types", "mlp_layer_types")
    assert layers == kinds_by_layer(full, "layer_types", "mlp_layer_types")[:4]
    assert set(layers) == set(kinds_by_layer(full, "layer_types", "mlp_layer_types"))


def test_a_one_based_list_is_told_from_its_sibling_that_names_the_last_layer():
    config = catalog("kimi-linear-48b-a3b-instruct")
    # 12 layers, MLA at 6 and 12: full_attn_layers alone could be 0-based; kda_layers names layer 12 of 12.
    config.update(num_hidden_layers=12, linear_attn_config={
        **config["linear_attn_config"], "full_attn_layers": [6, 12],
        "kda_layers": [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]})
    reduction, full, reduced = reduced_and_full(config)
    assert reduction.layers == 6
    assert reduction.config["linear_attn_config"] == {**config["linear_attn_config"], "num_heads": 4,
                                                       "full_attn_layers": [6], "kda_layers": [1, 2, 3, 4, 5]}
    assert reduced.layer_types == full.layer_types[:6]


def test_an_index_list_that_fits_neither_base_is_left_and_named_in_the_notes():
    config = {**catalog("qwen3-0.6b"), "skip_layers": [3, 99]}  # layer 99 of 28: not a layer index
    reduction = reduce_config(config)
    assert reduction.config["skip_layers"] == [3, 99]
    assert "skip_layers could not be renumbered (its values fit neither base)" in reduction.notes


def test_a_zero_based_index_list_names_the_same_layers_after_the_cut():
    config = {**catalog("qwen3-30b-a3b"), "mlp_only_layers": [0, 3, 7]}  # dense layers 0, 3 and 7
    reduction, full, reduced = reduced_and_full(config)
    assert reduction.layers == 2 and reduction.config["mlp_only_layers"] == [0]
    assert [type(layer.mlp).__name__ for layer in build_meta_model(reduced).model.layers] == \
        ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"]


def test_layer_types_are_sliced_with_the_layers():
    config = {**catalog("qwen3-0.6b"), "sliding_window": 4096, "use_sliding_window": True,
              "layer_types": ["full_attention" if index % 3 == 0 else "sliding_attention" for index in range(28)]}
    reduction, full, reduced = reduced_and_full(config)
    assert reduction.layers == 2
    assert reduced.layer_types == ["full_attention", "sliding_attention"] == full.layer_types[:2]


def test_a_per_layer_list_of_flags_is_sliced_not_read_as_indices():
    # Llama-4's no_rope_layers ends in _layers but holds one 0/1 flag per layer.
    config = catalog("llama-4-scout-17b-16e-instruct.partial")
    reduction, full, reduced = reduced_and_full(config)
    assert reduced.no_rope_layers == full.no_rope_layers[:reduction.layers]
    assert set(reduced.no_rope_layers) == set(full.no_rope_layers)


def test_the_hybrid_override_pattern_keeps_every_block_kind():
    config = catalog("nemotron-h-56b-base-8k")
    reduction, full, reduced = reduced_and_full(config)
    pattern = config["hybrid_override_pattern"]
    assert reduction.config["hybrid_override_pattern"] == pattern[:reduction.layers]
    assert set(reduction.config["hybrid_override_pattern"]) == set(pattern)


def test_an_interval_pattern_reads_the_same_on_the_reduced_prefix():
    config = {**catalog("qwen3-30b-a3b"), "decoder_sparse_step": 2}  # experts in every 2nd layer, from the 2nd
    reduction, full, reduced = reduced_and_full(config)
    assert reduction.layers == 2 and reduced.decoder_sparse_step == 2
    assert "decoder_sparse_step unchanged" in reduction.invariants


@pytest.mark.parametrize(("name", "refused_kind"), [
    ("nemotron-h-56b-base-8k", "'mamba2' (hybrid_override_pattern)"),
    ("kimi-linear-48b-a3b-instruct", "'kda' (linear_attn_config.full_attn_layers, linear_attn_config.kda_layers)")])
def test_a_release_without_a_class_whose_layer_kind_d0_cannot_build_is_refused_naming_the_key(name, refused_kind):
    config = {**catalog(name), "model_type": "next_release", "architectures": ["NextReleaseForCausalLM"]}
    with pytest.raises(UnbuildableLayers) as refused:
        reduce_config(config)
    assert str(refused.value).startswith(f"layer kind {refused_kind} has no generic implementation")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("stage", "params"), [("op_coverage", {"compile": False}), ("sharded_run", {"tp": 2}),
                                               ("sweep", {})])
def test_each_stage_that_builds_the_model_raises_the_one_line_the_node_reports(stage, params):
    from workers.engine import stages

    config = {**catalog("nemotron-h-56b-base-8k"), "model_type": "nemotron_h_next",
              "architectures": ["NemotronHNextForCausalLM"]}
    with pytest.raises(UnbuildableLayers, match=r"^layer kind 'mamba2' \(hybrid_override_pattern\) has no generic "
                                                r"implementation: [^\n]*$"):
        stages.run_stage(stage, {"config": config, **params}, lambda *_: None)


def test_a_stage_that_needs_a_model_d0_cannot_build_fails_with_that_one_line(tmp_path):
    # What the node's operator command prints, and what the stage run's error carries (the node sends
    # "UnbuildableLayers: <message>" for the job's "Stage sharded_run failed on <node>: ...").
    config = {**catalog("nemotron-h-56b-base-8k"), "model_type": "nemotron_h_next",
              "architectures": ["NemotronHNextForCausalLM"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "workers.engine", "shard", str(path), "--tp", "2", "--device",
                           "cpu", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: layer kind 'mamba2' (hybrid_override_pattern) has no generic implementation: d0 "
                      "builds a release without a transformers class from softmax attention, MLA and MiniMax's "
                      "lightning attention with routed experts only"]
    assert "Traceback" not in done.stderr


def test_kimi_linear_goes_from_analysis_through_the_reduction_to_a_sharded_run_that_matches_the_reference():
    config = catalog("kimi-linear-48b-a3b-instruct")
    report = analyze(copy.deepcopy(config))
    assert 40e9 < report["total_params"] < 55e9  # 48B, as the release is named
    run = run_sharded(config, tp=2, decode_steps=4, device="cpu", timeout_s=240)
    assert run["correct"], run.get("error")
    assert run["model_class"] == "KimiLinearForCausalLM" and run["reduction"]["layers"] == 4


FALCON_180B = {  # fused query_key_value with grouped KV heads, spelled num_kv_heads (Falcon-180B's config.json)
    "alibi": False, "architectures": ["FalconForCausalLM"], "bias": False, "bos_token_id": 11, "eos_token_id": 11,
    "hidden_size": 14848, "layer_norm_epsilon": 1e-05, "model_type": "falcon", "multi_query": True,
    "new_decoder_architecture": True, "num_attention_heads": 232, "num_hidden_layers": 80, "num_kv_heads": 8,
    "parallel_attn": True, "vocab_size": 65024}


def test_a_fused_qkv_projection_with_grouped_kv_heads_keeps_its_group_under_the_spelling_its_class_reads():
    import torch

    from workers.engine.models import build_random_model, reduce_for_layout

    reduction = reduce_config(FALCON_180B)
    assert reduction.config["num_kv_heads"] == 2 and reduction.config["num_attention_heads"] == 4
    reduced = causal_lm_config(load_config(reduction.config))
    model = build_random_model(reduced, dtype=torch.float32, device=torch.device("cpu"))
    # Query heads plus a key and a value per KV head, each of the release's head dim (14848 / 232 = 64).
    assert model.transformer.h[0].self_attention.query_key_value.out_features == (4 + 2 * 2) * 64
    assert model(torch.arange(6).unsqueeze(0)).logits.shape == (1, 6, 512)
    for_tp2 = reduce_for_layout(FALCON_180B, tp=2).config
    assert for_tp2["num_kv_heads"] % 2 == 0 and for_tp2["num_attention_heads"] % for_tp2["num_kv_heads"] == 0


@pytest.mark.slow
def test_a_fused_qkv_release_with_grouped_kv_heads_runs_tp2_split_by_kv_group_and_a_mis_split_is_caught():
    """Falcon-180B's shape: transformers declares no tensor-parallel plan for it, so d0's own plan splits its fused
    query_key_value by KV group (tensor_parallel.fused_qkv_plan); each rank holds half the weights, tied embedding
    and LM head split alike."""
    from workers.engine.sharding import run_sharded

    run = run_sharded(copy.deepcopy(FALCON_180B), tp=2, decode_steps=4, device="cpu", timeout_s=240)
    assert run["correct"], run.get("error")
    assert run["layout"]["tensor_plan"]["colwise"][0] == "transformer.h.*.self_attention.query_key_value"
    for rank in run["ranks"]:
        split = rank["split"]
        assert abs(split["held_params"] - split["ideal_params"]) <= 0.1 * split["ideal_params"], split
    faulty = run_sharded(copy.deepcopy(FALCON_180B), tp=2, decode_steps=2, device="cpu", timeout_s=240,
                         fault="corrupt_shard")
    assert faulty["correct"] is False and faulty["ranks"][1]["corrupted"] == {
        "tensor": "transformer.h.0.mlp.dense_h_to_4h"}


def test_a_fused_qkv_projection_not_grouped_by_kv_head_is_refused_with_the_reason():
    import torch

    from workers.engine.models import build_random_model
    from workers.engine.sharding.tensor_parallel import fused_qkv_plan

    seven_b = {**FALCON_180B, "new_decoder_architecture": False, "multi_query": True, "num_kv_heads": None,
               "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 512}
    model = build_random_model(causal_lm_config(load_config(seven_b)), dtype=torch.float32,
                               device=torch.device("cpu"))
    with pytest.raises(ValueError, match="not grouped by KV head .new_decoder_architecture false."):
        fused_qkv_plan(model, 2)
