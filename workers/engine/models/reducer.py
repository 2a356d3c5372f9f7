"""Shrink a model config to a tiny model that keeps every kind of layer the full model has.

Operator coverage depends on which code paths a model takes, not on its sizes: a DeepSeek-V3 with 2 heads, 8
experts and 2 layers calls the same operators as the 671B model as long as it still has a dense layer and an MoE
layer, MLA with the real head dims, and group-limited routing. So the reducer keeps:

- the head dims (what attention kernels care about), the GQA/MQA/MHA shape of the heads and divisibility
  (``num_attention_heads % num_key_value_heads == 0``);
- routing: experts >= top-k, and group-limited routing stays group-limited (n_group > 1, topk_group < n_group,
  at least 2 experts per group because the group score sums each group's top-2);
- every distinct decoder-layer kind (dense/MoE, sliding/full/chunked attention, Mamba/linear attention...): the
  layer count is cut to the first layer where the last new kind appears, after the dense prefix is shortened to 1;
- the relative order of the MLP widths (dense > expert stays dense > expert).

Kinds are read from the models themselves (the module classes under each layer plus its layer type), so the
check does not trust the rules above: the reduced model must show the same set of layer kinds and the same set of
module classes as the full model built on the meta device.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass, field

import torch

from .loading import (IGNORED_KEYS, build_meta_model, causal_lm_config, canonical_config, load_config,
                      text_config_dict)

VOCAB_SIZE = 512
# Shorter than the traced prompt, so sliding-window and chunked-attention masks really cut something.
SHORT_WINDOW = 4
LOW_RANK = {"kv_lora_rank": 32, "q_lora_rank": 48}
EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k")
# Every spelling of the key/value head count (Falcon's num_kv_heads, ChatGLM's multi_query_group_num, DBRX's
# attn_config.kv_n_heads), as model intake reads them (``config_loading.KEYS``).
KV_HEAD_KEYS = ("num_key_value_heads", "kv_n_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
# MLP widths, scaled to small multiples of 32 in the order of their full sizes (0 means "none" and stays 0).
INTERMEDIATE_KEYS = ("intermediate_size", "moe_intermediate_size", "intermediate_size_mlp",
                     "shared_expert_intermediate_size", "ffn_hidden_size")
DENSE_PREFIX_KEYS = ("first_k_dense_replace",)
MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_layers", "num_mtp_modules")
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# Per-layer lists that hold layer indices rather than one entry per layer.
LAYER_INDEX_KEYS = ("mlp_only_layers", "moe_layers")
# Attributes that make two layers with the same module classes behave differently.
KIND_ATTRIBUTES = ("layer_type", "attention_type", "is_sliding", "use_rope", "sliding_window")


@dataclass
class Reduction:
    """A reduced config and what was kept; ``config`` is a config.json dict of the text decoder."""

    config: dict
    full_layers: int
    layers: int
    layer_kinds: list[dict]
    invariants: list[str]
    notes: list[str] = field(default_factory=list)
    # The kinds of the one layer description (``layers.layer_layout``) the reduced model keeps, e.g. "mla + moe".
    layout_kinds: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"full_layers": self.full_layers, "layers": self.layers, "layer_kinds": self.layer_kinds,
                "layout_kinds": self.layout_kinds, "invariants": self.invariants, "notes": self.notes}


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder's list of layers: ``model.layers`` almost everywhere, ``transformer.blocks`` in DBRX."""
    count = causal_lm_config(model.config).num_hidden_layers
    candidates = [(name, module) for name, module in model.named_modules()
                  if isinstance(module, torch.nn.ModuleList) and len(module) == count]
    candidates.sort(key=lambda candidate: not candidate[0].endswith("layers"))
    if not candidates:
        raise ValueError(f"{type(model).__name__} has no list of {count} decoder layers")
    return candidates[0][1]


