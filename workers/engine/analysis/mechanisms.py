"""The mechanisms a config declares: attention kind and pattern, RoPE variant, MoE routing, norms, activation,
tied embeddings, MTP, context length and any shipped quantization. Values are reported as the config states
them; where the config is silent the field is null rather than a guessed default.
"""

from __future__ import annotations

from collections import Counter

from ..models.config_loading import ConfigView
from .estimate import UNGATED_ACTIVATIONS, activation_of
from ..models.layers import Layout, layer_ranges

ROPE_SCALAR_KEYS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                    "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def _attention(view: ConfigView, layout: Layout, qk_norm: bool | None) -> dict:
    heads, kv_lora = view.dim("num_heads"), view.dim("kv_lora_rank")
    kv_heads = view.dim("num_kv_heads", heads)
    mixers = {kind.mixer for kind in layout.layers}
    windows = {kind.window for kind in layout.layers if kind.mixer in ("attention", "mla")}
    if kv_lora:
        kind = "mla"
    elif not heads:
        kind = None
    else:
        # Shazeer 2019 (MQA): one KV head; Ainslie et al. 2023 (GQA): groups of query heads share a KV head.
        kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    if mixers & {"mamba", "mamba2"}:
        pattern = "hybrid mamba/attention"
    elif mixers & {"linear_attention", "kda", "gated_delta_net"}:
        pattern = "hybrid linear/softmax attention"
    elif any(kind.sparse for kind in layout.layers):
        # DeepSeek Sparse Attention: each query attends to the index_topk keys its lightning indexer picks.
        pattern = "sparse (indexed)"
    elif windows == {"sliding"}:
        pattern = "sliding window"
    elif "sliding" in windows:
        pattern = "interleaved sliding/full"
    elif "chunked" in windows:
        pattern = "interleaved chunked/full"
    else:
        pattern = "full"
    result = {
        "kind": kind,
        "pattern": pattern,
        "heads": heads,
        "kv_heads": kv_heads if not kv_lora else None,
        "head_dim": view.dim("head_dim") or (view.dim("hidden_size") // heads if heads and not kv_lora else None),
        "layers": layout.counts(),
        # Per layer kind of attention: full, sliding, chunked, mla, sparse mla, or the recurrent mixer.
        "attention_kinds": dict(Counter(kind.attention for kind in layout.layers if kind.mixer != "none")),
        "layout": layout.describe(),
        "sliding_window": view.dim("sliding_window") if "sliding" in windows else None,
        "attention_chunk_size": view.dim("attention_chunk_size"),
        "qk_norm": qk_norm if qk_norm is not None else view.get("use_qk_norm"),
        "bias": view.get("attention_bias", "qkv_bias"),
        "logit_softcap": view.number("attn_logit_softcapping", "max_attn_value"),
        "notes": list(layout.notes),
    }
    if kv_lora:
        result["mla"] = {name: view.dim(name) for name in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                                                            "qk_rope_head_dim", "v_head_dim")}
    if view.dim("index_n_heads"):
        result["sparse_indexer"] = {"index_n_heads": view.dim("index_n_heads"),
                                    "index_head_dim": view.dim("index_head_dim"),
                                    "index_topk": view.get("index_topk")}
    return result


def _rope(view: ConfigView) -> dict:
    params = view.get("rope_scaling", "rope_parameters")
    params = params if isinstance(params, dict) else {}
    legacy = "type" in params and "rope_type" not in params
    kind = params.get("rope_type") or params.get("type") or "default"
    if "mrope_section" in params:
        # Qwen2-VL configs name it "default" or "mrope" and mark it by mrope_section.
        kind = "mrope"
    head_dim = view.dim("head_dim")
    rotary_dim = view.dim("qk_rope_head_dim") if view.dim("kv_lora_rank") else view.get("rotary_dim")
    partial = view.number("partial_rotary_factor", "rope_percent", "rope_percentage")
    if partial is None and isinstance(rotary_dim, int) and head_dim and not view.dim("kv_lora_rank"):
        partial = rotary_dim / head_dim
    no_rope = view.get("no_rope_layers")
    # longrope's per-dimension factors and mrope's sections are long lists; their length is what matters here.
    scaling = {key: params[key] for key in ROPE_SCALAR_KEYS if key in params} | {
        key: f"list of {len(params[key])}" for key in ("short_factor", "long_factor", "mrope_section")
        if isinstance(params.get(key), list)}
    result = {
        "type": kind,
        "theta": view.number("rope_theta") or params.get("rope_theta"),
        "scaling": scaling or None,
        "partial_rotary_factor": partial,
        "nope_layers": no_rope.count(0) if isinstance(no_rope, list) else None,
        "notes": [],
    }
    if legacy:
        result["notes"].append(f"rope_scaling uses the legacy key \"type\": \"{kind}\" (now rope_type)")
    if kind == "yarn" and params.get("beta_fast") == params.get("beta_slow") is not None:
        result["notes"].append("YaRN with beta_fast == beta_slow: no ramp between interpolated and extrapolated "
                               "dimensions")
    return result


