"""Small models of a real architecture: a shipped config.json shrunk in depth and width, or a checkpoint on disk.

``small_config`` is a stand-in for the architecture-preserving reducer of the one model path
(``workers/engine/models/reducer.py``), which is to replace it. It keeps what changes how a model is sharded —
the layer kinds (dense and MoE layers, sliding and full attention), grouped-query or multi-head attention, a
head_dim that differs from hidden/heads, MLA's low-rank projections, shared experts and group-limited routing —
and shrinks the sizes so two CPU processes run a model in seconds.

Only architectures that transformers implements itself are built: a config whose model needs remote code is
refused (d0 never passes ``trust_remote_code``).
"""

from __future__ import annotations

import copy
from pathlib import Path

# Keys that describe how a checkpoint was stored, not the architecture; a random-weight model must not inherit
# them (an FP8 quantization_config would ask for kernels, auto_map for remote code).
STORAGE_KEYS = ("auto_map", "quantization_config", "torch_dtype", "dtype", "_name_or_path", "transformers_version")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _distinct_kinds_first(kinds: list, layers: int) -> list:
    """A per-layer kind list of ``layers`` entries that holds every kind of the original, in original order."""
    distinct = list(dict.fromkeys(kinds))
    if len(distinct) >= layers:
        return distinct[:layers]
    return distinct + [kinds[index % len(kinds)] for index in range(len(distinct), layers)]


def small_config(config: dict, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 512,
                 experts: int = 8) -> dict:
    """Shrink an HF ``config.json`` dict to ``layers`` layers of width ``hidden``, keeping its layer kinds."""
    small = {key: value for key, value in copy.deepcopy(config).items() if key not in STORAGE_KEYS}
    original_heads = config.get("num_attention_heads", heads)
    original_kv_heads = config.get("num_key_value_heads") or original_heads
    small.update(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers, vocab_size=vocab,
                 intermediate_size=2 * hidden)
    # Keep the attention kind: multi-head, multi-query or grouped-query (two query heads per KV head).
    small["num_key_value_heads"] = (heads if original_kv_heads == original_heads
                                    else 1 if original_kv_heads == 1 else heads // 2)
    if config.get("head_dim") and config.get("hidden_size"):
        # Qwen3 and others use head_dim != hidden/heads; keep that quirk, it changes every attention split.
        quirky = config["head_dim"] * original_heads != config["hidden_size"]
        small["head_dim"] = (2 if quirky else 1) * hidden // heads
    if "moe_intermediate_size" in config:
        small["moe_intermediate_size"] = hidden
    for key in EXPERT_COUNT_KEYS:
        if config.get(key):
            small[key] = min(config[key], experts)
    expert_count = next((small[key] for key in EXPERT_COUNT_KEYS if small.get(key)), None)
    if expert_count:
        top_k = config.get("num_experts_per_tok", 1)
        if config.get("n_group"):
            # Group-limited routing (DeepSeek-V3): keep several groups and pick fewer groups than exist.
            groups = min(config["n_group"], max(1, expert_count // 2))
            small["n_group"] = groups
            small["topk_group"] = groups if config.get("topk_group", groups) >= config["n_group"] else max(
                1, groups // 2)
            top_k = min(top_k, small["topk_group"] * expert_count // groups)
        small["num_experts_per_tok"] = min(top_k, 2, expert_count)
    if config.get("first_k_dense_replace"):
        small["first_k_dense_replace"] = 1  # layer 0 dense, the others MoE: both kinds remain
    if isinstance(config.get("mlp_only_layers"), list):
        small["mlp_only_layers"] = [index for index in config["mlp_only_layers"] if index < layers]
    if isinstance(config.get("layer_types"), list) and config["layer_types"]:
        small["layer_types"] = _distinct_kinds_first(config["layer_types"], layers)
    if "max_window_layers" in config:
        small["max_window_layers"] = min(config["max_window_layers"], layers)
    for key in ("q_lora_rank", "kv_lora_rank"):  # MLA's low-rank compressions
        if config.get(key):
            small[key] = hidden // 2
    for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        if config.get(key):
            small[key] = 16
    for key in TOKEN_ID_KEYS:
        # Real token ids (128000, 151643) lie outside a small vocabulary; an out-of-range padding_idx is an error.
        value = small.get(key)
        if isinstance(value, list):
            small[key] = [token for token in value if token < vocab] or None
        elif isinstance(value, int) and value >= vocab:
            small[key] = None
    return small


def transformers_config(config: dict):
    """The transformers config object for an HF config dict; refuses architectures that need remote code."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"model_type {model_type!r} is not implemented by transformers (it would need remote code, "
                         "which d0 never runs)")
    return CONFIG_MAPPING[model_type](**{key: value for key, value in config.items() if key != "model_type"})


def build_model(config: dict | None, *, seed: int, weights_path: str | None = None):
    """An fp32 CPU model in eval mode: seeded random weights from ``config``, or a checkpoint on local disk."""
    import torch
    from transformers import AutoModelForCausalLM

    if weights_path:
        # A local folder only: local_files_only keeps the hub out, use_safetensors refuses pickled weights.
        model = AutoModelForCausalLM.from_pretrained(Path(weights_path), local_files_only=True,
                                                     use_safetensors=True, dtype=torch.float32)
        return model.eval()
    # Same seed, same CPU build on every rank: every rank holds identical weights before it keeps its shard
    # (the fingerprint check in rank_main proves it across machines).
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(transformers_config(config), dtype=torch.float32).eval()
