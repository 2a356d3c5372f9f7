"""Layer patterns read from the config whatever its keys (issue 31, item 1), and the figures analysis draws from them.

External truth: the vendors' published counts (adaptation/intake/catalog/configs/MANIFEST.md) and vLLM's own
KV-cache specs, computed in the vLLM environment from the same config.json (tests/engine/vllm_cache_specs.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from workers.engine.analysis.estimate import estimate_records
from workers.engine.analysis.report import analyze, kv_cache_model
from workers.engine.models.config_loading import ConfigView
from workers.engine.models.layers import (RECURRENT_MIXERS, SOFTMAX_MIXERS, find_pattern_keys, layer_layout,
                                          one_layer_per_kind, remap_layer_keys)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "adaptation" / "intake" / "catalog" / "configs"
PROBE = Path(__file__).with_name("vllm_cache_specs.py")


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def layout_of(raw: dict):
    return layer_layout(ConfigView(raw))


def mixers(raw: dict) -> list[str]:
    return [kind.mixer for kind in layout_of(raw).layers]


# A small dense decoder; each test adds the keys of the form it checks.
BASE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 1000, "intermediate_size": 512}
KIMI_LINEAR = config("kimi-linear-48b-a3b-instruct")


# ---- one test per key form -----------------------------------------------------------------------------------------


def test_a_nested_one_based_index_list_places_kimi_linears_mla_layers():
    # linear_attn_config.full_attn_layers [4, 8, ..., 27] of 27 layers: 1-based (27 is no 0-based index).
    layout = layout_of(KIMI_LINEAR)
    assert layout.indices(lambda kind: kind.mixer == "mla") == [3, 7, 11, 15, 19, 23, 26]
    assert layout.indices(lambda kind: kind.mixer == "kda") == [i for i in range(27) if i not in (3, 7, 11, 15, 19,
                                                                                                   23, 26)]
    assert layout.index_base == {"linear_attn_config.full_attn_layers": 1, "linear_attn_config.kda_layers": 1}
    assert layout.notes == ()


def test_an_ambiguous_nested_list_takes_the_releases_base_and_the_rest_of_its_section():
    # Some copies give full_attn_layers alone; [4, 8] of 10 layers fits both bases: kimi_linear counts from 1, and
    # the unlisted layers are the linear-attention section's own (KDA).
    raw = {**BASE, "num_hidden_layers": 10, "model_type": "kimi_linear", "kv_lora_rank": 64, "qk_rope_head_dim": 16,
           "linear_attn_config": {"full_attn_layers": [4, 8], "num_heads": 4, "head_dim": 32}}
    assert mixers(raw) == ["kda"] * 3 + ["mla"] + ["kda"] * 3 + ["mla"] + ["kda"] * 2
    # The same lists in a release that does not declare a base are read 0-based, the Python convention.
    raw = {**raw, "model_type": "other", "linear_attn_config": {**raw["linear_attn_config"], "kda_layers": [1, 2, 3]}}
    assert mixers(raw)[4] == "mla" and mixers(raw)[1:4] == ["kda"] * 3


def test_zero_based_index_lists_are_told_by_their_values():
    raw = {**BASE, "linear_attn_config": {"kda_layers": [0, 2], "full_attn_layers": [1, 3], "num_heads": 4,
                                          "head_dim": 32}}
    layout = layout_of(raw)
    assert [kind.mixer for kind in layout.layers] == ["kda", "attention", "kda", "attention"]
    assert set(layout.index_base.values()) == {0}


def test_layer_types_with_gated_delta_net_keys_are_qwen3_next_linear_layers():
    raw = {**BASE, "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
           "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
    assert mixers(raw) == ["gated_delta_net"] * 3 + ["attention"]
    # vLLM's gated_delta_net_state_shape: conv (kernel - 1) x (2 x 2 x 32 + 4 x 32) and state 4 x 32 x 32, bf16.
    assert kv_cache_model(raw).state_bytes_per_sequence() == 3 * (3 * 256 * 2 + 4 * 32 * 32 * 2)


def test_an_interval_key_places_full_attention_every_nth_layer():
    raw = {**BASE, "num_hidden_layers": 8, "full_attention_interval": 4, "linear_num_value_heads": 4}
    assert mixers(raw) == ["gated_delta_net"] * 3 + ["attention"] + ["gated_delta_net"] * 3 + ["attention"]
    gemma = {**BASE, "num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 3}
    assert [kind.window for kind in layout_of(gemma).layers] == ["sliding", "sliding", "full"] * 2


def test_per_layer_lists_give_each_layer_its_experts_top_k_shared_experts_and_widths():
    # Hunyuan's form: one value per layer; an expert count of 1 is a plain MLP, the shared MLP is
    # intermediate_size x num_shared_expert[layer] (vLLM hunyuan_v1.py).
    raw = {**BASE, "num_experts": [1, 8, 8, 16], "moe_topk": [1, 2, 2, 4], "num_shared_expert": [0, 1, 2, 1],
           "moe_intermediate_size": [512, 128, 128, 64], "use_mixed_mlp_moe": True}
    layout = layout_of(raw)
    assert [kind.ffn for kind in layout.layers] == ["dense", "moe", "moe", "moe"]
    assert [(mlp.experts, mlp.top_k, mlp.expert_width, mlp.shared_width) for mlp in layout.mlps] == [
        (0, 0, 0, 0), (8, 2, 128, 512), (8, 2, 128, 1024), (16, 4, 64, 512)]
    records, _ = estimate_records(ConfigView(raw), layout)
    shared = {record.layer: record.numel for record in records if record.name.endswith("shared_experts.up")}
    assert shared == {1: 512 * 256, 2: 1024 * 256, 3: 512 * 256}


def test_a_sparse_attention_layer_type_marks_those_layers_indexed():
    raw = {**BASE, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "index_n_heads": 4, "index_head_dim": 128,
           "index_topk": 64, "linear_attn_config": {"num_heads": 4, "head_dim": 32},
           "layer_types": ["linear_attention", "deepseek_sparse_attention"] * 2}
    layout = layout_of(raw)
    assert [kind.attention for kind in layout.layers] == ["linear_attention", "sparse mla"] * 2
    # DeepSeek-V3.2 declares its indexer once: every MLA layer is sparse, with vLLM's 132-byte indexer key.
    assert {kind.attention for kind in layout_of(config("deepseek-v3.2")).layers} == {"sparse mla"}
    assert {kind.attention for kind in layout_of(config("deepseek-v3")).layers} == {"mla"}
    v32 = kv_cache_model(config("deepseek-v3.2"))
    assert {layer.own_dtype_bytes_per_token for layer in v32.layers} == {128 + 4}


def test_keys_that_look_like_layer_patterns_but_cannot_be_read_are_named_in_the_report():
    raw = {**BASE, "architectures": ["NewForCausalLM"], "model_type": "brand_new", "foo_layers": [1, 3],
           "bar_interval": 3, "router_types": ["a", "b", "c", "d"]}
    notes = layout_of(raw).notes
    for key in ("foo_layers", "bar_interval", "router_types"):
        assert sum(key in note for note in notes) == 1, notes
    report = analyze(raw)
    assert any("foo_layers" in warning for warning in report["warnings"])
    assert any("bar_interval" in note for note in report["layers"]["notes"])


def test_an_index_list_that_fits_neither_base_is_named_and_not_used():
    # 0 and 4 of 4 layers: no numbering has both.
    raw = {**BASE, "linear_attn_config": {"kda_layers": [0, 4], "num_heads": 4, "head_dim": 32}}
    layout = layout_of(raw)
    assert mixers(raw) == ["attention"] * 4
    assert [note for note in layout.notes if "linear_attn_config.kda_layers" in note] == [
        "linear_attn_config.kda_layers lists layers [0, 4] that fit neither 0-based nor 1-based numbering of 4 "
        "layers; it is not used"]


def test_released_configs_read_without_notes_on_their_layer_keys():
    for name in ("kimi-linear-48b-a3b-instruct", "hunyuan-a13b-instruct", "jamba-v0.1", "minimax-m1",
                 "nemotron-h-56b-base-8k", "gpt-oss-20b", "deepseek-v3.2"):
        assert layout_of(config(name)).notes == (), name


# ---- the reducer's remapping ---------------------------------------------------------------------------------------


def test_index_lists_are_renumbered_in_their_own_base_when_layers_are_cut():
    reduced, notes = remap_layer_keys(KIMI_LINEAR, [0, 3])
    assert reduced["num_hidden_layers"] == 2
    assert reduced["linear_attn_config"]["full_attn_layers"] == [2]
    assert reduced["linear_attn_config"]["kda_layers"] == [1]
    assert [kind.mixer for kind in layout_of(reduced).layers] == ["kda", "mla"] and notes == []
    hunyuan, _ = remap_layer_keys(config("hunyuan-a13b-instruct"), [0, 5, 31])
    assert hunyuan["num_hidden_layers"] == 3 and hunyuan["moe_topk"] == [8, 8, 8]
    assert hunyuan["num_shared_expert"] == [1, 1, 1]
    assert KIMI_LINEAR["linear_attn_config"]["full_attn_layers"][-1] == 27  # the original is untouched


def test_one_layer_of_every_kind_is_what_a_reduced_copy_keeps():
    # Kimi-Linear: KDA + dense (layer 0), KDA + MoE (1), MLA + MoE (3); cut to those, it reads as the same kinds.
    layout = layout_of(KIMI_LINEAR)
    assert one_layer_per_kind(layout) == [0, 1, 3]
    reduced, _ = remap_layer_keys(KIMI_LINEAR, one_layer_per_kind(layout))
    assert set(layout_of(reduced).layers) == set(layout.layers)
    # Hunyuan with a layer whose per-layer lists differ keeps that layer too.
    raw = {**BASE, "num_experts": [8, 8, 8, 8], "moe_topk": [2, 2, 4, 2], "num_shared_expert": [1, 1, 1, 1]}
    assert one_layer_per_kind(layout_of(raw)) == [0, 2]


def test_pattern_keys_are_found_at_any_depth_with_their_form():
    keys = {key.path: (key.form, key.base) for key in find_pattern_keys(ConfigView(KIMI_LINEAR))}
    assert keys["linear_attn_config.full_attn_layers"] == ("index_list", 1)
    assert keys["linear_attn_config.kda_layers"] == ("index_list", 1)
    assert keys["moe_layer_freq"] == ("period", None)


# ---- analysis: counts, KV bytes and recurrent state ----------------------------------------------------------------


def within(ours: float, published: float, tolerance: float = 0.03) -> bool:
    return abs(ours / published - 1) <= tolerance


def test_hunyuan_a13b_counts_its_per_layer_shared_expert():
    report = analyze(config("hunyuan-a13b-instruct"))
    # Published: 80B total, 13B active (Tencent-Hunyuan/Hunyuan-A13B README). Without the shared MLP the active
    # count was 11.5B, 11% low.
    assert within(report["total_params"], 80e9) and within(report["active_params"], 13e9)
    assert report["components"]["shared_experts"] == 32 * 3 * 4096 * 3072


def test_cross_layer_attention_caches_one_layer_in_each_share_group():
    hunyuan = config("hunyuan-a13b-instruct")  # use_cla false: 32 layers x 8 KV heads x 2 x 128 x 2 bytes
    assert kv_cache_model(hunyuan).bytes_per_token("bf16") == 32 * 8 * 2 * 128 * 2
    shared = {**hunyuan, "use_cla": True, "cla_share_factor": 2}
    assert kv_cache_model(shared).bytes_per_token("bf16") == 16 * 8 * 2 * 128 * 2


def test_kimi_linear_counts_kv_bytes_and_state_from_its_own_layers():
    report = analyze(KIMI_LINEAR)
    assert within(report["total_params"], 48e9)
    # "A3B" is a rounded name: 3.1B with the output head and without the input embedding (OpenAI's convention),
    # 3.5B with both; the count is exact (transformers' KimiLinear built on the meta device).
    assert round(report["active_params_by_convention"]["excluding_input_embedding"] / 1e9) == 3
    # 7 MLA layers x (512 + 64) x 2 bytes, not 27 x 576 x 2 = 31,104.
    assert report["kv_cache_bytes_per_token"]["bf16"] == 7 * (512 + 64) * 2 == 8064
    # 20 KDA layers: q, k, v convolution inputs (3 x 4096 x 3, bf16) and a 32 x 128 x 128 float32 state.
    per_layer = 3 * 4096 * 3 * 2 + 32 * 128 * 128 * 4
    assert report["recurrent_state_bytes_per_sequence"] == 20 * per_layer
    assert report["kv_cache"]["recurrent_state"]["kda_recurrent"]["dtype"] == "fp32"
    assert report["mechanisms"]["attention"]["attention_kinds"] == {"kda": 20, "mla": 7}
    assert not any("misreads" in warning for warning in report["warnings"])


def test_plans_hold_each_sequences_recurrent_state_beside_its_kv_cache():
    kv = kv_cache_model(KIMI_LINEAR)
    assert kv.bytes_per_sequence(1000, "bf16") == 8064 * 1000 + kv.state_bytes_per_sequence()
    report = analyze(KIMI_LINEAR, devices={"devices_per_node": 1, "nodes": 1, "device_memory_bytes": 141 * 2**30},
                     workload={"concurrency": 64, "context_tokens": 4096})
    layers = report["planner"]["kv_layers"]
    assert sum(layer["state_bytes"] for layer in layers) == kv.state_bytes_per_sequence()


# ---- acceptance 2: the same figures as vLLM's KV-cache specs -------------------------------------------------------

def hybrid_configs() -> list[str]:
    """Every catalog config with a layer that is not softmax attention (jamba, minimax-m1, nemotron-h,
    kimi-linear ...), as d0 reads it; the four known hybrids must be among them."""
    names = sorted(path.stem for path in CONFIGS.glob("*.json")
                   if any(kind.mixer in RECURRENT_MIXERS for kind in layout_of(json.loads(path.read_text())).layers))
    assert {"jamba-v0.1", "minimax-m1", "nemotron-h-56b-base-8k", "kimi-linear-48b-a3b-instruct"} <= set(names)
    return names


QWEN3_NEXT_SHAPED = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
                     "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                     "vocab_size": 151936, "intermediate_size": 5120, "full_attention_interval": 4,
                     "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                     "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
                     "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                     "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16"}


HYBRIDS = [*hybrid_configs(), "qwen3-next-shaped"]


def hybrid_config(name: str, folder: Path) -> tuple[Path, dict]:
    if name == "qwen3-next-shaped":  # no Qwen3-Next release in the catalog: its Gated DeltaNet checked on its shape
        path = folder / "qwen3-next-shaped.json"
        path.write_text(json.dumps(QWEN3_NEXT_SHAPED))
        return path, QWEN3_NEXT_SHAPED
    return CONFIGS / f"{name}.json", config(name)


@pytest.fixture(scope="module")
def vllms_figures(vllm_python, tmp_path_factory) -> dict:
    """vLLM's figures for every hybrid, from one run of the probe in the vLLM environment (its import is most of
    the time)."""
    folder = tmp_path_factory.mktemp("hybrids")
    paths = {name: hybrid_config(name, folder)[0] for name in HYBRIDS}
    done = subprocess.run([vllm_python, str(PROBE), *map(str, paths.values())], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: figures[str(path)] for name, path in paths.items()}


@pytest.mark.parametrize("name", HYBRIDS)
def test_kv_bytes_and_recurrent_state_equal_vllms_cache_specs(name, vllms_figures, tmp_path):
    raw = hybrid_config(name, tmp_path)[1]
    theirs = vllms_figures[name]
    kv = kv_cache_model(raw)
    layout = layout_of(raw)
    ours_attention = layout.indices(lambda kind: kind.mixer in SOFTMAX_MIXERS)
    ours_recurrent = layout.indices(lambda kind: kind.mixer in RECURRENT_MIXERS)
    assert (ours_attention, ours_recurrent) == (theirs["attention_layers"], theirs["recurrent_layers"])
    assert kv.bytes_per_token("bf16") == theirs["kv_bytes_per_token"], theirs["how"]
    assert kv.state_bytes_per_sequence() == theirs["state_bytes_per_sequence"], theirs["how"]
