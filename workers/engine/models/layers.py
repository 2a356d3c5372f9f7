"""What each decoder layer is made of, read from the config: its sequence mixer, attention window and FFN.

One layout serves the generic parameter estimate, the KV-cache model, the mechanisms report and the planner, so
they cannot disagree about which layers are sliding, which are Mamba and which carry experts. Releases say it in
many ways, all read here:

- per-layer lists: ``layer_types`` (gpt-oss, Qwen3-Next, DeepSeek-V3.2-style ``deepseek_sparse_attention``),
  ``attn_type_list`` (MiniMax), ``layers_block_type`` / ``hybrid_override_pattern`` (Nemotron-H),
  ``mlp_layer_types``, and per-layer values of expert counts, top-k, shared experts and widths (Hunyuan);
- index lists at any depth, ``*_layers`` (Kimi-Linear's ``linear_attn_config.full_attn_layers`` / ``kda_layers``,
  which are 1-based; ``moe_layers``, ``mlp_only_layers``), their base told from their values;
- periods: ``*_interval`` / ``*_freq`` / ``*_period`` / ``*_step`` / ``*_pattern`` (Qwen3-Next's
  ``full_attention_interval``, Jamba's periods and offsets, DeepSeek's ``moe_layer_freq``, Gemma's
  ``sliding_window_pattern``).

A key that looks like a layer pattern but cannot be read is named in the layout's notes, which the analysis report
shows: the figures then rest on the default for those layers, and the report says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .config_loading import ConfigView

# Sequence mixers. "attention" is softmax attention with per-head K/V (MHA/GQA/MQA), "mla" DeepSeek's multi-head
# latent attention; recurrent mixers keep a fixed state per sequence: "linear_attention" MiniMax's lightning
# attention, "kda" Kimi Delta Attention (Kimi-Linear), "gated_delta_net" Qwen3-Next's Gated DeltaNet,
# "mamba"/"mamba2" selective state spaces.
MIXERS = ("attention", "mla", "linear_attention", "kda", "gated_delta_net", "mamba", "mamba2", "none")
RECURRENT_MIXERS = frozenset({"linear_attention", "kda", "gated_delta_net", "mamba", "mamba2"})
SOFTMAX_MIXERS = frozenset({"attention", "mla"})
# Attention windows: the KV cache of "sliding" and "chunked" layers stops growing at the window.
WINDOWS = ("full", "sliding", "chunked")
FFNS = ("dense", "moe", "moe+dense", "none")
# Releases whose index lists count layers from 1 when their values alone cannot tell (transformers'
# KimiLinearConfig: "types are 1-indexed in the checkpoint"; vLLM's is_kda_layer: (layer_idx + 1) in kda_layers).
ONE_BASED_MODEL_TYPES = frozenset({"kimi_linear"})
PERIOD_SUFFIXES = ("_interval", "_freq", "_frequency", "_period", "_step", "_pattern")
INDEX_SUFFIXES = ("_layers", "_layer_ids", "_layer_indices")


@dataclass(frozen=True)
class LayerKind:
    mixer: str
    window: str
    ffn: str
    # DeepSeek Sparse Attention: a lightning indexer picks index_topk keys per query (DeepSeek-V3.2).
    sparse: bool = False

    @property
    def attention(self) -> str:
        """The layer's attention kind in one word: full, sliding, chunked, mla, sparse mla, or its recurrent mixer."""
        if self.mixer in SOFTMAX_MIXERS:
            base = "mla" if self.mixer == "mla" else "attention"
            base = f"sparse {base}" if self.sparse else base
            return base if self.window == "full" else f"{self.window} {base}"
        return self.mixer

    @property
    def label(self) -> str:
        if self.mixer == "none":
            return f"{self.ffn} ffn"
        mixer = self.attention if self.mixer in SOFTMAX_MIXERS else self.mixer
        return f"{mixer} + {self.ffn} ffn" if self.ffn != "none" else mixer