def _moe(view: ConfigView, layout: Layout) -> dict | None:
    experts = view.dim("num_experts", 0)
    if not experts:
        return None
    groups = view.get("n_group", "n_expert_groups")
    return {
        "experts": experts,
        "experts_per_token": view.dim("experts_per_token"),
        "shared_experts": view.dim("num_shared_experts") or (1 if view.dim("shared_expert_intermediate_size")
                                                               else 0),
        "expert_intermediate_size": view.dim("moe_intermediate_size") or view.dim("intermediate_size"),
        "shared_expert_intermediate_size": view.dim("shared_expert_intermediate_size"),
        "moe_layers": layout.moe_layers,
        "dense_layers": layout.dense_layers,
        "residual_dense_mlp": any(kind.ffn == "moe+dense" for kind in layout.layers),
        # Where the config gives experts, top-k, shared experts or widths per layer (Hunyuan), each distinct MLP
        # shape with the layers that have it.
        "per_layer": _per_layer_mlps(layout) if view.per_layer_keys or len(set(layout.mlps)) > 2 else None,
        # DeepSeek-V3 report section 2.1.2: tokens go to at most topk_group of n_group expert groups.
        "group_limited_routing": {"n_group": groups, "topk_group": view.get("topk_group", "n_limited_groups")}
        if isinstance(groups, int) and groups > 1 else None,
        "scoring_func": view.get("scoring_func", "score_func"),
        "topk_method": view.get("topk_method"),
        "routed_scaling_factor": view.number("routed_scaling_factor", "route_scale"),
        "norm_topk_prob": view.get("norm_topk_prob"),
        "routing_bias": view.get("use_routing_bias") if view.get("use_routing_bias") is not None
        else (view.get("topk_method") == "noaux_tc" or None),
    }


def _per_layer_mlps(layout: Layout) -> list[dict]:
    shapes: dict = {}
    for index, mlp in enumerate(layout.mlps):
        shapes.setdefault(mlp, []).append(index)
    return [{**mlp.as_dict(), "layers": layer_ranges(indices)} for mlp, indices in shapes.items()]


def _norm(view: ConfigView, norm_classes: list[str] | None, qk_norm: bool | None) -> dict:
    if norm_classes:
        kind = "rmsnorm" if any("RMS" in name for name in norm_classes) else "layernorm"
    elif view.get("rms_norm_eps") is not None:
        kind = "rmsnorm"
    elif view.get("layer_norm_eps", "layer_norm_epsilon", "norm_eps") is not None:
        kind = "layernorm"
    else:
        kind = None
    return {
        "type": kind,
        "classes": norm_classes,
        "eps": view.number("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"),
        "placement": "post-norm" if view.flag("postnorm") else "pre-norm",
        "qk_norm": qk_norm if qk_norm is not None else view.get("use_qk_norm"),
    }


def _quantization(view: ConfigView) -> dict | None:
    shipped = view.raw.get("quantization_config")
    if not isinstance(shipped, dict):
        return None
    return {
        "method": shipped.get("quant_method"),
        "format": shipped.get("fmt"),
        "weight_block_size": shipped.get("weight_block_size"),
        "modules_to_not_convert": shipped.get("modules_to_not_convert"),
        "as_shipped": shipped,
    }


def mechanisms_of(view: ConfigView, layout: Layout, *, tied: bool, norm_classes: list[str] | None = None,
                  qk_norm: bool | None = None) -> dict:
    activation = activation_of(view)
    params = view.get("rope_scaling", "rope_parameters")
    return {
        "attention": _attention(view, layout, qk_norm),
        "rope": _rope(view),
        "moe": _moe(view, layout),
        "norm": _norm(view, norm_classes, qk_norm),
        "activation": {"name": activation, "gated": activation not in UNGATED_ACTIVATIONS,
                       "swiglu_limit": view.number("swiglu_limit")},
        "tied_embeddings": tied,
        "mtp_layers": view.dim("mtp_layers") or view.dim("mtp_modules_other") or 0,
        "context_length": view.dim("max_position_embeddings"),
        "original_context_length": params.get("original_max_position_embeddings") if isinstance(params, dict)
        else None,
        "dtype": view.get("torch_dtype", "dtype"),
        "quantization_config": _quantization(view),
    }
