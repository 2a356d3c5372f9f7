"""Precisions as releases ship them: MXFP4 and block FP8 read from a release's
quantization_config, the MTP projection kept in bf16, DeepSeek-V3.2's indexer cache at its own dtype and recurrent
state in the dtypes vLLM keeps it in.

External truth: gpt-oss's published checkpoint sizes (65.25 GB and 13.76 GB, decimal; 60.77 GiB in the 120b's
safetensors headers), DeepSeek-V3's FP8 checkpoint (641.30 GiB of tensors), vLLM's cache formulas
(``DeepseekV32IndexerCache``, ``MambaStateDtypeCalculator``, ``NemotronHForCausalLMConfig``) and OpenAI's "fits
into a single 80GB GPU" for gpt-oss-120b.
"""

import functools

from workers.engine.analysis import analyze, kv_cache_model, load_config_file, plan_from_analysis
from workers.engine.analysis.memory import PRECISIONS, tensor_bytes
from workers.engine.analysis.parameter_counts import TensorRecord

from .conftest import CONFIGS

GIB = 2**30


def config(name: str) -> dict:
    return load_config_file(CONFIGS / f"{name}.json")


@functools.lru_cache(maxsize=None)
def shipped(name: str) -> dict:
    report = analyze(config(name))
    return {"weights": report["weights_bytes"], **report["weights_memory"]["as_shipped"],
            "components": report["components"]}


def within(ours: float, published: float, tolerance: float) -> bool:
    return abs(ours / published - 1) <= tolerance


def test_gpt_oss_as_shipped_in_mxfp4_matches_the_published_checkpoint_sizes():
    # openai/gpt-oss model cards: gpt-oss-120b 65.25 GB, gpt-oss-20b 13.76 GB (1 GB = 1e9 bytes).
    for name, published in (("gpt-oss-120b", 65.25e9), ("gpt-oss-20b", 13.76e9)):
        release = shipped(name)
        assert release["method"] == "mxfp4" and release["quantized_components"] == ["routed_experts"]
        assert within(release["weights_bytes"], published, 0.02), (name, release["weights_bytes"])
        assert release["weights"]["as_shipped"] == release["weights_bytes"]
        # Expert weights at 4.25 bits (16 bytes of FP4 + one E8M0 byte per 32), everything else in bf16.
        by_format = release["params_by_format"]
        assert release["weights_bytes"] == by_format["mxfp4"] * 17 // 32 + by_format["bf16"] * 2
    # The 120b's safetensors headers hold 60.77 GiB.
    assert round(shipped("gpt-oss-120b")["weights_bytes"] / GIB, 2) == 60.77


def test_gpt_oss_120b_as_shipped_fits_one_80_gb_gpu_and_bf16_does_not():
    # OpenAI's gpt-oss README: the 120b "fits into a single 80GB GPU (like NVIDIA H100 or AMD MI300X)".
    h100 = {"devices_per_node": 1, "device_memory_bytes": 80 * 10**9, "device_name": "NVIDIA H100"}
    report = analyze(config("gpt-oss-120b"))
    workload = {"concurrency": 1, "context_tokens": 8192}
    assert plan_from_analysis(report, h100, "as_shipped", workload)["fits"]
    assert not plan_from_analysis(report, h100, "bf16", workload)["fits"]


def test_deepseek_v3_fp8_checkpoint_with_its_mtp_module_is_the_published_tensor_total():
    # DeepSeek-V3's FP8 safetensors hold 641.30 GiB of tensors: the main model, the MTP module (its eh_proj in
    # bf16, no weight_scale_inv) and the embedding and head that module stores again. eh_proj counted in fp8
    # would give 641.19 GiB, 0.017% short.
    release = shipped("deepseek-v3")
    assert release["method"] == "fp8" and release["block"] == [128, 128]
    assert within(release["checkpoint_bytes"], 641.30 * GIB, 0.0001), release["checkpoint_bytes"] / GIB
    # The main model as shipped is the fp8 precision exactly: routers, norms, embeddings and head in bf16.
    assert release["weights_bytes"] == release["weights"]["fp8"]


def test_the_mtp_projection_stays_bf16_at_every_quantized_precision():
    eh_proj = TensorRecord("mtp.0.eh_proj.weight", "mtp_projection", (7168, 14336), None, True)
    for name in ("fp8", "int8", "int4", "mxfp4"):
        assert tensor_bytes(eh_proj, PRECISIONS[name]) == 2 * 7168 * 14336


