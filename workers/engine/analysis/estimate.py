"""The generic decoder / MoE estimate, for configs no transformers architecture fits (Grok-1, MiniMax-M1, Arctic,
vendor-format DeepSeek files ...). It lists the tensors a standard decoder with these dimensions has, so the
summary, memory and planner code treat it exactly like the inventory of a built model.

Formulas, per layer (H hidden size, V vocabulary, I FFN width, E experts):
- attention: q (heads x head_dim, H), k and v (kv_heads x head_dim, H), o (H, heads x v_head_dim);
- MLA (DeepSeek-V2 paper, eq. 9-14): q_a (q_lora, H) + q_b (heads x (nope + rope), q_lora), kv_a (kv_lora + rope,
  H), kv_b (heads x (nope + v), kv_lora), o (H, heads x v); the V3.2 indexer adds wq_b, wk and weights_proj;
- lightning attention (MiniMax-01 report, section 2.2): qkv (3 x heads x head_dim, H), output gate, output, norm;
- Kimi Delta Attention (vLLM ``layers/kda.py``): q, k, v (heads x head_dim, H) each with a short convolution, the
  low-rank decay gate f_a (head_dim, H) / f_b (heads x head_dim, head_dim) and output gate g_a / g_b alike, beta
  b (heads, H), A_log and dt_bias, a gated RMSNorm and the output (H, heads x head_dim);
- Gated DeltaNet (Qwen3-Next): in_proj_qkvz (2 x k_heads x k_dim + 2 x v_heads x v_dim, H), in_proj_ba
  (2 x v_heads, H), a short convolution over q, k and v, A_log, dt_bias, a gated RMSNorm and out (H, v_heads x v_dim);
- Mamba (Gu & Dao 2023) and Mamba-2 (Dao & Gu 2024) mixers as in their reference implementations;
- gated FFN (SwiGLU, Shazeer 2020): 3 x H x I; non-gated squared ReLU (Nemotron-4): 2 x H x I;
- MoE: router (E, H) and E gated experts of width moe_intermediate_size, plus shared experts.
"""

from __future__ import annotations

from ..models.config_loading import ConfigError, ConfigView
from ..models.layers import Layout, Mlp
from .parameter_counts import TensorRecord

# Activations used without a gate; everything else is taken as a gated (GLU) FFN, the norm for current LLMs.
UNGATED_ACTIVATIONS = frozenset({"relu2", "relu_squared", "squared_relu"})


def activation_of(view: ConfigView) -> str | None:
    value = view.get("mlp_hidden_act", "hidden_act", "activation_function", "hidden_activation",
                     "ffn_config.ffn_act_fn")
    if isinstance(value, dict):
        value = value.get("name")
    return value if isinstance(value, str) else None


def _matrix(name: str, component: str, layer: int | None, *shape: int) -> TensorRecord:
    return TensorRecord(name, component, tuple(shape), layer, True)


def _vector(name: str, component: str, layer: int | None, *shape: int) -> TensorRecord:
    return TensorRecord(name, component, tuple(shape), layer, False)


