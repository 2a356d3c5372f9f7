"""d0's generic decoder, for a config no transformers class fits (a release whose modeling code is its own).

Day zero is exactly when a model's own code exists and transformers' does not. Its code is never run (that would be
remote code); instead the config's standard keys — the ones model intake reads (``config_loading``) — are
written into the config of a transformers decoder of the same shape, so that every stage has a real torch module:
coverage traces it, sharded runs split it with that class's tensor-parallel plan, sweeps serve it.

- softmax attention with the config's heads, key/value heads and head dim (Llama's), or DeepSeek-V3's multi-head
  latent attention when MLA ranks are present;
- dense MLP layers, and routed experts with their top-k (Mixtral's), with a shared expert when one is declared
  (Qwen2-MoE's) and the dense layers where the layout says so;
- MiniMax's lightning (linear) attention beside softmax attention, layer by layer as the layout says, with routed
  experts (MiniMax-Text-01's);
- RMSNorm, rope with the config's theta, tied embeddings as declared.

The layers come from the one layer description (``layers.layer_layout``). A sequence mixer none of these shapes has
(Mamba, Kimi's delta attention, linear attention without MiniMax's experts) is not built as something else: the
config is refused with the kind and the key that sets it (``UnbuildableLayers``), so the stage that needed the
model fails with that line. What the shapes simplify (multipliers, custom norms, MLP-only blocks built with
attention) is listed in the note every report made with it carries.
"""

from __future__ import annotations

# Sequence mixers some generic shape builds as they are ("none": a block without a mixer, built with attention).
BUILT_MIXERS = ("attention", "mla", "none")


class UnbuildableLayers(ValueError):
    """The config has a layer kind no generic shape implements; the message names the kind and its keys."""


GENERIC_NOTE = ("generic architecture: the release's own modeling code was not run; d0 built a {shape} from the "
                "config's standard keys")


def _view(config: dict):
    from .config_loading import ConfigView

    return ConfigView(config)


