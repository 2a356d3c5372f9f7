"""Model intake's engine: analysing released config.json files offline, without Django.

External truth is the vendors' published parameter counts in adaptation/intake/catalog/configs/MANIFEST.md;
internal truth is transformers' own model built on the meta device.
"""

import functools
import json
import subprocess
import sys
import time

import pytest

from workers.engine.analysis import ConfigError, analyze, kv_tokens_that_fit, load_config_file

from .conftest import CONFIGS, ROOT

H200 = {"devices_per_node": 8, "device_memory_bytes": 141 * 10**9, "device_name": "NVIDIA H200"}


def config(name: str) -> dict:
    return load_config_file(CONFIGS / f"{name}.json")


@functools.lru_cache(maxsize=None)
def analysis(name: str) -> dict:
    return analyze(config(name))


def full_meta_model_count(raw: dict) -> int:
    """The reference: transformers' whole model on the meta device, counted the plain way."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {key: value for key, value in raw.items() if key not in ("model_type", "auto_map", "quantization_config")}
    hf_config = AutoConfig.for_model(raw["model_type"], **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(parameter.numel() for parameter in model.parameters())


def within(ours: int, published: float, tolerance: float = 0.03) -> bool:
    return abs(ours / published - 1) <= tolerance


# (config, published total, published active, the active convention the vendor uses). Totals compare our main
# model count (MTP modules excluded, tied embeddings once): DeepSeek's 671B excludes its MTP module and so does
# ours. Conventions of "active": DeepSeek counts the embedding and output head (README_WEIGHTS.md: 36.7B incl. 0.9B
# + 0.9B), OpenAI leaves out the input embedding (gpt-oss-120b: 5.13B without it, 5.71B with it), MiniMax leaves
# out both (M1: 45.9B published, 45.95B without embeddings, 48.4B with them).
PUBLISHED = [
    ("deepseek-v3", 671e9, 37e9, "all_used_weights"),
    ("kimi-k2-instruct", 1e12, 32e9, "all_used_weights"),
    ("qwen3-235b-a22b", 235e9, 22e9, "all_used_weights"),
    ("qwen3-coder-480b-a35b-instruct", 480e9, 35e9, "all_used_weights"),
    ("qwen3-0.6b", 0.6e9, None, None),
    ("llama-3.1-405b", 405e9, None, None),
    ("llama-3.1-8b", 8e9, None, None),
    ("llama-3.2-1b", 1.23e9, None, None),
    # These partial configs hold the text model only, while 400B / 109B include the vision encoder (about 0.8B
    # by transformers' default Llama4VisionConfig); the text count is compared, and is still within 3%.
    ("llama-4-maverick-17b-128e-instruct.partial", 400e9, 17e9, "all_used_weights"),
    ("llama-4-scout-17b-16e-instruct.partial", 109e9, 17e9, "all_used_weights"),
    ("gpt-oss-120b", 117e9, 5.1e9, "excluding_input_embedding"),
    ("gpt-oss-20b", 21e9, 3.6e9, "excluding_input_embedding"),
    ("mixtral-8x22b-v0.1", 141e9, 39e9, "all_used_weights"),
    ("mixtral-8x7b-v0.1", 46.7e9, 12.9e9, "all_used_weights"),
    ("minimax-m1", 456e9, 45.9e9, "excluding_embeddings_and_lm_head"),
    ("grok-1", 314e9, None, None),
    # Arctic's "17B active" is "10B dense + 2 x 3.66B": its attention, residual MLP and embeddings come to 8.2B
    # from this config, so the active figure (15.6B) cannot be matched; the total (476.9B vs 480B) is compared.
    ("snowflake-arctic-instruct", 480e9, None, None),
    ("dbrx", 132e9, 36e9, "all_used_weights"),
    ("nemotron-4-340b-base", 340e9, None, None),
    ("jamba-v0.1", 52e9, 12e9, "all_used_weights"),
]
# No vendor figure to compare (MANIFEST "unverified"): deepseek-v3.2, minimax-m2.7, glm-4.7, nemotron-h-56b.


@pytest.mark.parametrize(("name", "total", "active", "convention"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_counts_match_the_published_figures_within_three_percent(name, total, active, convention):
    result = analysis(name)
    assert within(result["total_params"], total), result["total_params"]
    if active is not None:
        assert within(result["active_params_by_convention"][convention], active)


def test_qwen3_figures_that_are_names_or_non_embedding_counts_are_matched_as_such():
    # "A3B" is a rounded name, not a count: 3.35B active rounds to it (the 3B is 12% away from the count).
    assert round(analysis("qwen3-30b-a3b")["active_params"] / 1e9) == 3
    assert within(analysis("qwen3-30b-a3b")["total_params"], 30e9)
    # Qwen3-0.6B: "0.44B non-embedding"; its embedding is tied, so it is one matrix.
    small = analysis("qwen3-0.6b")
    assert within(small["non_embedding_params"], 0.44e9) and small["components"]["lm_head"] == 0


def test_deepseek_v3_with_its_mtp_module_is_the_685b_on_hugging_face():
    result = analysis("deepseek-v3")
    # README: "685B = 671B main model + 14B MTP"; the checkpoint stores the MTP module's own 11.6B (README_WEIGHTS:
    # 11.5B unique) plus copies of the embedding and output head.
    assert within(result["mtp"]["params"], 11.5e9)
    assert within(result["total_params"] + result["mtp"]["params_as_stored"], 685e9, 0.005)
    assert result["mtp"]["counted_in_total"] is False


SMALL_DEEPSEEK = {**config("deepseek-v3"), "num_hidden_layers": 5, "first_k_dense_replace": 2}


@pytest.mark.parametrize("raw", [
    config("qwen3-0.6b"), config("llama-3.2-1b"), config("llama-3.1-8b"), config("mixtral-8x7b-v0.1"),
    config("qwen3-30b-a3b"), config("gpt-oss-20b"), config("jamba-v0.1"), config("nemotron-h-56b-base-8k"),
    SMALL_DEEPSEEK,
], ids=["qwen3-0.6b", "llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "jamba",
        "nemotron-h", "deepseek-v3-5-layers"])
def test_exact_counts_equal_transformers_full_meta_model(raw):
    result = analyze(raw)
    assert result["method"] == "exact"
    assert result["total_params"] == full_meta_model_count(raw)
    assert sum(result["components"].values()) - result["components"]["mtp"] == result["total_params"]
    assert result["components"]["other"] == 0


def test_the_mtp_count_equals_transformers_own_mtp_module():
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config
    from transformers.modeling_layers import MtpModel

    raw = SMALL_DEEPSEEK
    hf_config = DeepseekV3Config(**{key: value for key, value in raw.items()
                                    if key not in ("model_type", "auto_map", "quantization_config")})
    with torch.device("meta"):
        main = AutoModelForCausalLM.from_config(hf_config)
        mtp = MtpModel(main, 1)
    shared = {id(parameter) for parameter in main.parameters()}
    own = sum(parameter.numel() for parameter in mtp.parameters() if id(parameter) not in shared)
    assert analyze(raw)["mtp"]["params"] == own


def test_transformers_default_deepseek_v3_config_gives_671_0_billion():
    from transformers import DeepseekV3Config

    assert round(analyze(DeepseekV3Config().to_dict())["total_params"] / 1e9, 1) == 671.0


def test_a_kimi_k2_config_is_analysed_as_deepseek_v3_and_says_why():
    result = analysis("kimi-k2-instruct")
    assert result["model_type"] == "kimi_k2"
    assert result["resolved_architecture"] == "deepseek_v3" and result["method"] == "exact"
    assert result["resolution"] == ("treated as deepseek_v3 because architectures names DeepseekV3ForCausalLM and "
                                    "the keys match its config")
    assert result["mtp"]["layers"] == 0
    assert result["mechanisms"]["moe"]["experts"] == 384
    assert result["mechanisms"]["rope"]["scaling"]["beta_fast"] == result["mechanisms"]["rope"]["scaling"][
        "beta_slow"] == 1.0


def test_no_code_named_by_auto_map_is_fetched_or_run(monkeypatch):
    import transformers
    import transformers.dynamic_module_utils as dynamic

    def refuse(*args, **kwargs):
        raise AssertionError("remote code was requested")

    monkeypatch.setattr(dynamic, "get_class_from_dynamic_module", refuse)
    monkeypatch.setattr(dynamic, "get_cached_module_file", refuse)
    builds = []
    original = transformers.AutoModelForCausalLM.from_config

    def spy(hf_config, **kwargs):
        builds.append(kwargs)
        return original(hf_config, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", spy)
    # An auto_map whose module would fail (or worse) on import.
    trap = {"AutoConfig": "d0_booby_trap.Config", "AutoModelForCausalLM": "d0_booby_trap.Model"}
    result = analyze({**SMALL_DEEPSEEK, "model_type": "kimi_k2", "auto_map": trap})
    assert result["resolved_architecture"] == "deepseek_v3"
    assert builds and all("trust_remote_code" not in kwargs for kwargs in builds)
    assert "d0_booby_trap" not in sys.modules


def test_a_config_without_model_type_is_resolved_by_its_architectures_class_name():
    raw = {key: value for key, value in config("llama-3.1-8b").items() if key != "model_type"}
    result = analyze(raw)
    # LlamaForCausalLM is also registered for exaone, internlm3 ...; llama is the model type it belongs to.
    assert result["resolved_architecture"] == "llama"
    assert result["total_params"] == analysis("llama-3.1-8b")["total_params"]


def test_an_architecture_that_would_ignore_a_shape_changing_key_is_not_used():
    raw = {key: value for key, value in config("llama-3.1-8b").items() if key != "model_type"}
    result = analyze({**raw, "num_local_experts": 8, "num_experts_per_tok": 2})
    assert result["method"] == "estimate" and "llama would ignore num_local_experts=8" in result["resolution"]
    assert result["components"]["routed_experts"] > 0


def test_a_config_transformers_cannot_build_falls_back_to_the_estimate_and_says_why():
    result = analyze({**config("llama-3.1-8b"), "hidden_act": "no_such_activation"})
    assert result["method"] == "estimate" and "transformers could not build it (KeyError" in result["resolution"]
    assert within(result["total_params"], analysis("llama-3.1-8b")["total_params"])


EXACT = ["dbrx", "deepseek-v3", "deepseek-v3.2", "glm-4.7", "gpt-oss-120b", "gpt-oss-20b", "jamba-v0.1",
         "kimi-k2-instruct", "llama-3.1-405b", "llama-3.1-8b", "llama-3.2-1b",
         "llama-4-maverick-17b-128e-instruct.partial", "llama-4-scout-17b-16e-instruct.partial", "minimax-m2.7",
         "mixtral-8x22b-v0.1", "mixtral-8x7b-v0.1", "nemotron-4-340b-base", "nemotron-h-56b-base-8k", "qwen3-0.6b",
         "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-coder-480b-a35b-instruct"]


@pytest.mark.parametrize("name", EXACT)
def test_the_generic_estimate_lands_within_three_percent_of_the_exact_count(name):
    exact = analysis(name)
    assert exact["method"] == "exact"
    unknown = {**config(name), "model_type": "acme_unknown", "architectures": ["AcmeForCausalLM"]}
    estimate = analyze(unknown)
    assert estimate["method"] == "estimate" and estimate["resolved_architecture"] is None
    assert within(estimate["total_params"], exact["total_params"])
    assert within(estimate["active_params"], exact["active_params"])
    assert estimate["kv_cache_bytes_per_token"] == exact["kv_cache_bytes_per_token"]


@pytest.mark.parametrize(("name", "unread"), [
    ("grok-1", "attn_output_multiplier"), ("minimax-m1", "layernorm_mlp_alpha"),
    ("snowflake-arctic-instruct", "parallel_attn_mlp_res"), ("vendor-format/deepseek-v3.1", "scale_fmt")])
def test_configs_no_architecture_fits_are_estimated_and_say_what_was_not_understood(name, unread):
    result = analysis(name)
    assert result["method"] == "estimate" and result["resolved_architecture"] is None
    assert "generic decoder/MoE estimate" in result["resolution"]
    assert unread in result["uninterpreted_keys"]


def test_deepseeks_own_inference_config_is_estimated_like_the_hf_one():
    # inference/configs/config_671B.json spells everything differently (dim, n_layers, n_activated_experts...).
    assert analysis("vendor-format/deepseek-v3")["total_params"] == analysis("deepseek-v3")["total_params"]


def test_kv_cache_bytes_per_token_by_attention_kind():
    # MHA, Llama-2-7B's shape: 32 layers x K and V x 32 KV heads x 128 dims x 2 bytes (bf16) = 524,288.
    llama2 = {**config("llama-3.1-8b"), "num_key_value_heads": 32, "rope_scaling": None}
    assert analyze(llama2)["kv_cache_bytes_per_token"]["bf16"] == 32 * 2 * 32 * 128 * 2 == 524_288
    # GQA, Llama-3.1-8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131,072; fp8 halves it.
    assert analysis("llama-3.1-8b")["kv_cache_bytes_per_token"] == {"bf16": 131_072, "fp16": 131_072, "fp8": 65_536}
    # MLA, DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 70,272.
    assert analysis("deepseek-v3")["kv_cache_bytes_per_token"]["bf16"] == 61 * (512 + 64) * 2 == 70_272
    # Sliding window, gpt-oss-120b: 18 full + 18 sliding layers, each 2 x 8 KV heads x 64 x 2 bytes = 2,048 per
    # token; the sliding ones stop at 128 tokens: 18 x 2,048 x 128 = 4,718,592 bytes per sequence.
    kv = analysis("gpt-oss-120b")["kv_cache"]
    assert kv["bytes_per_token"]["bf16"] == {"all_caching_layers": 73_728, "full_layers": 36_864,
                                             "windowed_layers": 36_864}
    assert kv["windowed_layers"] == [{"window_tokens": 128, "layers": 18, "elements_per_token": 18 * 2 * 8 * 64,
                                      "cap_bytes_per_sequence": {"bf16": 4_718_592, "fp16": 4_718_592,
                                                                 "fp8": 2_359_296}}]


def test_mamba_layers_keep_a_fixed_state_per_sequence():
    # Jamba-v0.1: 4 attention layers (32 / period 8) cache 2 x 8 x 128 x 2 bytes per token = 16,384 in all; its 28
    # Mamba layers keep d_inner (2 x 4096) x (d_state 16 + d_conv 4 - 1) bf16 values: 28 x 8192 x 19 x 2 bytes.
    kv = analysis("jamba-v0.1")["kv_cache"]
    assert kv["bytes_per_token"]["bf16"]["all_caching_layers"] == 4 * 2 * 8 * 128 * 2
    assert kv["state_bytes_per_sequence"] == 28 * 8192 * 19 * 2


def test_kv_tokens_that_fit_a_memory_budget():
    # 1 GiB / 131,072 bytes per token (Llama-3.1-8B, bf16) = 8,192 tokens; fp8 doubles it.
    assert kv_tokens_that_fit(config("llama-3.1-8b"), 2**30, "bf16") == 8192
    assert kv_tokens_that_fit(config("llama-3.1-8b"), 2**30, "fp8") == 16384
    # gpt-oss-120b, 8,192-token sequences: 36,864 x 8,192 + 4,718,592 = 306,708,480 bytes each; 3 fit in 1 GiB.
    assert kv_tokens_that_fit(config("gpt-oss-120b"), 2**30, "bf16", sequence_length=8192) == 3 * 8192


def test_weights_memory_per_precision_keeps_embeddings_norms_and_routers_in_bf16():
    result = analysis("llama-3.1-8b")
    components, weights = result["components"], result["weights_bytes"]
    assert weights["bf16"] == weights["fp16"] == 2 * result["total_params"]
    high = components["embeddings"] + components["lm_head"] + components["norms"]
    quantized = result["total_params"] - high
    assert result["weights_memory"]["quantized_params"] == quantized
    # int4 as AWQ/GPTQ: half a byte per weight, and per group of 128 weights an fp16 scale and a 4-bit zero
    # (2.5 bytes); every Llama-3.1-8B input width is a multiple of 128.
    assert weights["int4"] == quantized // 2 + quantized // 128 * 5 // 2 + 2 * high
    assert weights["int8"] == quantized + quantized // 128 * 3 + 2 * high
    # fp8 with one fp32 scale per 128 x 128 block.
    assert weights["fp8"] == quantized + quantized // (128 * 128) * 4 + 2 * high
    assert "router" in result["weights_memory"]["kept_in_high_precision"]


def test_mechanisms_are_read_from_the_config():
    deepseek = analysis("deepseek-v3")["mechanisms"]
    assert deepseek["attention"]["kind"] == "mla"
    assert deepseek["rope"]["type"] == "yarn" and "legacy" in deepseek["rope"]["notes"][0]
    assert deepseek["moe"]["group_limited_routing"] == {"n_group": 8, "topk_group": 4}
    assert (deepseek["moe"]["scoring_func"], deepseek["moe"]["routed_scaling_factor"]) == ("sigmoid", 2.5)
    assert (deepseek["moe"]["shared_experts"], deepseek["moe"]["dense_layers"]) == (1, 3)
    assert deepseek["mtp_layers"] == 1 and deepseek["quantization_config"]["method"] == "fp8"
    gpt_oss = analysis("gpt-oss-120b")["mechanisms"]
    assert gpt_oss["attention"]["pattern"] == "interleaved sliding/full" and gpt_oss["attention"]["kind"] == "gqa"
    assert gpt_oss["rope"]["type"] == "yarn" and gpt_oss["rope"]["notes"] == []
    assert "lm_head" in gpt_oss["quantization_config"]["modules_to_not_convert"]
    assert analysis("llama-3.1-8b")["mechanisms"]["rope"]["type"] == "llama3"
    qwen = analysis("qwen3-0.6b")["mechanisms"]
    assert qwen["rope"]["type"] == "default" and qwen["tied_embeddings"] is True and qwen["norm"]["qk_norm"]
    assert analysis("minimax-m1")["mechanisms"]["attention"]["pattern"] == "hybrid linear/softmax attention"
    assert analysis("nemotron-h-56b-base-8k")["mechanisms"]["activation"] == {"name": "relu2", "gated": False,
                                                                            "swiglu_limit": None}
    scout = analysis("llama-4-scout-17b-16e-instruct.partial")
    assert scout["mechanisms"]["attention"]["pattern"] == "interleaved chunked/full"
    assert scout["scope"].startswith("language model only")


@pytest.mark.parametrize(("rope_scaling", "kind", "legacy"), [
    ({"type": "linear", "factor": 4.0}, "linear", True),
    ({"rope_type": "dynamic", "factor": 2.0}, "dynamic", False),
    ({"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [4.0] * 64,
      "original_max_position_embeddings": 4096}, "longrope", False),
    # Qwen2-VL's legacy form: the type says "mrope" (or "default") and mrope_section marks it.
    ({"type": "mrope", "mrope_section": [16, 24, 24]}, "mrope", True),
])
def test_rope_variants_and_legacy_type_keys_are_reported(rope_scaling, kind, legacy):
    unknown = {**config("llama-3.1-8b"), "model_type": "acme", "architectures": [], "rope_scaling": rope_scaling}
    rope = analyze(unknown)["mechanisms"]["rope"]
    assert rope["type"] == kind and bool(rope["notes"]) == legacy
    if kind == "longrope":
        assert rope["scaling"]["long_factor"] == "list of 64"


@pytest.mark.parametrize(("raw", "reason"), [
    ({"model_type": "llama", "num_hidden_layers": 32, "vocab_size": 32000}, "no hidden size"),
    ([1, 2, 3], "JSON object"),
    ("config.json", "JSON object"),
    ({**config("llama-3.1-8b"), "num_hidden_layers": 10**9}, "num_hidden_layers = 1000000000"),
    ({**config("llama-3.1-8b"), "vocab_size": 10**12}, "vocab_size"),
    ({**config("llama-3.1-8b"), "hidden_size": -4096}, "hidden_size = -4096"),
    ({**config("llama-3.1-8b"), "num_hidden_layers": True}, "must be an integer"),
    ({**config("llama-3.1-8b"), "num_key_value_heads": 7}, "key/value heads"),
    ({**config("gpt-oss-20b"), "layer_types": ["full_attention"] * 3}, "one entry per layer"),
    ({**config("deepseek-v3"), "num_experts_per_tok": 300}, "experts per token"),
    ({**config("deepseek-v3"), "num_hidden_layers": 512, "n_routed_experts": 2048}, "expert MLPs; d0 analyses up to"),
    ({**config("mixtral-8x7b-v0.1"), "hidden_size": 2**17, "intermediate_size": 2**21, "num_hidden_layers": 512},
     "parameters"),
], ids=["missing-hidden-size", "list", "string", "billion-layers", "trillion-vocab", "negative", "bool",
        "heads-not-shared-evenly", "short-layer-types", "top-k-above-experts", "a-million-expert-mlps",
        "quadrillion-parameters"])
def test_bad_configs_are_refused_quickly_with_the_reason(raw, reason):
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=reason):
        analyze(raw)
    assert time.perf_counter() - started < 1


def test_the_planner_needs_two_h200_nodes_for_deepseek_v3_in_bf16_and_one_in_fp8():
    bf16 = analyze(config("deepseek-v3"), devices={**H200, "nodes": 1}, precision="bf16")["plans"]
    assert not bf16["fits"] and not bf16["one_node"]["fits"] and "GiB per device" in bf16["one_node"]["reason"]
    # Uneven pipeline stages (vLLM's split) fit it on fewer than 16 devices, still over two nodes.
    assert bf16["nodes_needed"] == 2 and 8 < bf16["minimum_devices"] <= 16
    two_nodes = analyze(config("deepseek-v3"), devices={**H200, "nodes": 2}, precision="bf16")["plans"]
    assert two_nodes["fits"] and not two_nodes["one_node"]["fits"]
    assert two_nodes["minimum_devices"] == bf16["minimum_devices"]
    assert all(layout["nodes"] == 2 for layout in two_nodes["smallest_layouts"])
    fp8 = analyze(config("deepseek-v3"), devices={**H200, "nodes": 1}, precision="fp8")["plans"]
    assert fp8["fits"] and fp8["one_node"]["fits"] and fp8["minimum_devices"] <= 8 and fp8["nodes_needed"] == 1
    for layout in fp8["layouts"] + two_nodes["layouts"]:
        memory = layout["per_device_bytes"]
        assert memory["total"] == pytest.approx(memory["weights"] + memory["kv_cache"] + memory["activations"]
                                                + memory["runtime_overhead"], abs=4)
        assert memory["total"] <= memory["usable"] == int(141 * 10**9 * 0.9)
        # 128 heads by TP, 256 experts by EP, all 61 layers over the stages, TP inside a node.
        assert 128 % layout["tp"] == 0 and 256 % layout["ep"] == 0 and sum(layout["stage_layers"]) == 61
        assert layout["tp"] <= 8
    ranked = [layout["decode_tokens_per_s"] for layout in fp8["layouts"]]
    assert ranked == sorted(ranked, reverse=True)
    assert fp8["memory_bandwidth"]["bytes_per_s"] == 4.8e12 and "H200" in fp8["memory_bandwidth"]["source"]
    assert {"usable_memory_fraction", "runtime_overhead_bytes_per_device", "activations", "kv_cache",
            "decode_roofline"} <= set(fp8["assumptions"])


def test_the_planner_says_when_kv_heads_are_replicated():
    plans = analyze(config("qwen3-235b-a22b"), devices={**H200, "nodes": 1})["plans"]
    tp8 = next(layout for layout in plans["layouts"] if layout["tp"] == 8)
    assert "TP 8 > 4 KV heads: each KV head is replicated on 2 ranks" in tp8["notes"]


def test_a_probe_style_device_list_is_one_node():
    gpus = [{"index": 0, "kind": "cpu", "name": "cpu", "memory_bytes": 10**12}] + [
        {"index": index, "kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85 * 10**9}
        for index in range(8)]
    plans = analyze(config("llama-3.1-8b"), devices=gpus)["plans"]
    assert plans["cluster"]["devices_per_node"] == 8 and plans["minimum_devices"] == 1
    assert plans["memory_bandwidth"]["bytes_per_s"] == 3.35e12


def test_the_report_is_plain_json():
    for name in ("deepseek-v3", "nemotron-h-56b-base-8k", "grok-1"):
        report = analysis(name)
        assert json.loads(json.dumps(report, allow_nan=False)) == report


# Runs code as on a bare GPU node: Django and the web app cannot be imported at all.
WITHOUT_DJANGO = "import sys; [sys.modules.__setitem__(name, None) for name in ('django', 'adaptation', 'd0web')];"


@pytest.mark.slow
def test_the_analyze_command_prints_json_on_a_node_without_django():
    arguments = ["analyze", str(CONFIGS / "kimi-k2-instruct.json"), "--json", "--devices", "8",
                 "--device-memory-gib", "131", "--nodes", "2", "--precision", "fp8"]
    code = WITHOUT_DJANGO + (
        "import argparse, json; from workers.engine.analysis import cli; "
        "parser = argparse.ArgumentParser(); cli.add_parser(parser.add_subparsers(dest='verb')); "
        f"print(json.dumps(cli.run(parser.parse_args({arguments!r}))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"model_type", "resolved_architecture", "total_params", "active_params", "components", "weights_bytes",
            "kv_cache_bytes_per_token", "mechanisms", "plans"} <= set(report)
    assert set(report["weights_bytes"]) >= {"bf16", "fp8", "int8", "int4"}
    assert set(report["kv_cache_bytes_per_token"]) >= {"bf16", "fp8"}
    assert report["plans"]["fits"] and report["plans"]["precision"] == "fp8"


def _top_k_of(block) -> int | None:
    """The experts-per-token an MoE block routes with, from the block or its router (not from the config)."""
    for module in (block, *block.children()):
        for name in ("top_k", "num_experts_per_tok", "moe_topk"):
            value = getattr(module, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def used_by_one_token(model) -> int:
    """Parameters one token uses in a built model: all of them, but of each MoE block's routed experts only the
    top-k of E, with k and E read from the block's own modules."""
    import torch

    unused = 0
    for _, block in model.named_modules():
        experts = getattr(block, "experts", None)
        if not isinstance(experts, torch.nn.Module):
            continue
        count = getattr(experts, "num_experts", None) or (
            len(experts) if isinstance(experts, torch.nn.ModuleList) else next(experts.parameters()).shape[0])
        routed = sum(parameter.numel() for parameter in experts.parameters())
        unused += routed - routed * _top_k_of(block) // count
    return sum(parameter.numel() for parameter in model.parameters()) - unused