@dataclass(frozen=True)
class Mlp:
    """One layer's feed-forward part: its dense MLP width and, for an MoE layer, its routed and shared experts."""

    dense_width: int = 0  # 0: no dense MLP in this layer
    experts: int = 0
    top_k: int = 0
    expert_width: int = 0
    shared_width: int = 0  # all shared experts together (n x width), 0 without

    def as_dict(self) -> dict:
        return {name: value for name, value in vars(self).items() if value}


@dataclass(frozen=True)
class Layout:
    layers: tuple[LayerKind, ...]
    notes: tuple[str, ...]
    mlps: tuple[Mlp, ...] = ()
    # The config keys the layout was read from (dotted), and the base of the index lists among them.
    pattern_keys: tuple[str, ...] = ()
    index_base: dict | None = None

    def counts(self) -> dict[str, int]:
        return dict(Counter(kind.label for kind in self.layers))

    @property
    def moe_layers(self) -> int:
        return sum(kind.ffn.startswith("moe") for kind in self.layers)

    @property
    def dense_layers(self) -> int:
        return sum(kind.ffn == "dense" for kind in self.layers)

    def indices(self, predicate) -> list[int]:
        return [index for index, kind in enumerate(self.layers) if predicate(kind)]

    def describe(self) -> dict:
        """The layout as the analysis report shows it: kinds with their layer ranges, keys read, notes."""
        kinds: dict[str, list[int]] = {}
        for index, kind in enumerate(self.layers):
            kinds.setdefault(kind.label, []).append(index)
        return {"kinds": {label: layer_ranges(indices) for label, indices in kinds.items()},
                "pattern_keys": list(self.pattern_keys), "index_base": self.index_base or None,
                "notes": list(self.notes)}


