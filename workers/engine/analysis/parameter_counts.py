"""Parameter counts: the exact inventory of a transformers model built on the meta device, and the summary
(total, active per token, per component, per layer kind, MTP) that the generic estimate shares.

The meta device gives every tensor a shape and no storage. transformers 5 stores the routed experts of a layer as
one fused 3-D tensor, so even Kimi-K2 (1T parameters, 61 layers x 384 experts) is ~1.2k modules and builds in
~0.1 s once its modeling module is imported (benchmarks/analyze_speed.py, "warm"). Building every layer is then
no slower than building one layer of each kind and multiplying, and it is exact by construction, so the whole
model is built.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..models.config_loading import KEYS_BY_NAME, ConfigError, ConfigView
from ..models.layers import Layout, layer_ranges

if TYPE_CHECKING:
    from .memory import Precision

COMPONENTS = ("embeddings", "attention", "ssm", "dense_mlp", "routed_experts", "shared_experts", "router", "norms",
              "lm_head", "other")
SHARED_EXPERT_MODULES = frozenset({"shared_experts", "shared_expert", "shared_expert_gate", "shared_mlp"})
ROUTER_MODULES = frozenset({"gate", "router"})
MLP_MODULES = frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe"})
LAYER_INDEX = re.compile(r"\.(?:layers|blocks|h)\.(\d+)\.")


@dataclass(frozen=True)
class TensorRecord:
    name: str
    component: str
    shape: tuple[int, ...]
    layer: int | None
    # A weight matrix of a linear map (or a fused stack of expert matrices): what weight quantization compresses.
    matrix: bool
    # The precision the release stores this tensor in (shipped.py fills it from the release's quantization_config).
    shipped: Precision | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _component(segments: list[str], chain: list) -> str:
    """The component a parameter belongs to, from the names and classes of the modules that hold it.

    Expert, shared-expert and router modules claim everything below them; otherwise the nearest enclosing
    module decides, so the MLP of a Jamba "MambaDecoderLayer" is an MLP and not part of the Mamba mixer.
    """
    import torch.nn as nn

    owner = chain[-1] if chain else None
    if isinstance(owner, nn.Embedding):
        return "embeddings"
    if SHARED_EXPERT_MODULES & set(segments):
        return "shared_experts"
    if "experts" in segments:
        return "routed_experts"
    if owner is not None and "Norm" in type(owner).__name__:
        return "norms"
    for segment, module in zip(reversed(segments), reversed(chain), strict=True):
        name = type(module).__name__
        if segment in ROUTER_MODULES or name.endswith("Router"):
            return "router"
        if "Mamba" in name:
            return "ssm"
        if "Attention" in name:
            return "attention"
        if segment in MLP_MODULES or "MLP" in name or "FeedForward" in name:
            return "dense_mlp"
    return "other"


def inventory_from_model(model) -> list[TensorRecord]:
    """Every parameter of a built model, classified. ``named_parameters`` yields a tied weight once."""
    import torch.nn as nn

    modules = dict(model.named_modules())
    output = model.get_output_embeddings()
    output_weight = getattr(output, "weight", None)
    records = []
    for name, parameter in model.named_parameters():
        owner_path = name.rpartition(".")[0]
        segments = owner_path.split(".") if owner_path else []
        chain = [modules[".".join(segments[:depth])] for depth in range(1, len(segments) + 1)]
        owner = chain[-1] if chain else model
        component = _component(segments, chain)
        if parameter is output_weight and component != "embeddings":
            # A tied table is reached first through the input embedding and stays "embeddings".
            component = "lm_head"
        match = LAYER_INDEX.search(f".{name}")
        is_matrix = (isinstance(owner, nn.Linear) and name.endswith("weight")) or (
            component == "routed_experts" and parameter.dim() >= 2 and not name.endswith("bias"))
        records.append(TensorRecord(name, component, tuple(parameter.shape), int(match.group(1)) if match else None,
                                    is_matrix))
    return records


def mtp_records(records: list[TensorRecord], view: ConfigView, layers: int) -> list[TensorRecord]:
    """The extra weights of DeepSeek-style multi-token-prediction modules, which the main model does not build.

    DeepSeek-V3 report, section 2.2: module k has its own transformer block, RMSNorms on the incoming hidden state
    and token embedding, and a projection M_k (d x 2d); embedding and output head are shared with the main model.
    The checkpoint stores one more norm (shared_head.norm), and transformers' MtpLayer builds the same four pieces.
    The block is the main model's last layer (an MoE layer for DeepSeek and GLM).
    """
    count = view.dim("mtp_layers", 0)
    last = layers - 1
    block = [record for record in records if record.layer == last]
    if not count or not block:
        return []
    hidden = view.dim("hidden_size")
    norm = sum(record.numel for record in records if record.layer is None and record.component == "norms") or hidden
    extra = []
    for module in range(count):
        prefix = f"mtp.{module}."
        extra += [TensorRecord(prefix + record.name.split(f".{last}.", 1)[-1], record.component, record.shape,
                               None, record.matrix) for record in block]
        extra.append(TensorRecord(prefix + "eh_proj.weight", "mtp_projection", (hidden, 2 * hidden), None, True))
        extra += [TensorRecord(prefix + f"{name}.weight", "norms", (norm,), None, False)
                  for name in ("enorm", "hnorm", "shared_head.norm")]
    return extra


def _layer_fraction(view: ConfigView, layer: int | None) -> float:
    """The share of a layer's routed-expert parameters one token uses: top-k of E (every expert of a layer has
    the same shape)."""
    experts, top_k = view.layer_dim("num_experts", layer, 0), view.layer_dim("experts_per_token", layer, 0)
    return top_k / experts if experts else 1.0


def components_of(records: list[TensorRecord]) -> dict[str, int]:
    totals = dict.fromkeys(COMPONENTS, 0)
    for record in records:
        totals[record.component] = totals.get(record.component, 0) + record.numel
    return totals


def active_count(records: list[TensorRecord], view: ConfigView) -> int:
    """Parameters one token uses: all of them but the routed experts it is not sent to.

    Every routed expert of a layer has the same shape, so the selected top-k of E experts hold exactly k/E of
    the layer's routed-expert parameters (biases included).
    """
    routed_records = [record for record in records if record.component == "routed_experts"]
    routed = sum(record.numel for record in routed_records)
    if routed and not view.dim("experts_per_token"):
        # Without top-k the routed experts would count as unused by every token: a silently wrong active count.
        spellings = ", ".join(KEYS_BY_NAME["experts_per_token"].aliases
                              + view.architecture_aliases.get("experts_per_token", ()))
        raise ConfigError(f"the model has routed experts ({view.dim('num_experts', 0)} per MoE layer) but the config "
                          f"gives no experts-per-token d0 can read (looked for {spellings})")
    total = sum(record.numel for record in records)
    # Per layer: a config may give each layer its own expert count and top-k (Hunyuan's lists).
    used = sum(record.numel * _layer_fraction(view, record.layer) for record in routed_records)
    return total - routed + round(used)


def summarise(records: list[TensorRecord], mtp: list[TensorRecord], view: ConfigView, layout: Layout,
              tied: bool) -> dict:
    """Totals, per-component counts, active counts under the published conventions, layer kinds and MTP."""
    components = components_of(records)
    total = sum(components.values())
    active = active_count(records, view)
    embeddings = components["embeddings"]
    lm_head = components["lm_head"]
    # A tied matrix is also the output head, which every token uses in full; only untied input tables are
    # "lookup only" (one row read per token).
    input_only = 0 if tied else embeddings
    return {
        "total_params": total,
        "active_params": active,
        "components": {**components, "mtp": sum(record.numel for record in mtp)},
        "active_params_by_convention": {
            "all_used_weights": active,
            "excluding_input_embedding": active - input_only,
            "excluding_embeddings_and_lm_head": active - embeddings - lm_head,
        },
        "non_embedding_params": total - embeddings - lm_head,
        "layer_kinds": _layer_kinds(records, layout),
        "mtp": _mtp_summary(mtp, view, embeddings + (lm_head or embeddings)),
    }


def _layer_kinds(records: list[TensorRecord], layout: Layout) -> list[dict]:
    per_layer: dict[int, int] = {}
    for record in records:
        if record.layer is not None:
            per_layer[record.layer] = per_layer.get(record.layer, 0) + record.numel
    kinds: dict[tuple[str, int], dict] = {}
    for index, kind in enumerate(layout.layers):
        params = per_layer.get(index, 0)
        entry = kinds.setdefault((kind.label, params), {"kind": kind.label, "params_per_layer": params, "layers": []})
        entry["layers"].append(index)
    result = []
    for entry in kinds.values():
        entry["count"] = len(entry["layers"])
        entry["layers"] = layer_ranges(entry["layers"])
        result.append(entry)
    return result


def _mtp_summary(mtp: list[TensorRecord], view: ConfigView, shared_embedding_and_head: int) -> dict:
    declared, other = view.dim("mtp_layers", 0), view.dim("mtp_modules_other", 0)
    if not declared and other:
        return {"layers": other, "params": None, "counted_in_total": False,
                "convention": "the config declares MTP modules (num_mtp_modules) without describing their "
                              "structure; they are not counted"}
    if not declared:
        return {"layers": 0, "params": 0, "counted_in_total": False}
    unique = sum(record.numel for record in mtp)
    routed = sum(record.numel for record in mtp if record.component == "routed_experts")
    return {
        "layers": declared,
        "params": unique,
        # An MTP module copies the last decoder layer, so it routes like that layer.
        "active_params": unique - routed + round(routed * _layer_fraction(view, view.dim("num_layers") - 1)),
        "params_as_stored": unique + declared * shared_embedding_and_head,
        "counted_in_total": False,
        "convention": "params: the MTP modules' own weights (a copy of the last decoder layer, the 2d x d "
                      "projection and three RMSNorms per module; DeepSeek-V3 report section 2.2); "
                      "params_as_stored adds the embedding and output head that the checkpoint stores again "
                      "for each module (DeepSeek: 671B main + 14B MTP = the 685B on Hugging Face)",
    }