def generic_config(config: dict) -> tuple[dict, str]:
    """A config.json dict of a transformers architecture with ``config``'s shape, and the note that says so."""
    from .config_loading import IGNORABLE_KEYS
    from .layers import layer_layout

    view = _view(config)
    layout = layer_layout(view)
    hidden, layers, heads = view.dim("hidden_size"), view.dim("num_layers"), view.dim("num_heads")
    common = {
        "vocab_size": view.dim("vocab_size"), "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": view.dim("num_kv_heads", heads),
        "head_dim": view.dim("head_dim") or hidden // heads,
        "max_position_embeddings": min(view.dim("max_position_embeddings", 4096), 2**20),
        "rms_norm_eps": float(view.get("rms_norm_eps", "layer_norm_epsilon", default=1e-5)),
        "rope_theta": float(view.get("rope_theta", default=10000.0)),
        "tie_word_embeddings": view.flag("tie_word_embeddings"),
        "hidden_act": _activation(view.get("hidden_act", "activation_function")), "attention_bias": False,
    }
    dense_width = view.dim("dense_intermediate_size") or view.dim("intermediate_size") or 4 * hidden
    experts, top_k = view.dim("num_experts", 0), view.dim("experts_per_token", 0)
    moe_width = view.dim("moe_intermediate_size") or view.dim("intermediate_size") or 4 * hidden
    shared = view.dim("shared_expert_intermediate_size") or view.dim("num_shared_experts", 0) * moe_width
    dense_layers = [index for index, kind in enumerate(layout.layers) if not kind.ffn.startswith("moe")]
    if not shared and any(kind.ffn == "moe+dense" for kind in layout.layers):
        # Arctic's dense MLP beside the experts ("residual MoE") runs for every token, as a shared expert does.
        shared = dense_width
    mixers = {kind.mixer for kind in layout.layers}
    left_out = sorted(mixers & {"none"})
    unbuilt = sorted(mixers - set(BUILT_MIXERS))
    if unbuilt == ["linear_attention"] and experts > 1 and top_k and not shared and not view.dim("kv_lora_rank"):
        built = {**common, "model_type": "minimax", "num_local_experts": experts, "num_experts_per_tok": top_k,
                 "intermediate_size": moe_width, "block_size": view.get("block_size", default=256),
                 "layer_types": ["linear_attention" if kind.mixer == "linear_attention" else "full_attention"
                                 for kind in layout.layers]}
        shape = "MiniMax-shaped decoder (lightning attention in the linear-attention layers, routed experts)"
    elif unbuilt:
        keys = f" ({', '.join(layout.pattern_keys)})" if layout.pattern_keys else ""
        raise UnbuildableLayers(f"layer kind {', '.join(repr(kind) for kind in unbuilt)}{keys} has no generic "
                                "implementation: d0 builds a release without a transformers class from softmax "
                                "attention, MLA and MiniMax's lightning attention with routed experts only")
    elif view.dim("kv_lora_rank"):
        built, shape = _mla(view, common, dense_width, experts, top_k, moe_width, dense_layers), "DeepSeek-V3-shaped"
    elif experts > 1 and top_k:
        if shared:
            built = {**common, "model_type": "qwen2_moe", "num_experts": experts, "num_experts_per_tok": top_k,
                     "moe_intermediate_size": moe_width, "shared_expert_intermediate_size": shared,
                     "intermediate_size": dense_width, "decoder_sparse_step": 1, "mlp_only_layers": dense_layers,
                     "norm_topk_prob": True}
            shape = "Qwen2-MoE-shaped decoder (routed experts and a shared expert)"
        else:
            built = {**common, "model_type": "mixtral", "num_local_experts": experts, "num_experts_per_tok": top_k,
                     "intermediate_size": moe_width, "sliding_window": view.dim("sliding_window")}
            shape = "Mixtral-shaped decoder (routed experts)"
            if dense_layers:
                left_out.append(f"dense layers {dense_layers} built with experts")
    else:
        built = {**common, "model_type": "llama", "intermediate_size": dense_width}
        shape = "Llama-shaped dense decoder"
    view.get("hidden_act", "activation_function", "sliding_window")  # read above, for the note's list
    interpreted = view.read_keys | set(IGNORABLE_KEYS)
    uninterpreted = sorted(key for key in config if key not in interpreted and not isinstance(config[key], dict))
    note = GENERIC_NOTE.format(shape=shape)
    if left_out:
        note += "; built as softmax attention or otherwise simplified: " + ", ".join(left_out)
    if uninterpreted:
        note += "; keys not interpreted: " + ", ".join(uninterpreted)
    return built, note


def _activation(name) -> str:
    """The config's activation when transformers knows it by that name, else SiLU (the usual gated MLP's)."""
    from transformers.activations import ACT2FN

    return name if isinstance(name, str) and name in ACT2FN else "silu"


def _mla(view, common: dict, dense_width: int, experts: int, top_k: int, moe_width: int,
         dense_layers: list[int]) -> dict:
    rope = view.dim("qk_rope_head_dim", 64)
    mla = {**common, "model_type": "deepseek_v3", "kv_lora_rank": view.dim("kv_lora_rank"),
           "q_lora_rank": view.dim("q_lora_rank"), "qk_rope_head_dim": rope,
           "qk_nope_head_dim": view.dim("qk_nope_head_dim", 128), "v_head_dim": view.dim("v_head_dim", 128),
           "head_dim": rope, "intermediate_size": dense_width, "n_group": 1, "topk_group": 1}
    if experts > 1 and top_k:
        first_dense = next((index for index in range(len(dense_layers)) if dense_layers[index] != index),
                           len(dense_layers))
        return {**mla, "n_routed_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": moe_width,
                "n_shared_experts": view.dim("num_shared_experts", 0), "first_k_dense_replace": first_dense}
    return {**mla, "n_routed_experts": 1, "num_experts_per_tok": 1, "moe_intermediate_size": moe_width,
            "n_shared_experts": 0, "first_k_dense_replace": common["num_hidden_layers"]}