def layer_signature(layer, layer_type: str | None) -> tuple[str, ...]:
    """What makes a layer kind: its module classes by relative path, its layer type, and kind attributes."""
    parts = {f"layer_type={layer_type}"} if layer_type else set()
    for name, module in layer.named_modules():
        path = re.sub(r"\.\d+(?=\.|$)", ".N", name) or "."
        parts.add(f"{path}:{type(module).__name__}")
        for attribute in KIND_ATTRIBUTES:
            value = module.__dict__.get(attribute)
            if isinstance(value, bool | str):
                parts.add(f"{path}.{attribute}={value}")
            elif isinstance(value, int):
                # Only whether a window exists matters for the code path, not its size (which the reducer cuts).
                parts.add(f"{path}.{attribute}=set")
    return tuple(sorted(parts))


def layer_kinds(model) -> list[tuple[int, tuple[str, ...]]]:
    """Each distinct layer kind with the index of the first layer of that kind, in layer order."""
    text = causal_lm_config(model.config)
    layer_types = getattr(text, "layer_types", None) or []
    first: dict[tuple[str, ...], int] = {}
    for index, layer in enumerate(decoder_layers(model)):
        layer_type = layer_types[index] if index < len(layer_types) else None
        first.setdefault(layer_signature(layer, layer_type), index)
    return [(index, signature) for signature, index in first.items()]


def layout_kinds(config: dict, transformers_config) -> dict[tuple[str, str, str], int]:
    """Each distinct (mixer, window, ffn) of the config's layer description (``layers.layer_layout``) with the
    index of its first layer. The module classes cannot tell apart what only the config sets per layer (which
    layers a class builds as linear attention, which carry experts), so the reducer keeps both kinds."""
    from .config_loading import ConfigView
    from .layers import layer_layout

    layout = layer_layout(ConfigView(config), getattr(transformers_config, "layer_types", None))
    first: dict[tuple[str, str, str], int] = {}
    for index, kind in enumerate(layout.layers):
        first.setdefault((kind.mixer, kind.window, kind.ffn), index)
    return first


def _kind_text(kind: tuple[str, str, str]) -> str:
    mixer, window, ffn = kind
    return f"{mixer if window == 'full' else f'{window} {mixer}'} + {ffn}"


def describe_kind(index: int, signature: tuple[str, ...]) -> dict:
    layer_type = next((part.split("=", 1)[1] for part in signature if part.startswith("layer_type=")), None)
    classes = sorted({part.split(":", 1)[1] for part in signature if ":" in part and "=" not in part})
    return {"first_layer": index, "layer_type": layer_type, "classes": classes}


def module_classes(model) -> set[str]:
    return {type(module).__name__ for module in model.modules()}


def compare_module_classes(full_model, reduced_model) -> dict:
    """Whether the reduced model has exactly the module classes of the full one, and the difference if not."""
    full, reduced = module_classes(full_model), module_classes(reduced_model)
    return {"match": full == reduced, "missing_in_reduced": sorted(full - reduced),
            "extra_in_reduced": sorted(reduced - full), "classes": sorted(full)}


