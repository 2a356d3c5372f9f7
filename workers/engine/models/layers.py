"""What each decoder layer is made of, read from the config: its sequence mixer, attention window and FFN.

One layout serves the generic parameter estimate, the KV-cache model, the mechanisms report and the planner, so
they cannot disagree about which layers are sliding, which are Mamba and which carry experts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .config_loading import ConfigView

# Sequence mixers. "attention" is softmax attention with per-head K/V (MHA/GQA/MQA), "mla" DeepSeek's multi-head
# latent attention, "linear_attention" MiniMax's lightning attention, "mamba"/"mamba2" selective state spaces.
MIXERS = ("attention", "mla", "linear_attention", "mamba", "mamba2", "none")
# Attention windows: the KV cache of "sliding" and "chunked" layers stops growing at the window.
WINDOWS = ("full", "sliding", "chunked")
FFNS = ("dense", "moe", "moe+dense", "none")


@dataclass(frozen=True)
class LayerKind:
    mixer: str
    window: str
    ffn: str

    @property
    def label(self) -> str:
        mixer = self.mixer if self.window == "full" or self.mixer not in ("attention", "mla") \
            else f"{self.window} {self.mixer}"
        if self.mixer == "none":
            return f"{self.ffn} ffn"
        return f"{mixer} + {self.ffn} ffn" if self.ffn != "none" else mixer


@dataclass(frozen=True)
class Layout:
    layers: tuple[LayerKind, ...]
    notes: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        return dict(Counter(kind.label for kind in self.layers))

    @property
    def moe_layers(self) -> int:
        return sum(kind.ffn.startswith("moe") for kind in self.layers)

    @property
    def dense_layers(self) -> int:
        return sum(kind.ffn == "dense" for kind in self.layers)


def _mamba_kind(view: ConfigView) -> str:
    # Mamba-2 configs carry a head count and groups (Dao & Gu 2024); Mamba-1 ones a dt rank (Gu & Dao 2023).
    return "mamba2" if view.dim("mamba_num_heads") or view.dim("mamba_n_groups") else "mamba"


def _mixers(view: ConfigView, layers: int) -> list[str]:
    attention = "mla" if view.dim("kv_lora_rank") else "attention"
    pattern = view.get("hybrid_override_pattern")
    if pattern is not None:
        # Nemotron-H: M = Mamba-2 block, * = attention block, - = MLP block, E = MoE block; one mixer per block.
        mamba = _mamba_kind(view)
        return [{"M": mamba, "*": attention}.get(char, "none") for char in pattern]
    blocks = view.get("layers_block_type")
    if blocks is not None:
        return [{"mamba": _mamba_kind(view), "attention": attention}.get(block, "none") for block in blocks]
    period = view.dim("attn_layer_period")
    if period:
        offset = view.dim("attn_layer_offset", 0)
        return [attention if index % period == offset else _mamba_kind(view) for index in range(layers)]
    kinds = view.get("attn_type_list")
    if kinds is not None:
        # MiniMax-01/M1: 0 = lightning (linear) attention, 1 = softmax attention.
        return [attention if kind == 1 else "linear_attention" for kind in kinds]
    types = view.get("layer_types")
    if types is not None:
        return ["linear_attention" if kind == "linear_attention" else "mamba" if kind == "mamba" else attention
                for kind in types]
    return [attention] * layers


def _windows(view: ConfigView, mixers: list[str], hf_layer_types: list | None, notes: list[str]) -> list[str]:
    layers = len(mixers)
    types = view.get("layer_types")
    if types is None and hf_layer_types is not None and set(hf_layer_types) <= {
            "full_attention", "sliding_attention", "chunked_attention"}:
        # transformers fills layer_types from other keys (Qwen's use_sliding_window, Llama-4's no_rope_layers).
        types = hf_layer_types
    if types is not None:
        return ["sliding" if kind == "sliding_attention" else "chunked" if kind == "chunked_attention" else "full"
                for kind in types]
    window, chunk = view.dim("sliding_window"), view.dim("attention_chunk_size")
    if window and view.get("use_sliding_window") is not False:
        if view.get("use_sliding_window") and view.dim("max_window_layers") is not None:
            # Qwen2's rule: layers from max_window_layers on use the sliding window.
            first = view.dim("max_window_layers")
            return ["sliding" if index >= first else "full" for index in range(layers)]
        return ["sliding"] * layers
    if chunk:
        no_rope = view.get("no_rope_layers")
        if no_rope is not None:
            # Llama-4: layers that use RoPE attend within chunks; the NoPE layers (0 here) attend globally.
            return ["chunked" if flag else "full" for flag in no_rope]
        notes.append("attention_chunk_size is set but the config does not say which layers are chunked; "
                     "all attention layers are counted as full (an upper bound for the KV cache)")
    return ["full"] * layers


def _ffns(view: ConfigView, mixers: list[str]) -> list[str]:
    layers = len(mixers)
    pattern = view.get("hybrid_override_pattern")
    if pattern is not None:
        return ["dense" if char == "-" else "moe" if char == "E" else "none" for char in pattern]
    experts = view.dim("num_experts", 0)
    if not experts:
        return ["dense"] * layers
    moe = "moe+dense" if view.flag("use_residual") else "moe"
    mlp_types = view.get("mlp_layer_types")
    if mlp_types is not None:
        return [moe if kind == "sparse" else "dense" for kind in mlp_types]
    explicit = view.get("moe_layers")
    if explicit is not None:
        return [moe if index in set(explicit) else "dense" for index in range(layers)]
    first_dense = view.dim("first_dense_layers")
    if first_dense is not None or view.dim("moe_layer_freq"):
        # DeepSeek-V2/V3 modeling: MoE when layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
        freq = view.dim("moe_layer_freq", 1)
        return [moe if index >= (first_dense or 0) and index % freq == 0 else "dense" for index in range(layers)]
    if view.dim("decoder_sparse_step") or view.get("mlp_only_layers") is not None:
        # Qwen2/3-MoE: MoE when the layer is not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0.
        step, dense = view.dim("decoder_sparse_step", 1), set(view.get("mlp_only_layers", default=[]))
        return [moe if index not in dense and (index + 1) % step == 0 else "dense" for index in range(layers)]
    step = view.dim("interleave_moe_layer_step")
    if step:
        # Llama-4: moe_layers = range(step - 1, layers, step).
        return [moe if (index + 1) % step == 0 else "dense" for index in range(layers)]
    period = view.dim("expert_layer_period")
    if period:
        offset = view.dim("expert_layer_offset", 0)
        return [moe if index % period == offset else "dense" for index in range(layers)]
    frequency = view.dim("moe_layer_frequency")
    if frequency:
        # Snowflake Arctic: MoE when (layer_id + 1) % moe_layer_frequency == 0.
        return [moe if (index + 1) % frequency == 0 else "dense" for index in range(layers)]
    return [moe] * layers


def layer_layout(view: ConfigView, hf_layer_types: list | None = None) -> Layout:
    """The kind of every decoder layer; ``hf_layer_types`` is transformers' resolved ``layer_types`` if any."""
    notes: list[str] = []
    mixers = _mixers(view, view.dim("num_layers"))
    windows = _windows(view, mixers, hf_layer_types, notes)
    ffns = _ffns(view, mixers)
    layers = tuple(LayerKind(mixer, window if mixer in ("attention", "mla") else "full", ffn)
                   for mixer, window, ffn in zip(mixers, windows, ffns, strict=True))
    return Layout(layers, tuple(notes))