def _attention(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden, heads = view.dim("hidden_size"), view.dim("num_heads")
    kv_heads = view.dim("num_kv_heads", heads)
    head_dim = view.dim("head_dim") or hidden // heads
    v_dim = view.dim("v_head_dim", head_dim)
    p = f"layers.{layer}.attention."
    records = [_matrix(p + "q", "attention", layer, heads * head_dim, hidden),
               _matrix(p + "k", "attention", layer, kv_heads * head_dim, hidden),
               _matrix(p + "v", "attention", layer, kv_heads * v_dim, hidden),
               _matrix(p + "o", "attention", layer, hidden, heads * v_dim)]
    if view.flag("attention_bias", "qkv_bias", "add_qkv_bias"):
        records.append(_vector(p + "qkv_bias", "attention", layer, (heads + kv_heads) * head_dim + kv_heads * v_dim))
    if view.flag("use_qk_norm"):
        records.append(_vector(p + "qk_norm", "norms", layer, 2 * head_dim))
    return records


def _mla(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden, heads = view.dim("hidden_size"), view.dim("num_heads")
    kv_rank, q_rank = view.dim("kv_lora_rank"), view.dim("q_lora_rank")
    nope, rope = view.dim("qk_nope_head_dim", 128), view.dim("qk_rope_head_dim", 64)
    v_dim = view.dim("v_head_dim", nope)
    p = f"layers.{layer}.attention."
    if q_rank:
        records = [_matrix(p + "q_a", "attention", layer, q_rank, hidden),
                   _vector(p + "q_a_norm", "norms", layer, q_rank),
                   _matrix(p + "q_b", "attention", layer, heads * (nope + rope), q_rank)]
    else:
        records = [_matrix(p + "q", "attention", layer, heads * (nope + rope), hidden)]
    records += [_matrix(p + "kv_a", "attention", layer, kv_rank + rope, hidden),
                _vector(p + "kv_a_norm", "norms", layer, kv_rank),
                _matrix(p + "kv_b", "attention", layer, heads * (nope + v_dim), kv_rank),
                _matrix(p + "o", "attention", layer, hidden, heads * v_dim)]
    index_heads, index_dim = view.dim("index_n_heads"), view.dim("index_head_dim")
    if index_heads and index_dim:
        # DeepSeek-V3.2 lightning indexer: queries from the q latent, one shared key head, per-head weights.
        records += [_matrix(p + "indexer.wq_b", "attention", layer, index_heads * index_dim, q_rank or hidden),
                    _matrix(p + "indexer.wk", "attention", layer, index_dim, hidden),
                    _vector(p + "indexer.k_norm", "norms", layer, 2 * index_dim),
                    _matrix(p + "indexer.weights_proj", "attention", layer, index_heads, hidden)]
    return records


def _linear_attention(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden, heads = view.dim("hidden_size"), view.dim("num_heads")
    inner = heads * (view.dim("head_dim") or hidden // heads)
    p = f"layers.{layer}.linear_attention."
    return [_matrix(p + "qkv", "attention", layer, 3 * inner, hidden),
            _matrix(p + "output_gate", "attention", layer, inner, hidden),
            _matrix(p + "out", "attention", layer, hidden, inner),
            _vector(p + "norm", "norms", layer, inner)]


def kda_dims(view: ConfigView) -> tuple[int, int, int]:
    """(heads, head_dim, conv kernel) of Kimi Delta Attention, from linear_attn_config (Kimi-Linear) or the flat
    linear_* keys transformers' KimiLinearConfig uses."""
    heads = view.get("linear_attn_config.num_heads", "linear_num_heads") or view.dim("num_heads")
    head_dim = view.get("linear_attn_config.head_dim", "linear_head_dim") or 128
    kernel = view.get("linear_attn_config.short_conv_kernel_size", "linear_conv_kernel_dim") or 4
    return int(heads), int(head_dim), int(kernel)


def gdn_dims(view: ConfigView) -> tuple[int, int, int, int, int]:
    """(key heads, value heads, key head dim, value head dim, conv kernel) of Gated DeltaNet (Qwen3-Next keys)."""
    k_heads = view.get("linear_num_key_heads") or view.dim("num_heads")
    v_heads = view.get("linear_num_value_heads") or k_heads
    k_dim = view.get("linear_key_head_dim") or 128
    v_dim = view.get("linear_value_head_dim") or k_dim
    kernel = view.get("linear_conv_kernel_dim") or 4
    return int(k_heads), int(v_heads), int(k_dim), int(v_dim), int(kernel)


def _kda(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden = view.dim("hidden_size")
    heads, head_dim, kernel = kda_dims(view)
    inner = heads * head_dim
    p = f"layers.{layer}.kda."
    return [_matrix(p + "qkv", "attention", layer, 3 * inner, hidden),
            _vector(p + "qkv_conv1d", "attention", layer, 3 * inner * kernel),
            _matrix(p + "f_a", "attention", layer, head_dim, hidden),
            _matrix(p + "f_b", "attention", layer, inner, head_dim),
            _matrix(p + "g_a", "attention", layer, head_dim, hidden),
            _matrix(p + "g_b", "attention", layer, inner, head_dim),
            _matrix(p + "b", "attention", layer, heads, hidden),
            _vector(p + "A_log_dt_bias", "attention", layer, heads + inner),
            _vector(p + "o_norm", "norms", layer, head_dim),
            _matrix(p + "o", "attention", layer, hidden, inner)]


def _gated_delta_net(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden = view.dim("hidden_size")
    k_heads, v_heads, k_dim, v_dim, kernel = gdn_dims(view)
    key, value = k_heads * k_dim, v_heads * v_dim
    p = f"layers.{layer}.gated_delta_net."
    return [_matrix(p + "in_proj_qkvz", "attention", layer, 2 * key + 2 * value, hidden),
            _matrix(p + "in_proj_ba", "attention", layer, 2 * v_heads, hidden),
            _vector(p + "conv1d", "attention", layer, (2 * key + value) * kernel),
            _vector(p + "A_log_dt_bias", "attention", layer, 2 * v_heads),
            _vector(p + "norm", "norms", layer, v_dim),
            _matrix(p + "out", "attention", layer, hidden, value)]


def mamba_inner_size(view: ConfigView) -> int:
    """Channels of the Mamba mixer: Mamba-2 configs give heads x head_dim, Mamba-1 ones an expansion factor."""
    if view.dim("mamba_num_heads") and view.dim("mamba_head_dim"):
        return view.dim("mamba_num_heads") * view.dim("mamba_head_dim")
    return view.dim("mamba_expand", 2) * view.dim("hidden_size")


def _mamba(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden = view.dim("hidden_size")
    inner = mamba_inner_size(view)
    state, conv = view.dim("mamba_d_state", 16), view.dim("mamba_d_conv", 4)
    dt_rank = view.dim("mamba_dt_rank") or -(-hidden // 16)
    p = f"layers.{layer}.mamba."
    return [_matrix(p + "in_proj", "ssm", layer, 2 * inner, hidden),
            _vector(p + "conv1d", "ssm", layer, inner * conv + inner),
            _matrix(p + "x_proj", "ssm", layer, dt_rank + 2 * state, inner),
            _matrix(p + "dt_proj", "ssm", layer, inner, dt_rank),
            _vector(p + "dt_bias_A_log_D", "ssm", layer, inner + inner * state + inner),
            _matrix(p + "out_proj", "ssm", layer, hidden, inner)]


def _mamba2(view: ConfigView, layer: int) -> list[TensorRecord]:
    hidden = view.dim("hidden_size")
    heads, inner = view.dim("mamba_num_heads", 1), mamba_inner_size(view)
    groups, state, conv = view.dim("mamba_n_groups", 1), view.dim("mamba_d_state", 128), view.dim("mamba_d_conv", 4)
    conv_dim = inner + 2 * groups * state
    p = f"layers.{layer}.mamba2."
    return [_matrix(p + "in_proj", "ssm", layer, 2 * inner + 2 * groups * state + heads, hidden),
            _vector(p + "conv1d", "ssm", layer, conv_dim * conv + conv_dim),
            _vector(p + "dt_bias_A_log_D", "ssm", layer, 3 * heads),
            _vector(p + "norm", "norms", layer, inner),
            _matrix(p + "out_proj", "ssm", layer, hidden, inner)]


def _mlp(name: str, component: str, layer: int, hidden: int, width: int, gated: bool) -> list[TensorRecord]:
    records = [_matrix(f"{name}.up", component, layer, width, hidden),
               _matrix(f"{name}.down", component, layer, hidden, width)]
    if gated:
        records.append(_matrix(f"{name}.gate", component, layer, width, hidden))
    return records


def _ffn(view: ConfigView, mlp: Mlp, layer: int, gated: bool) -> list[TensorRecord]:
    """One layer's MLP as the layout reads it (per-layer expert counts, widths and shared experts included)."""
    hidden = view.dim("hidden_size")
    p = f"layers.{layer}.ffn"
    records = []
    if mlp.dense_width:
        records += _mlp(p + ".dense", "dense_mlp", layer, hidden, mlp.dense_width, gated)
    if mlp.experts:
        experts, width = mlp.experts, mlp.expert_width
        records.append(_matrix(p + ".router", "router", layer, experts, hidden))
        records += [_matrix(p + ".experts.up", "routed_experts", layer, experts, (2 if gated else 1) * width, hidden),
                    _matrix(p + ".experts.down", "routed_experts", layer, experts, hidden, width)]
    if mlp.shared_width:
        records += _mlp(p + ".shared_experts", "shared_experts", layer, hidden, mlp.shared_width, gated)
    return records


MIXERS = {"attention": _attention, "mla": _mla, "linear_attention": _linear_attention, "kda": _kda,
          "gated_delta_net": _gated_delta_net, "mamba": _mamba, "mamba2": _mamba2}


def estimate_records(view: ConfigView, layout: Layout) -> tuple[list[TensorRecord], list[str]]:
    """Tensors of a standard decoder with the config's dimensions, and the assumptions that were needed."""
    hidden, vocab = view.dim("hidden_size"), view.dim("vocab_size")
    activation = activation_of(view)
    gated = activation not in UNGATED_ACTIVATIONS
    notes = [f"FFN counted as {'gated (GLU, 3 matrices)' if gated else 'non-gated (2 matrices)'} "
             f"for activation {activation!r}"]
    if any(kind.mixer in ("attention", "mla", "linear_attention") for kind in layout.layers) \
            and not view.dim("num_heads"):
        raise ConfigError("the config has attention layers but no head count (num_attention_heads / n_heads)")
    tied = view.get("tie_word_embeddings", "tie_embeddings")
    if tied is None:
        notes.append("tie_word_embeddings is not stated: the output head is counted as its own matrix")
    records = [_vector("embed_tokens", "embeddings", None, vocab, hidden)]
    for index, kind in enumerate(layout.layers):
        if kind.mixer != "none":
            records += MIXERS[kind.mixer](view, index)
        records += _ffn(view, layout.mlps[index], index, gated)
        norms = (kind.mixer != "none") + (kind.ffn != "none")
        records.append(_vector(f"layers.{index}.norms", "norms", index, norms * hidden))
    records.append(_vector("final_norm", "norms", None, hidden))
    if not tied:
        records.append(_vector("lm_head", "lm_head", None, vocab, hidden))
    return records, notes