def test_modules_to_not_convert_and_the_block_size_come_from_the_quantization_config():
    # Llama-3.2-1B (every width a multiple of 128) shipped in block FP8 with its attention left in bf16.
    raw = config("llama-3.2-1b")
    raw["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["model.layers.*.self_attn"]}
    release = analyze(raw)
    components, details = release["components"], release["weights_memory"]["as_shipped"]
    mlp = components["dense_mlp"]
    expected = mlp + mlp // (128 * 128) * 4 + 2 * (release["total_params"] - mlp)
    assert details["weights_bytes"] == release["weights_bytes"]["as_shipped"] == expected
    # Without the exception the attention is FP8 too; a 256-wide block has a quarter of the scales.
    raw["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [256, 256]}
    quantized = components["dense_mlp"] + components["attention"]
    assert analyze(raw)["weights_bytes"]["as_shipped"] == (
        quantized + quantized // (256 * 256) * 4 + 2 * (release["total_params"] - quantized))


def test_an_unmodelled_quantization_method_is_said_not_guessed():
    raw = config("llama-3.2-1b")
    raw["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    report = analyze(raw)
    assert report["weights_bytes"]["as_shipped"] == report["weights_bytes"]["bf16"]
    assert any("'bitsandbytes' is not modelled" in warning for warning in report["warnings"])


def test_deepseek_v32_indexer_cache_is_132_bytes_per_token_and_layer_at_any_kv_precision():
    # vLLM: DeepseekV32IndexerCache(head_dim=128 + 128 // 128 * 4, dtype=torch.uint8) per layer, beside the MLA
    # latent (kv_lora_rank 512 + rope 64 elements at the KV precision).
    for source in ("deepseek-v3.2", "vendor-format/deepseek-v3.2-exp"):
        kv = kv_cache_model(config(source))
        assert kv.bytes_per_token("bf16") == 61 * (576 * 2 + 132)
        assert kv.bytes_per_token("fp8") == 61 * (576 + 132)
        # MLA latent and indexer keys are whole on every tensor-parallel rank.
        assert kv.bytes_per_token("fp8", tensor_parallel=8) == 61 * (576 + 132)
    summary = kv_cache_model(config("deepseek-v3.2")).summary()["indexer"]
    assert summary["bytes_per_token"] == 61 * 132 and "uint8" in summary["dtype"]
    assert kv_cache_model(config("deepseek-v3")).bytes_per_token("bf16") == 61 * 576 * 2


def test_recurrent_state_is_sized_in_vllms_default_dtypes_and_stated():
    # Nemotron-H-56B: 54 Mamba-2 layers, 256 heads x 64 x state 256 SSM state in fp32 (vLLM's Nemotron-H
    # default), conv state (16384 + 2 x 8 x 256) x 3 in bf16.
    nemotron = config("nemotron-h-56b-base-8k")
    kv = kv_cache_model(nemotron)
    assert kv.state_bytes_per_sequence() == 54 * (256 * 64 * 256 * 4 + (16384 + 2 * 8 * 256) * 3 * 2)
    stated = kv.summary()["recurrent_state"]
    assert stated["mamba_ssm"]["dtype"] == "fp32" and stated["mamba_conv"]["dtype"] == "bf16"
    # A config that names its SSM cache dtype is followed, as vLLM follows it.
    assert kv_cache_model({**nemotron, "mamba_ssm_cache_dtype": "bfloat16"}).state_bytes_per_sequence() == \
        54 * (256 * 64 * 256 * 2 + (16384 + 2 * 8 * 256) * 3 * 2)
    # MiniMax-M1's 70 lightning-attention layers: 64 heads x 128 x 128 in the model dtype (bf16).
    minimax = kv_cache_model(config("minimax-m1"))
    assert minimax.state_bytes_per_sequence() == 70 * 64 * 128 * 128 * 2
    assert minimax.summary()["recurrent_state"] == {"linear_attention": {
        "dtype": "bf16", "source": "vLLM's default: mamba_cache_dtype auto, the model dtype"}}
    # Jamba (Mamba-1, not Nemotron-H): SSM state in the model dtype too.
    jamba = kv_cache_model(config("jamba-v0.1")).summary()["recurrent_state"]
    assert jamba["mamba_ssm"]["dtype"] == jamba["mamba_conv"]["dtype"] == "bf16"