def layer_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7] -> '0-2,5,7'."""
    parts, start = [], indices[0]
    for previous, current in zip(indices, indices[1:] + [None], strict=True):
        if current != previous + 1:
            parts.append(f"{start}-{previous}" if previous != start else str(start))
            start = current
    return ",".join(parts)


# ---- finding the keys that describe layers ----------------------------------------------------------------------


@dataclass(frozen=True)
class PatternKey:
    """A config key that says something per layer. ``form``: "index_list" (layer numbers, ``base`` 0 or 1),
    "per_layer" (one entry per layer), "period" (an integer period), "string" (one character per layer)."""

    path: str
    form: str
    value: object
    base: int | None = None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Sections and keys that hold lists of other things (RoPE factors per frequency, token ids, vision towers).
NOT_LAYER_SECTIONS = ("rope", "quantization", "vision", "audio", "tokenizer", "generation")


def _walk(scope: dict, prefix: str = "", depth: int = 0):
    for key, value in scope.items():
        if not isinstance(key, str) or key == "architectures" or "token_id" in key:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            if depth < 4 and not any(word in key.lower() for word in NOT_LAYER_SECTIONS):
                yield from _walk(value, f"{path}.", depth + 1)
            continue
        yield path, key, value


def find_pattern_keys(view: ConfigView) -> list[PatternKey]:
    """Every key of the language config that describes layers one by one, whatever it is called and however deep
    it sits. Index lists get their base (0 or 1) from their values and their siblings (see ``_index_base``)."""
    layers = view.dim("num_layers")
    scope = view.scopes[0]
    found: list[PatternKey] = []
    for path, key, value in _walk(scope):
        name = key.lower()
        if name in ("num_hidden_layers", "num_layers", "n_layers", "n_layer", "max_window_layers",
                    "num_nextn_predict_layers", "num_mtp_layers", "first_k_dense_replace", "n_dense_layers"):
            continue
        if isinstance(value, str) and name.endswith("pattern") and len(value) == layers:
            found.append(PatternKey(path, "string", value))
        elif isinstance(value, list) and value and len(value) == layers and not name.endswith(INDEX_SUFFIXES):
            found.append(PatternKey(path, "per_layer", value))
        elif isinstance(value, list) and name.endswith(INDEX_SUFFIXES):
            if len(value) == layers and set(value) <= {0, 1} and layers > 2:
                found.append(PatternKey(path, "per_layer", value))  # flags per layer (Llama-4's no_rope_layers)
            else:
                found.append(PatternKey(path, "index_list", value))
        elif _is_int(value) and name.endswith(PERIOD_SUFFIXES):
            found.append(PatternKey(path, "period", value))
    return _with_bases(found, view)


def _with_bases(found: list[PatternKey], view: ConfigView) -> list[PatternKey]:
    groups: dict[str, list[PatternKey]] = {}
    for key in found:
        if key.form == "index_list":
            groups.setdefault(key.path.rpartition(".")[0], []).append(key)
    based = {}
    for parent, keys in groups.items():
        base = _index_base(keys, view, parent)
        based.update({key.path: base for key in keys})
    return [PatternKey(key.path, key.form, key.value, based.get(key.path)) if key.form == "index_list" else key
            for key in found]


def _index_base(keys: list[PatternKey], view: ConfigView, parent: str) -> int | None:
    """0 or 1 for index lists kept side by side; None when their values fit neither.

    Lists that together name every layer tell their base by themselves (0..L-1 or 1..L); so does a value of L
    (1-based) or of 0 (0-based). Otherwise the release's own convention decides (Kimi-Linear: 1-based), else 0,
    the Python convention transformers' own lists (``moe_layers``, ``mlp_only_layers``) use.
    """
    layers = view.dim("num_layers")
    values = [value for key in keys for value in key.value]
    if not all(_is_int(value) for value in values):
        return None
    union = set(values)
    if not union:
        return 0
    if union == set(range(layers)) or 0 in union and max(union) < layers:
        return 0
    if union == set(range(1, layers + 1)) or layers in union and min(union) >= 1:
        return 1 if max(union) <= layers else None
    if max(union) >= layers or min(union) < 0:
        return None
    return 1 if view.get("model_type") in ONE_BASED_MODEL_TYPES else 0


# ---- what a key's name and values mean ----------------------------------------------------------------------------


def _mamba_kind(view: ConfigView) -> str:
    # Mamba-2 configs carry a head count and groups (Dao & Gu 2024); Mamba-1 ones a dt rank (Gu & Dao 2023).
    return "mamba2" if view.dim("mamba_num_heads") or view.dim("mamba_n_groups") else "mamba"


def linear_kind(view: ConfigView) -> str:
    """Which recurrent mixer a config's "linear attention" layers are: Kimi Delta Attention (a linear_attn_config
    with KDA layers, Kimi-Linear), Gated DeltaNet (Qwen3-Next's linear_* head keys), else lightning attention."""
    sub = view.get("linear_attn_config")
    if isinstance(sub, dict) and ("kda_layers" in sub or str(view.get("model_type", default="")).startswith("kimi")):
        return "kda"
    if any(view.get(key) is not None for key in ("linear_num_value_heads", "linear_key_head_dim",
                                                  "linear_value_head_dim", "linear_num_key_heads")):
        return "gated_delta_net"
    return "linear_attention"


def _attention_mixer(view: ConfigView) -> str:
    return "mla" if view.dim("kv_lora_rank") else "attention"


def _sparse_attention(view: ConfigView) -> bool:
    """DeepSeek Sparse Attention: the config declares the lightning indexer (index_topk with its heads)."""
    return bool(view.dim("index_n_heads") and view.get("index_topk") is not None)


# A layer's (mixer, window, sparse) from a per-layer type name, or None for a name d0 does not know.
def _kind_of_type(name, view: ConfigView) -> tuple[str, str, bool] | None:
    if not isinstance(name, str):
        return None
    text = name.lower()
    attention = _attention_mixer(view)
    if text in ("full_attention", "attention", "global_attention", "global", "full", "softmax"):
        return attention, "full", False
    if text in ("sliding_attention", "sliding", "local_attention", "local", "swa"):
        return attention, "sliding", False
    if text in ("chunked_attention", "chunked"):
        return attention, "chunked", False
    if "sparse" in text or "dsa" in text or "indexed" in text:
        return attention, "full", True
    if text in ("linear_attention", "linear"):
        return linear_kind(view), "full", False
    if "kda" in text or "delta" in text and "kimi" in text:
        return "kda", "full", False
    if "gated_delta" in text or text == "gdn":
        return "gated_delta_net", "full", False
    if text in ("mamba", "mamba2", "ssm", "mamba1"):
        return ("mamba2" if text == "mamba2" else _mamba_kind(view)), "full", False
    return None


def _mixer_of_name(name: str, view: ConfigView) -> tuple[str, str, bool] | None:
    """What an index list's layers are, from its name: ``kda_layers``, ``full_attn_layers``, ``swa_layers``..."""
    text = name.lower().rsplit(".", 1)[-1]
    for suffix in INDEX_SUFFIXES:
        text = text.removesuffix(suffix)
    if "kda" in text:
        return "kda", "full", False
    if "mamba" in text or "ssm" in text:
        return _mamba_kind(view), "full", False
    if "delta" in text or "gdn" in text:
        return "gated_delta_net", "full", False
    if "linear" in text or "lightning" in text:
        return linear_kind(view), "full", False
    if "attn" in text or "attention" in text or text in ("global", "full", "softmax", "mla", "swa", "dsa"):
        return _kind_of_type(
            "sparse" if "sparse" in text or "dsa" in text or "index" in text else
            "sliding" if "sliding" in text or "swa" in text or "local" in text else
            "chunked" if "chunk" in text else "full", view)
    return None


def _ffn_of_name(name: str) -> str | None:
    text = name.lower().rsplit(".", 1)[-1]
    if "moe" in text or "expert" in text or "sparse" in text:
        return "moe"
    if "dense" in text or "mlp" in text:
        return "dense"
    return None


# Keys this module reads in its fixed rules below; anything else found by find_pattern_keys is read generically.
KNOWN_KEYS = frozenset({
    "hybrid_override_pattern", "layers_block_type", "attn_type_list", "layer_types", "mlp_layer_types",
    "moe_layers", "mlp_only_layers", "no_rope_layers", "attn_layer_period", "attn_layer_offset",
    "expert_layer_period", "expert_layer_offset", "moe_layer_freq", "moe_layer_frequency", "decoder_sparse_step",
    "interleave_moe_layer_step", "full_attention_interval", "sliding_window_pattern",
})
# Per-layer value lists ConfigView reads as dimensions (one value per layer), not as kinds.
PER_LAYER_DIMENSION_KEYS = frozenset({
    "moe_topk", "num_shared_expert", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
    "intermediate_size", "n_shared_experts", "num_shared_experts", "shared_expert_intermediate_size",
    "n_routed_experts", "num_local_experts", "moe_num_experts", "moe_top_k", "experts_per_token",
    "num_key_value_heads", "num_attention_heads", "head_dim", "rope_theta", "sliding_window",
})


# ---- the mixers ---------------------------------------------------------------------------------------------------


def _fixed_mixers(view: ConfigView, layers: int, hf_types: list | None,
                  notes: list[str], read: list[str]) -> list[tuple[str, str, bool]] | None:
    """Mixers from the keys whose meaning is fixed by the architecture that uses them, or None if none is set."""
    attention = _attention_mixer(view)
    full = (attention, "full", False)
    pattern = view.get("hybrid_override_pattern")
    if pattern is not None:
        read.append("hybrid_override_pattern")
        # Nemotron-H: M = Mamba-2 block, * = attention block, - = MLP block, E = MoE block; one mixer per block.
        mamba = (_mamba_kind(view), "full", False)
        return [{"M": mamba, "*": full}.get(char, ("none", "full", False)) for char in pattern]
    blocks = view.get("layers_block_type")
    if blocks is not None:
        read.append("layers_block_type")
        return [{"mamba": (_mamba_kind(view), "full", False), "attention": full}.get(block, ("none", "full", False))
                for block in blocks]
    period = view.dim("attn_layer_period")
    if period:
        read.append("attn_layer_period")
        offset = view.dim("attn_layer_offset", 0)
        return [full if index % period == offset else (_mamba_kind(view), "full", False) for index in range(layers)]
    kinds = view.get("attn_type_list")
    if kinds is not None:
        read.append("attn_type_list")
        # MiniMax-01/M1: 0 = lightning (linear) attention, 1 = softmax attention.
        return [full if kind == 1 else ("linear_attention", "full", False) for kind in kinds]
    types = view.get("layer_types")
    source = "layer_types"
    if types is None and hf_types is not None:
        types, source = hf_types, "transformers' resolved layer_types"
    if types is not None:
        read.append(source)
        result = []
        unknown = sorted({str(kind) for kind in types if _kind_of_type(kind, view) is None})
        if unknown:
            notes.append(f"{source} names layer types d0 cannot interpret ({', '.join(unknown)}); those layers are "
                         "counted as full attention (an upper bound for the KV cache)")
        for kind in types:
            result.append(_kind_of_type(kind, view) or full)
        return result
    interval = view.get("full_attention_interval")
    if _is_int(interval) and interval > 0:
        read.append("full_attention_interval")
        # Qwen3-Next: layer i is full attention when (i + 1) % interval == 0, linear (Gated DeltaNet) otherwise.
        linear = (linear_kind(view), "full", False)
        return [full if (index + 1) % interval == 0 else linear for index in range(layers)]
    return None


def _indexed_mixers(view: ConfigView, layers: int, keys: list[PatternKey], notes: list[str],
                    read: list[str]) -> list[tuple[str, str, bool]] | None:
    """Mixers from ``*_layers`` index lists at any depth (Kimi-Linear's linear_attn_config.kda_layers and
    full_attn_layers), or None when no such list names a mixer."""
    assigned: dict[int, tuple[str, str, bool]] = {}
    parents: set[str] = set()
    for key in keys:
        if key.form != "index_list" or key.path.rsplit(".", 1)[-1] in KNOWN_KEYS:
            continue
        mixer = _mixer_of_name(key.path, view)
        if mixer is None:
            continue
        if key.base is None:
            notes.append(f"{key.path} lists layers {_short(key.value)} that fit neither 0-based nor 1-based "
                         f"numbering of {layers} layers; it is not used")
            continue
        for value in key.value:
            index = value - key.base
            if index in assigned and assigned[index] != mixer:
                notes.append(f"{key.path} gives layer {index} a second mixer; the first one listed is kept")
                continue
            assigned[index] = mixer
        read.append(key.path)
        parents.add(key.path.rpartition(".")[0])
    if not assigned:
        return None
    kinds = set(assigned.values())
    rest = (_attention_mixer(view), "full", False)
    if len(assigned) < layers and all(mixer[0] in SOFTMAX_MIXERS for mixer in kinds) and any(
            "linear" in parent for parent in parents):
        # Only the softmax layers are listed inside a linear-attention section (some Kimi-Linear copies give
        # full_attn_layers alone): the others are that section's linear layers.
        rest = (linear_kind(view), "full", False)
    unlisted = layers - len(assigned)
    if unlisted and len(kinds) > 1 or unlisted and rest != (_attention_mixer(view), "full", False):
        notes.append(f"{unlisted} layers are in no index list ({', '.join(sorted(read))}); they are counted as "
                     f"{rest[0]}")
    return [assigned.get(index, rest) for index in range(layers)]


def _short(values) -> str:
    text = ", ".join(str(value) for value in list(values)[:8])
    return f"[{text}{', ...' if len(values) > 8 else ''}]"


def _windows(view: ConfigView, mixers: list[tuple[str, str, bool]], hf_layer_types: list | None,
             notes: list[str], read: list[str]) -> list[str]:
    layers = len(mixers)
    listed = [window for _, window, _ in mixers]
    if "layer_types" in read or "transformers' resolved layer_types" in read:
        return listed
    if hf_layer_types is not None and len(hf_layer_types) == layers and set(hf_layer_types) <= {
            "full_attention", "sliding_attention", "chunked_attention"}:
        # transformers fills layer_types from other keys (Qwen's use_sliding_window, Llama-4's no_rope_layers).
        return ["sliding" if kind == "sliding_attention" else "chunked" if kind == "chunked_attention" else "full"
                for kind in hf_layer_types]
    if any(window != "full" for window in listed):
        return listed
    window, chunk = view.dim("sliding_window"), view.dim("attention_chunk_size")
    if window and view.get("use_sliding_window") is not False:
        pattern = view.get("sliding_window_pattern")
        if _is_int(pattern) and pattern > 0:
            read.append("sliding_window_pattern")
            # Gemma-2/3, Cohere2: every pattern-th layer attends globally, the others within the window.
            return ["full" if (index + 1) % pattern == 0 else "sliding" for index in range(layers)]
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


# ---- the feed-forward parts ---------------------------------------------------------------------------------------


def _ffns(view: ConfigView, layers: int, keys: list[PatternKey], notes: list[str], read: list[str]) -> list[str]:
    pattern = view.get("hybrid_override_pattern")
    if pattern is not None:
        return ["dense" if char == "-" else "moe" if char == "E" else "none" for char in pattern]
    experts = view.dim("num_experts", 0)
    if not experts:
        return ["dense"] * layers
    moe = "moe+dense" if view.flag("use_residual") else "moe"
    per_layer_experts = view.per_layer_values("num_experts")
    if per_layer_experts is not None:
        # Hunyuan: an expert count per layer; a layer of one "expert" is a plain MLP.
        return [moe if count > 1 else "dense" for count in per_layer_experts]
    mlp_types = view.get("mlp_layer_types")
    if mlp_types is not None:
        read.append("mlp_layer_types")
        return [moe if kind in ("sparse", "moe") else "dense" for kind in mlp_types]
    explicit = view.get("moe_layers")
    if explicit is not None:
        read.append("moe_layers")
        return [moe if index in set(explicit) else "dense" for index in range(layers)]
    indexed = _indexed_ffns(keys, layers, moe, notes, read)
    if indexed is not None:
        return indexed
    first_dense = view.dim("first_dense_layers")
    if first_dense is not None or view.dim("moe_layer_freq"):
        # DeepSeek-V2/V3 modeling: MoE when layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0;
        # Hunyuan's moe_layer_num_skipped is the same first-dense count.
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


def _indexed_ffns(keys: list[PatternKey], layers: int, moe: str, notes: list[str], read: list[str]) -> list | None:
    """FFN kinds from ``*_layers`` index lists not read elsewhere (``dense_layers``, ``sparse_mlp_layers``...)."""
    result: list[str | None] = [None] * layers
    for key in keys:
        if key.form != "index_list" or key.path.rsplit(".", 1)[-1] in KNOWN_KEYS:
            continue
        if _mixer_of_name(key.path, _NO_VIEW) is not None:
            continue
        ffn = _ffn_of_name(key.path)
        if ffn is None or key.base is None:
            continue
        read.append(key.path)
        for value in key.value:
            result[value - key.base] = moe if ffn == "moe" else "dense"
    if all(kind is None for kind in result):
        return None
    listed = {kind for kind in result if kind is not None}
    other = "dense" if listed == {moe} else moe
    return [kind or other for kind in result]


class _NoView:
    """Stands in for a view when only a key's name is asked about (``_mixer_of_name`` on an FFN list)."""

    def dim(self, name, default=None):
        return default

    def get(self, *keys, default=None):
        return default


_NO_VIEW = _NoView()


def _mlps(view: ConfigView, ffns: list[str]) -> tuple[Mlp, ...]:
    """Each layer's MLP: widths, expert counts, top-k and shared experts, per layer where the config lists them."""
    hidden = view.dim("hidden_size")
    # Hunyuan: the shared MLP ("use_mixed_mlp_moe") is intermediate_size x num_shared_expert[layer] wide, beside
    # experts of moe_intermediate_size[layer] (vLLM hunyuan_v1.py, HunYuanSparseMoeBlock).
    hunyuan_shared = view.get("num_shared_expert") is not None
    mixed = view.get("use_mixed_mlp_moe")
    result = []
    for layer, ffn in enumerate(ffns):
        dense_width = view.dim("dense_intermediate_size") or view.layer_dim("intermediate_size", layer) or 4 * hidden
        if not ffn.startswith("moe"):
            result.append(Mlp(dense_width=dense_width if ffn == "dense" else 0))
            continue
        width = (view.layer_dim("moe_intermediate_size", layer) or view.layer_dim("intermediate_size", layer)
                 or 4 * hidden)
        count = view.layer_dim("num_shared_experts", layer, 0)
        if mixed is False:
            shared = 0
        elif hunyuan_shared:
            shared = count * (view.layer_dim("intermediate_size", layer) or width)
        else:
            shared = view.layer_dim("shared_expert_intermediate_size", layer) or count * width
        if not shared and view.dim("interleave_moe_layer_step"):
            # Llama-4's keys imply its shared expert: "each token is sent to the shared expert and also to one of
            # the 128 routed experts" (Meta, "The Llama 4 herd", 2025), of the experts' width.
            shared = width
        result.append(Mlp(dense_width=dense_width if ffn == "moe+dense" else 0,
                          experts=view.layer_dim("num_experts", layer, 0),
                          top_k=view.layer_dim("experts_per_token", layer, 0), expert_width=width,
                          shared_width=shared))
    return tuple(result)


# ---- the layout ---------------------------------------------------------------------------------------------------


def _uninterpreted(keys: list[PatternKey], read: list[str], view: ConfigView, said: list[str]) -> list[str]:
    """Pattern-like keys nothing above read: named, so the report shows what the layout may have missed (once:
    a key a note already names is left to it)."""
    notes = []
    for key in keys:
        leaf = key.path.rsplit(".", 1)[-1]
        if key.path in read or leaf in KNOWN_KEYS or leaf in PER_LAYER_DIMENSION_KEYS:
            continue
        if any(note.startswith(f"{key.path} ") for note in said):
            continue
        if key.form == "per_layer" and view.per_layer_values_of_alias(key.path) is not None:
            continue
        if key.form == "period" and leaf in ("attn_layer_offset", "expert_layer_offset"):
            continue
        what = (f"lists layers {_short(key.value)}" if key.form == "index_list" else
                f"= {key.value} looks like a layer period" if key.form == "period" else
                "gives one value per layer" if key.form == "per_layer" else "gives one character per layer")
        notes.append(f"{key.path} {what}, but d0 cannot tell what it changes; the layout ignores it")
    return notes


def layer_layout(view: ConfigView, hf_layer_types: list | None = None) -> Layout:
    """The kind of every decoder layer; ``hf_layer_types`` is transformers' resolved ``layer_types`` if any."""
    notes: list[str] = []
    read: list[str] = []
    layers = view.dim("num_layers")
    keys = find_pattern_keys(view)
    hf_types = hf_layer_types if hf_layer_types is not None and len(hf_layer_types) == layers else None
    mixers = (_fixed_mixers(view, layers, None, notes, read) or _indexed_mixers(view, layers, keys, notes, read)
              or _fixed_mixers(view, layers, hf_types, notes, read)
              or [(_attention_mixer(view), "full", False)] * layers)
    windows = _windows(view, mixers, hf_layer_types, notes, read)
    ffns = _ffns(view, layers, keys, notes, read)
    sparse_default = _sparse_attention(view)
    kinds = []
    for (mixer, _, sparse), window, ffn in zip(mixers, windows, ffns, strict=True):
        softmax = mixer in SOFTMAX_MIXERS
        # DeepSeek-V3.2 declares its indexer once for every MLA layer; a per-layer type list says it per layer.
        listed = "layer_types" in read or "transformers' resolved layer_types" in read
        kinds.append(LayerKind(mixer, window if softmax else "full", ffn,
                               softmax and (sparse or (sparse_default and not listed))))
    notes += _uninterpreted(keys, read, view, notes)
    bases = {key.path: key.base for key in keys if key.form == "index_list" and key.path in read}
    return Layout(tuple(kinds), tuple(notes), _mlps(view, ffns), tuple(dict.fromkeys(read)), bases or None)


# ---- for the reducer: a config with fewer layers ------------------------------------------------------------------


def one_layer_per_kind(layout: Layout) -> list[int]:
    """The first layer of every distinct kind (mixer, window, FFN, sparse indexer, MLP shape), ascending: the layers a
    reduced copy must keep to exercise every kind the release has (with ``remap_layer_keys``)."""
    first: dict = {}
    for index, kind in enumerate(layout.layers):
        mlp = layout.mlps[index] if layout.mlps else None
        first.setdefault((kind, mlp), index)
    return sorted(first.values())


def remap_layer_keys(config: dict, kept: list[int]) -> tuple[dict, list[str]]:
    """``config`` cut to the layers ``kept`` (indices of the full model, ascending): every per-layer list and string
    keeps those layers' entries and every index list, at any depth, is renumbered to the reduced depth in its own
    base (Kimi-Linear's 1-based ``full_attn_layers`` [4, 8, ...] with layers 0 and 3 kept become [2]). Periods cannot
    be renumbered: they are returned untouched, and named in the notes unless the kept layers are the first ones (a
    prefix reads a period the same way), for the caller to keep layers that respect them. The layer count itself
    is set under the key the config uses."""
    import copy

    view = ConfigView(config)
    layers = view.dim("num_layers")
    if not kept or sorted(set(kept)) != list(kept) or kept[0] < 0 or kept[-1] >= layers:
        raise ValueError(f"kept layers must be ascending indices below {layers}, got {kept}")
    position = {old: new for new, old in enumerate(kept)}
    result = copy.deepcopy(config)
    scope = result[view.language_key] if view.language_key else result
    notes = []
    for key in find_pattern_keys(view):
        parent, _, leaf = key.path.rpartition(".")
        holder = scope
        for part in parent.split(".") if parent else []:
            holder = holder[part]
        if key.form in ("per_layer", "string"):
            entries = [key.value[index] for index in kept]
            holder[leaf] = "".join(entries) if key.form == "string" else entries
        elif key.form == "index_list" and key.base is not None:
            holder[leaf] = [position[value - key.base] + key.base for value in key.value
                            if value - key.base in position]
        elif key.form == "index_list":
            notes.append(f"{key.path} could not be renumbered (its values fit neither base)")
        elif key.form == "period" and key.value != 1 and kept != list(range(len(kept))):
            # The first layers read a period the same way; any other pick must follow it.
            notes.append(f"{key.path} = {key.value} is a period: the kept layers must follow it")
    for alias in ("num_hidden_layers", "n_layers", "num_layers", "n_layer"):
        if alias in scope:
            scope[alias] = len(kept)
            break
    return result, notes