TOP_K_SPELLINGS = {"num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token", "experts_per_token",
                   "moe_top_k", "n_activated_experts"}
# MoE classes whose defaults do not make the comparison, and why. Every other MoE class of the pinned transformers
# (49 of them, ERNIE 4.5's moe_k, Aria's moe_topk and Nemotron-H's pattern-only layer count included) is compared.
MOE_EXCEPTIONS = {
    "deepseek_v2": "its defaults give no top-k (num_experts_per_tok None): refused, never counted",
    "doge": "its defaults describe a dense model (is_moe False) with 16384 declared experts, past d0's bound",
    "glm4_moe": "its defaults give no head_dim and 4096 is not divisible by 96 heads: refused",
    "longcat_flash": "zero-computation experts: a token's top-k includes identity experts, so k/E is not its share",
}


def moe_model_types() -> list[str]:
    """Every config class of the pinned transformers with a top-k key, whose defaults transformers itself builds."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    found = []
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            hf_config = CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001 - a class that cannot make its own defaults has nothing to compare
            continue
        if not TOP_K_SPELLINGS & set(hf_config.to_dict()) or model_type in MOE_EXCEPTIONS:
            continue
        try:
            with torch.device("meta"):
                AutoModelForCausalLM.from_config(hf_config)
        except Exception:  # noqa: BLE001 - transformers' own defaults that transformers cannot build
            continue
        found.append(model_type)
    return found


@pytest.mark.parametrize("model_type", moe_model_types())
def test_the_active_count_is_what_one_token_uses_in_the_built_model(model_type):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    hf_config = CONFIG_MAPPING[model_type]()
    report = analyze({**hf_config.to_dict(), "model_type": model_type})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    assert report["method"] == "exact"
    assert report["active_params"] == used_by_one_token(model)
    assert report["active_params"] < report["total_params"]


def test_the_moe_classes_compared_are_most_of_the_pinned_transformers():
    assert len(moe_model_types()) >= 45


def test_an_moe_config_without_a_readable_top_k_is_refused_not_counted():
    with pytest.raises(ConfigError, match="routed experts .* but the config gives no experts-per-token"):
        analyze({**config("deepseek-v3"), "num_experts_per_tok": None})


def test_an_exact_count_far_from_the_estimate_says_so():
    """JetMoE routes its attention through experts too (mixture of attention heads), which d0's estimate from the
    config keys does not model: the exact count and the estimate differ, and the report warns instead of staying
    silent."""
    from transformers import JetMoeConfig

    report = analyze({**JetMoeConfig().to_dict(), "model_type": "jetmoe"})
    assert any("d0's estimate from the config keys" in warning and "differ by" in warning
               for warning in report["warnings"])
    assert not any("estimate from the config keys" in warning
                   for warning in analyze(config("deepseek-v3"))["warnings"])


def test_per_layer_expert_counts_widths_and_top_k_are_analysed_layer_by_layer():
    """Hunyuan gives top-k per layer (transformers builds it); a release may list expert counts and widths per
    layer too, which the estimate reads layer by layer. Both were refused with "must be an integer"."""
    import torch
    from transformers import AutoModelForCausalLM, HunYuanMoEV1Config

    hunyuan = HunYuanMoEV1Config(num_hidden_layers=4, num_experts=16, moe_topk=[2, 1, 4, 1], hidden_size=512,
                                 intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                 vocab_size=1000)
    report = analyze({**hunyuan.to_dict(), "model_type": "hunyuan_v1_moe"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hunyuan)
    assert report["method"] == "exact" and report["active_params"] == used_by_one_token(model)

    listed = {"architectures": ["SomeNewMoeForCausalLM"], "model_type": "some_new_moe", "hidden_size": 1024,
              "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
              "intermediate_size": 2048, "num_experts": [8, 16, 32], "moe_intermediate_size": [256, 512, 256],
              "num_experts_per_tok": [2, 2, 4]}
    estimate = analyze(listed)
    assert estimate["method"] == "estimate"
    # Routed experts per layer: E x 3 matrices of hidden x width; a token uses top-k of them.
    routed = [experts * 3 * 1024 * width for experts, width in ((8, 256), (16, 512), (32, 256))]
    used = [layer * k // experts for layer, k, experts in zip(routed, (2, 2, 4), (8, 16, 32), strict=True)]
    assert estimate["total_params"] - estimate["active_params"] == sum(routed) - sum(used)