def _full_head_dim(text) -> int:
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def _int_attribute(full, key: str) -> int | None:
    """The full config's value for ``key``, whether the dict sets it or the config class defaults it."""
    value = getattr(full, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _set(reduced: dict, full, key: str, value) -> None:
    """Set ``key`` under the name the config class stores it (DBRX keeps ``hidden_size`` as ``d_model``)."""
    attribute_map = getattr(full, "attribute_map", {})
    name = attribute_map.get(key, key)
    reduced[name] = value
    # A dict that spells the attribute both ways (Qwen3-MoE stores num_experts as num_local_experts) keeps one
    # value: the layer description reads the dict and refuses two spellings that disagree.
    for alias, target in attribute_map.items():
        if target == name and alias in reduced:
            reduced[alias] = value


def _with_subconfigs(reduced: dict, full) -> list[tuple[dict, object]]:
    """The config dict with its full config, then each sub-config dict with its own (DBRX keeps KV heads and
    expert sizes in ``attn_config`` / ``ffn_config``)."""
    from transformers import PretrainedConfig

    pairs = [(reduced, full)]
    for key, value in reduced.items():
        if isinstance(value, dict) and isinstance(getattr(full, key, None), PretrainedConfig):
            pairs.append((value, getattr(full, key)))
    return pairs


def _reduce_heads(reduced: dict, full) -> None:
    heads = full.num_attention_heads
    kv_heads = next((value for key in KV_HEAD_KEYS if (value := _int_attribute(full, key))), heads)
    group = heads // kv_heads
    # 1 KV head stays MQA; otherwise 2 KV heads, and grouped-query attention keeps a group of 2 (MHA stays MHA).
    reduced_kv = 1 if kv_heads == 1 else 2
    reduced_heads = reduced_kv * min(group, 2)
    _set(reduced, full, "num_attention_heads", reduced_heads)
    _set_kv_heads(reduced, full, reduced_kv)
    # Sized so that hidden_size / heads is the real head dim wherever a config derives head_dim from it.
    _set(reduced, full, "hidden_size", reduced_heads * _full_head_dim(full))


def _set_kv_heads(reduced: dict, full, kv_heads: int) -> None:
    """Set the key/value head count under every spelling the config or its class has. One left at the full count
    (Falcon's num_kv_heads beside a num_key_value_heads the class ignores) gives the fused QKV projection more KV
    heads than query heads, and a tensor-parallel run a split of size 0."""
    for part, part_full in _with_subconfigs(reduced, full):
        keys = [key for key in KV_HEAD_KEYS if key in part or _int_attribute(part_full, key)]
        for key in keys or (KV_HEAD_KEYS[:1] if part is reduced else []):
            _set(part, part_full, key, kv_heads)


def _reduce_experts(reduced: dict, full, notes: list[str]) -> None:
    experts = {key: _int_attribute(full, key) for key in EXPERT_COUNT_KEYS if _int_attribute(full, key)}
    if not experts:
        return
    top_k = max((value for key in TOP_K_KEYS if (value := _int_attribute(full, key))), default=1)
    reduced_top_k = min(top_k, 2)
    groups, topk_group = _int_attribute(full, "n_group") or 1, _int_attribute(full, "topk_group") or 1
    if groups > 1:
        # Group-limited routing stays group-limited (topk_group < n_group) when it was, with 4 experts per group.
        reduced["n_group"] = 2
        reduced["topk_group"] = 1 if topk_group < groups else 2
        reduced_experts = 8
        notes.append(f"routing groups {groups}/{topk_group} -> {reduced['n_group']}/{reduced['topk_group']}")
    else:
        reduced_experts = min(max(experts.values()), max(4, 2 * reduced_top_k))
    for key in experts:
        _set(reduced, full, key, reduced_experts)
    for key in TOP_K_KEYS:
        if _int_attribute(full, key):
            _set(reduced, full, key, reduced_top_k)
    if _int_attribute(full, "n_shared_experts"):
        reduced["n_shared_experts"] = 1


def _reduce_widths(reduced: dict, full, *, keep_latent_ranks: bool = False) -> None:
    widths = {key: _int_attribute(full, key) for key in INTERMEDIATE_KEYS if _int_attribute(full, key)}
    small = {width: 32 * (rank + 1) for rank, width in enumerate(sorted(set(widths.values())))}
    for key, width in widths.items():
        _set(reduced, full, key, small[width])
    for key, rank in LOW_RANK.items():
        if _int_attribute(full, key) and not keep_latent_ranks:
            reduced[key] = rank
    linear = reduced.get("linear_attn_config")
    if isinstance(linear, dict) and isinstance(linear.get("num_heads"), int):
        # Kimi-Linear's KDA heads keep their head dim; 4 heads still split over tp 2 and 4.
        linear["num_heads"] = min(linear["num_heads"], 4)
    if _int_attribute(full, "mamba_dt_rank"):
        reduced["mamba_dt_rank"] = 8
    if _int_attribute(full, "mamba_num_heads"):
        # Mamba-2 width is heads x head dim; the heads are split into n_groups groups, which must divide them.
        reduced["mamba_num_heads"] = min(full.mamba_num_heads, 8)
        if _int_attribute(full, "n_groups"):
            reduced["n_groups"] = min(full.n_groups, 2)


def _reduce_vocab(reduced: dict, full) -> None:
    reduced["vocab_size"] = VOCAB_SIZE

    def clamp(token_id):
        if isinstance(token_id, list):
            return [clamp(one) for one in token_id]
        return min(token_id, VOCAB_SIZE - 1) if isinstance(token_id, int) else token_id

    for key in TOKEN_ID_KEYS:
        if getattr(full, key, None) is not None:
            reduced[key] = clamp(getattr(full, key))


def _cap(reduced: dict, full, keys: tuple[str, ...], most: int) -> None:
    for key in keys:
        if (value := _int_attribute(full, key)) is not None:
            _set(reduced, full, key, min(value, most))


def _cut_layers(reduced: dict, layers: int) -> tuple[dict, list[str]]:
    """The first ``layers`` layers, every per-layer key following at any depth (``layers.remap_layer_keys``: index
    lists renumbered in their own base, per-layer lists and strings sliced; periods read the same on a prefix)."""
    from .layers import remap_layer_keys

    return remap_layer_keys(reduced, list(range(layers)))


def _invariants(full, reduced) -> tuple[list[str], list[str]]:
    """The architecture rules the reduced config must keep: (the rules checked, the ones broken)."""
    checks = []

    def rule(name: str, holds: bool) -> None:
        checks.append((name, holds))

    kv_heads = next((value for key in KV_HEAD_KEYS if (value := _int_attribute(reduced, key))), 1)
    rule("num_attention_heads % num_key_value_heads == 0", reduced.num_attention_heads % kv_heads == 0)
    if getattr(full, "head_dim", None) is not None:
        rule("head_dim unchanged", reduced.head_dim == full.head_dim)
    if getattr(full, "qk_rope_head_dim", None) is not None and full.head_dim == full.qk_rope_head_dim:
        # transformers' DeepSeek-V3 derives head_dim from the rope part of MLA (Kimi-Linear's keeps its own).
        rule("head_dim == qk_rope_head_dim", reduced.head_dim == reduced.qk_rope_head_dim)
    experts = next((getattr(reduced, key) for key in EXPERT_COUNT_KEYS if isinstance(getattr(reduced, key, None), int)),
                   None)
    top_k = next((getattr(reduced, key) for key in TOP_K_KEYS if isinstance(getattr(reduced, key, None), int)), None)
    if experts is not None and top_k is not None:
        rule("experts >= top-k", experts >= top_k)
    if (getattr(full, "n_group", None) or 1) > 1:
        per_group = experts // reduced.n_group
        rule("experts % n_group == 0", experts % reduced.n_group == 0)
        rule("2 <= experts per group", per_group >= 2)
        rule("topk_group < n_group as in the full model",
             (reduced.topk_group < reduced.n_group) == (full.topk_group < full.n_group))
        rule("top-k <= topk_group * experts per group", top_k <= reduced.topk_group * per_group)
    for key in ("interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq"):
        if getattr(full, key, None) is not None:
            rule(f"{key} unchanged", getattr(reduced, key) == getattr(full, key))
    for key in DENSE_PREFIX_KEYS:
        if getattr(full, key, None) is not None:
            rule(f"{key} > 0 as in the full model", (getattr(reduced, key) > 0) == (getattr(full, key) > 0))
    if _int_attribute(reduced, "mamba_num_heads") and _int_attribute(reduced, "n_groups"):
        rule("mamba_num_heads % n_groups == 0", reduced.mamba_num_heads % reduced.n_groups == 0)
    if getattr(reduced, "layer_types", None) is not None:
        rule("len(layer_types) == num_hidden_layers", len(reduced.layer_types) == reduced.num_hidden_layers)
    return [name for name, _ in checks], [name for name, holds in checks if not holds]


def _mtp_note(config: dict, full_model) -> str | None:
    declared = max((config[key] for key in MTP_KEYS if isinstance(config.get(key), int)), default=0)
    if declared and not any("mtp" in name or "nextn" in name for name, _ in full_model.named_modules()):
        return (f"{declared} MTP layer(s) declared, not built by transformers' {type(full_model).__name__}; "
                "an MTP layer is a decoder layer plus a projection, so its operators are traced with the layers")
    return None


PERIOD_KEY_ENDINGS = ("_layer_period", "_layer_offset")


def _period_pairs(config: dict) -> list[tuple[str, str]]:
    """(period key, offset key) pairs of a config whose layer kinds repeat by period (Jamba's attn_layer_* and
    expert_layer_*: layer i has the feature when i % period == offset)."""
    pairs = []
    for key, value in config.items():
        if key.endswith("_layer_period") and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            offset_key = key[:-len("period")] + "offset"
            if isinstance(config.get(offset_key), int) and not isinstance(config[offset_key], bool):
                pairs.append((key, offset_key))
    return pairs


def _with_short_periods(config: dict, layers: int) -> tuple[dict, int] | None:
    """``config`` with the shortest periods and offsets whose first layers show every combination of features
    the full ``layers`` show (and no other), with that many layers; None when the periods are already that short
    (or the config has none)."""
    pairs = _period_pairs(config)

    def seen(settings, depth):
        return {tuple(index % period == offset for period, offset in settings) for index in range(depth)}

    def depth_needed(settings, upto):  # layers until every wanted combination has appeared
        return next(depth for depth in range(1, upto + 1) if seen(settings, depth) == wanted)

    given = [(config[period], config[offset]) for period, offset in pairs]
    wanted = seen(given, layers)
    now = depth_needed(given, layers)
    choices = [(period, offset) for period in range(1, 5) for offset in range(period)]
    for depth in range(len(wanted), now):
        for settings in itertools.product(choices, repeat=len(pairs)):
            if seen(settings, depth) == wanted:
                shortened = dict(config)
                for (period_key, offset_key), (period, offset) in zip(pairs, settings, strict=True):
                    shortened[period_key], shortened[offset_key] = period, offset
                return shortened, depth
    return None


def reduce_config(config: dict, full_model=None, *, keep_latent_ranks: bool = False) -> Reduction:
    """The tiny config that keeps every layer kind, divisibility rule and architecture invariant of ``config``.

    ``full_model`` is the full model on the meta device when the caller built it already (it is built otherwise).
    A config no transformers class fits is reduced as d0's generic decoder of its shape, and the notes say so.
    ``keep_latent_ranks`` keeps MLA's kv_lora_rank / q_lora_rank as released: a serving engine's kernels accept
    only the head dims they were built for (vLLM's MLA refuses a latent of 32 + 64).
    Raises ValueError if the result breaks an invariant or loses a layer kind, which would be a reducer bug.
    """
    config, generic_note = canonical_config(config)
    full = causal_lm_config(load_config(config))
    if full_model is None:
        full_model = build_meta_model(full)
    full_layers = full.num_hidden_layers
    full_kinds = layer_kinds(full_model)
    full_layout = layout_kinds(text_config_dict(config), full)

    reduced = {key: value for key, value in copy.deepcopy(text_config_dict(config)).items()
               if key not in IGNORED_KEYS}
    notes: list[str] = [generic_note] if generic_note else []
    quantization = config.get("quantization_config") or text_config_dict(config).get("quantization_config")
    if isinstance(quantization, dict):
        notes.append(f"quantization_config ({quantization.get('quant_method', 'unknown')}) not applied: the trace "
                     "runs random weights in the requested dtype; float8 support is checked as a mechanism")
    _reduce_heads(reduced, full)
    for part, part_full in _with_subconfigs(reduced, full):
        _reduce_experts(part, part_full, notes)
        _reduce_widths(part, part_full, keep_latent_ranks=keep_latent_ranks)
    _reduce_vocab(reduced, full)
    _cap(reduced, full, DENSE_PREFIX_KEYS + MTP_KEYS, 1)
    _cap(reduced, full, ("sliding_window", "attention_chunk_size"), SHORT_WINDOW)
    if note := _mtp_note(config, full_model):
        notes.append(note)

    full_signatures = {signature for _, signature in full_kinds}
    # Layer kinds set by periods (Jamba: attention every 8th layer from the 4th, experts every 2nd from the 1st)
    # first appear late (5 layers for 3 kinds); the same kinds with the shortest periods take fewer layers, and each
    # Mamba layer less is a large part of a compile check. Kept only if the model still has every kind.
    shortened = _with_short_periods(reduced, full_layers)
    for candidate, depth in ([shortened] if shortened else []) + [(reduced, None)]:
        if depth is None:
            # Tiny widths at full depth show where each layer kind first appears once the dense prefix is shortened.
            tiny_config = load_config(candidate)
            tiny_full_depth = build_meta_model(tiny_config)
            depth = max(max(index for index, _ in layer_kinds(tiny_full_depth)),
                        max(layout_kinds(candidate, causal_lm_config(tiny_config)).values())) + 1
        cut, cut_notes = _cut_layers(candidate, depth)
        _set(cut, full, "num_hidden_layers", depth)
        reduced_config = causal_lm_config(load_config(cut))
        reduced_kinds = layer_kinds(build_meta_model(reduced_config))
        reduced_layout = layout_kinds(cut, reduced_config)
        if {signature for _, signature in reduced_kinds} == full_signatures and reduced_layout.keys() == \
                full_layout.keys():
            notes += cut_notes
            if candidate is not reduced:
                notes.append("layer periods shortened: " + ", ".join(
                    f"{key} {reduced[key]} -> {candidate[key]}" for key in sorted(candidate)
                    if key.endswith(PERIOD_KEY_ENDINGS) and candidate[key] != reduced[key]))
            reduced, layers = cut, depth
            break
    else:
        lost = [_kind_text(kind) for kind in full_layout if kind not in reduced_layout]
        raise ValueError(f"the reduced {config.get('model_type')} lost a layer kind: "
                         + (f"no {', '.join(lost)} layer" if lost else
                            f"{len(reduced_kinds)} module kinds instead of {len(full_kinds)}"))
    checked, broken = _invariants(full, reduced_config)
    if broken:
        raise ValueError(f"the reduced {config.get('model_type')} breaks {', '.join(broken)}")
    if layers < full_layers:
        notes.append(f"{full_layers} layers -> {layers}")
    return Reduction(config=reduced, full_layers=full_layers, layers=layers,
                     layer_kinds=[describe_kind(index, signature) for index, signature in full_kinds],
                     invariants=checked, notes=notes, layout_kinds=[_kind_text(kind) for kind in full_layout])


def parameter_count(model) -> int:
    return sum(math.prod(parameter.shape) for parameter in model.parameters())


def deepen(reduced: dict, full, layers: int) -> None:
    """Repeat a reduced model's first layer kind to ``layers`` layers, per-layer lists included (a model of one
    layer kind reduces to one layer; a benchmark or a pipeline of several stages needs more)."""
    current = _int_attribute(causal_lm_config(load_config(reduced)), "num_hidden_layers")
    for key, value in list(reduced.items()):
        if isinstance(value, list | str) and len(value) == current and key not in TOKEN_ID_KEYS + LAYER_INDEX_KEYS:
            reduced[key] = value[:1] * layers
    _set(reduced, full, "num_hidden_layers", layers)


# A sharded validation run keeps its reduced model small: the reference runs in fp32 next to the ranks.
MAX_LAYOUT_MODEL_BYTES = 256 * 2**20


def _scale_heads(reduced: dict, full, factor: int) -> None:
    """Multiply the reduced model's query and key/value heads by ``factor``, keeping the head dim."""
    text = causal_lm_config(load_config(reduced))
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    _set(reduced, full, "num_attention_heads", heads * factor)
    _set_kv_heads(reduced, full, kv_heads * factor)
    _set(reduced, full, "hidden_size", heads * factor * _full_head_dim(full))


def _expert_counts(part: dict, part_full) -> dict[str, int]:
    return {key: value for key in EXPERT_COUNT_KEYS
            if isinstance(value := part.get(getattr(part_full, "attribute_map", {}).get(key, key)), int)}


def _expert_count(reduced: dict, full) -> int | None:
    return next((max(counts.values()) for part, part_full in _with_subconfigs(reduced, full)
                 if (counts := _expert_counts(part, part_full))), None)


def _scale_experts(reduced: dict, full, ep: int) -> int | None:
    """Make the routed experts a multiple of ``ep`` (and of the routing groups) with every EP rank holding experts of
    its own: at least one, and two where a token picks two or more (top-k >= 2), so that a rank receives tokens for
    different experts of its block and the block's local numbering is exercised. Returns the new count."""
    for part, part_full in _with_subconfigs(reduced, full):
        counts = _expert_counts(part, part_full)
        if not counts:
            continue
        experts = max(counts.values())
        top_k = max((value for key in TOP_K_KEYS if isinstance(value := part.get(key), int)), default=1)
        step = math.lcm(ep, part.get("n_group") or 1)
        least = max(experts, top_k, ep * min(top_k, 2))
        wanted = -(-least // step) * step
        if wanted != experts:
            for key in counts:
                _set(part, part_full, key, wanted)
        return wanted
    return None


def reduce_for_layout(config: dict, *, tp: int = 1, pp: int = 1, ep: int = 1) -> Reduction:
    """``reduce_config``, then what a tp x pp x ep layout needs of the reduced model: query and key/value heads
    divisible by tp (scaled together, so grouped-query attention keeps its group), routed experts divisible by ep
    (and by the routing groups), at least pp layers. Raises ValueError when the result breaks an invariant or
    would weigh more than ``MAX_LAYOUT_MODEL_BYTES`` in fp32."""
    reduction = reduce_config(config)
    reduced = copy.deepcopy(reduction.config)
    full = causal_lm_config(load_config(canonical_config(config)[0]))
    notes = list(reduction.notes)
    text = causal_lm_config(load_config(reduced))
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    factor = next(f for f in range(1, tp + 1) if heads * f % tp == 0 and kv_heads * f % tp == 0)
    if factor > 1:
        _scale_heads(reduced, full, factor)
        notes.append(f"heads {heads}/{kv_heads} (query/key-value) x{factor}, so that tp={tp} splits them")
    if ep > 1:
        before = _expert_count(reduced, full)
        if before is None:
            raise ValueError(f"ep={ep} needs routed experts; the {config.get('model_type')} config has none")
        experts = _scale_experts(reduced, full, ep)
        if experts != before:
            notes.append(f"routed experts {before} -> {experts}, so that each of the ep={ep} ranks holds "
                         f"{experts // ep} of its own")
    layers = _int_attribute(causal_lm_config(load_config(reduced)), "num_hidden_layers")
    if layers < pp:
        deepen(reduced, full, pp)
        notes.append(f"one layer kind: its layer repeated to {pp} layers for pp={pp}")
    reduced_config = causal_lm_config(load_config(reduced))
    checked, broken = _invariants(full, reduced_config)
    if broken:
        raise ValueError(f"the {config.get('model_type')} reduced for tp={tp} pp={pp} ep={ep} breaks "
                         f"{', '.join(broken)}")
    size = parameter_count(build_meta_model(reduced_config)) * 4
    if size > MAX_LAYOUT_MODEL_BYTES:
        raise ValueError(f"the reduced {config.get('model_type')} would take {size / 2**20:.0f} MiB in fp32; "
                         f"a validation model is kept under {MAX_LAYOUT_MODEL_BYTES / 2**20:.0f} MiB")
    return Reduction(config=reduced, full_layers=reduction.full_layers,
                     layers=_int_attribute(reduced_config, "num_hidden_layers"), layer_kinds=reduction.layer_kinds,
                     invariants=checked, notes=notes)
