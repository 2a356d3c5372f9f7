"""Tensor parallelism driven by the model's own plan (``model.tp_plan``, declared by transformers per architecture).

The split is done here by hand instead of with transformers' ``tp_plan="auto"`` / DTensor: every collective the
sharded model issues then goes through ``CollectiveMeter`` (so it is timed and counted), a fault can mis-split one
shard on purpose, and the same code runs on gloo and nccl. The meaning of each style is transformers':

- ``colwise``: output features split (weight rows, bias); the next module consumes the local part.
- ``rowwise``: input features split (weight columns); partial outputs are summed with all_reduce. On a 3-D
  experts parameter the sum is left to the experts module (``moe_tp_experts``).
- ``packed_colwise``: a fused [gate; up] projection, split per part so each rank keeps matching gate and up rows.
- ``moe_tp_experts``: the experts module's output is a partial sum over the intermediate split: all_reduce.
- ``colwise_gather_output``: the LM head split by vocabulary; logits are all-gathered.
- ``embedding_rowwise``: the embedding table split by vocabulary; each rank looks up its rows, all_reduce.
- ``embedding_colwise``: the embedding table split by hidden dim; the looked-up parts are all-gathered.
- ``rowwise_split_input``: ``rowwise`` for a module whose input arrives whole: each rank takes its slice first.
- ``packed_rowwise``: ``rowwise`` on a parameter whose input features are two packed halves, split per half.
- ``all_reduce``: the module's output is a partial sum: all_reduce.
- ``moe_identity_expert``: an identity "expert" (LongCat's zero experts) sees its input divided by the group size,
  so the experts' all_reduce adds it up once.
- ``mla_kv_a_proj``, ``replicate``, ``local_params``, ``replicated*``: every rank keeps the whole module (MLA's
  latent projection: transformers' style only all-reduces its rope part's gradient, which inference has none of).

Multi-head latent attention is split by heads even where the model's plan leaves it out (DeepSeek-V3's and so
Kimi-K2's plan in transformers split only the MLP, which left 44 % of a reduced Kimi-K2 whole on every rank): the
per-head up-projections (``q_proj`` / ``q_b_proj``, ``kv_b_proj``) column-wise, ``o_proj`` row-wise, the latent
down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms replicated, as vLLM and DeepSeek-V2's plan
split it (``mla_head_plan``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REPLICATED_STYLES = ("replicated_with_grad_allreduce", "replicated", "replicate", "local_params", "mla_kv_a_proj")
COLUMN_STYLES = ("colwise", "packed_colwise")
# Every style this module applies; tests/test_sharding.py fails when a transformers release plans with another.
SUPPORTED_STYLES = frozenset({*REPLICATED_STYLES, *COLUMN_STYLES, "rowwise", "rowwise_split_input", "packed_rowwise",
                              "moe_tp_experts", "all_reduce", "moe_identity_expert", "colwise_gather_output",
                              "embedding_rowwise", "embedding_colwise"})


@dataclass
class Group:
    """The ranks of one pipeline stage that share its tensor/expert split."""

    handle: object  # a torch.distributed ProcessGroup
    rank: int
    size: int


def _pattern(plan_key: str) -> re.Pattern:
    return re.compile(re.escape(plan_key).replace(r"\*", r"\d+"))


def _take(tensor, dim: int, index: int, parts: int, name: str):
    size = tensor.shape[dim]
    if size % parts:
        raise ValueError(f"{name}: {size} along dim {dim} does not split into {parts} equal shards")
    step = size // parts
    return tensor.narrow(dim, index * step, step)


def split(tensor, dim: int, group: Group, name: str, *, packed: bool = False, misplit: bool = False):
    """This rank's shard of ``tensor`` along ``dim``, as a copy so the full tensor's storage can be freed.

    ``misplit`` is the deliberate fault: a fused projection split as one block (rank r gets rows of the wrong
    part), or a plain one given the neighbouring rank's rows.
    """
    import torch

    index = (group.rank + 1) % group.size if misplit and not packed else group.rank
    parts = tensor.chunk(2, dim) if packed and not misplit else (tensor,)
    return torch.cat([_take(part, dim, index, group.size, name) for part in parts], dim).clone()


def _set_parameter(owner, attribute: str, value) -> None:
    import torch

    setattr(owner, attribute, torch.nn.Parameter(value, requires_grad=False))


def _owner(model, name: str):
    owner_name, _, attribute = name.rpartition(".")
    return model.get_submodule(owner_name), attribute


def _reduce_output_hook(meter, group: Group):
    def hook(_module, _args, output):
        tensor = output[0] if isinstance(output, tuple) else output
        if tensor.is_contiguous():
            meter.all_reduce(tensor, group.handle)
            return output
        tensor = tensor.contiguous()
        meter.all_reduce(tensor, group.handle)
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

    return hook


def _gather_output_hook(meter, group: Group):
    import torch

    def hook(_module, _args, output):
        return torch.cat(meter.all_gather(output.contiguous(), group.handle, group.size), dim=-1)

    return hook


def _split_input_hook(group: Group, name: str):
    """This rank's slice of the last dim of a module's whole input (what ``rowwise`` would have received)."""

    def hook(_module, args):
        return (_take(args[0], -1, group.rank, group.size, name), *args[1:])

    return hook


def _vocab_parallel_hooks(meter, group: Group, start: int, end: int):
    """Hooks that make an embedding holding rows [start, end) look up only its ids and sum over the group."""

    outside_by_module = {}

    def before(module, args):
        ids = args[0]
        outside = (ids < start) | (ids >= end)
        outside_by_module[module] = outside
        return ((ids - start).masked_fill(outside, 0), *args[1:])

    def after(module, _args, output):
        output = output.masked_fill(outside_by_module.pop(module).unsqueeze(-1), 0)
        meter.all_reduce(output, group.handle)
        return output

    return before, after


def _fault_target(plan: dict, targets: dict) -> str:
    """Where ``corrupt_shard`` mis-splits: the MLP column split of the lowest layer this rank holds, else any other
    column split of a layer (attention's). A layout with no column split to corrupt refuses the fault: a fault
    that corrupted nothing would make a correct verdict look like a detection test that passed."""
    layer = re.compile(r"\.(\d+)\.")  # the first index in a name is its layer's (model.layers.3., transformer.h.3.)
    splits = [name for key, style in plan.items() if style in COLUMN_STYLES for name in targets.get(key, ())
              if layer.search(name)]
    target = min(splits, key=lambda name: (".mlp." not in name, int(layer.search(name).group(1))), default=None)
    if target is None:
        raise ValueError("fault corrupt_shard: this layout splits no layer's weights by columns, so there is no "
                         "shard to mis-split")
    return target


MLA_SPLIT = {"q_proj": "colwise", "q_b_proj": "colwise", "kv_b_proj": "colwise", "o_proj": "rowwise"}
MLA_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa")
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def _is_mla(module) -> bool:
    return all(hasattr(module, name) for name in ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))


def mla_head_plan(model, plan: dict, group_size: int) -> tuple[dict, dict]:
    """Plan entries that split every multi-head latent attention module by heads, for those the model's plan does
    not already cover, and what was decided (``{"split": [...], "replicated": [...]}`` or ``{"kept_whole": why}``).

    Each rank then runs heads / group of the heads on the whole latent: its slice of ``q_b_proj`` / ``kv_b_proj``
    rows is its heads' queries, keys and values (rows are head-major), its slice of ``o_proj`` columns their
    output; the partial outputs are summed. Attention reads the head count from the shapes (``view(..., -1, d)``),
    so nothing else changes. Kept whole when heads share a key/value head (grouped KV): a slice would pair a
    rank's queries with the wrong keys.
    """
    import torch

    added, found = {}, []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if not _is_mla(module):
            continue
        heads = getattr(module, "num_heads", None) or model.config.num_attention_heads
        if getattr(module, "num_key_value_groups", 1) != 1:
            return {}, {"kept_whole": "its heads share key/value heads (grouped KV)"}
        if heads % group_size:
            return {}, {"kept_whole": f"{heads} heads do not split over {group_size} ranks"}
        key = _LAYER_INDEX.sub(".*.", name, count=1)
        if not all(_is_mla(other) for other_name, other in modules.items() if _pattern(key).fullmatch(other_name)):
            # A hybrid (Kimi-Linear: KDA in most layers, MLA in a few) names its other mixers alike; a layer
            # wildcard would split their q_proj too, away from their whole short convolutions.
            key = name
        found.append(key)
        for child, style in {**MLA_SPLIT, **dict.fromkeys(MLA_REPLICATED, "replicated")}.items():
            entry = f"{key}.{child}"
            if isinstance(getattr(module, child, None), torch.nn.Linear) and \
                    not any(_pattern(planned).fullmatch(f"{name}.{child}") for planned in plan):
                added[entry] = style
    keys = sorted(set(found))
    return added, {"split": sorted({entry for entry, style in added.items() if style != "replicated"}),
                   "replicated": sorted({entry for entry, style in added.items() if style == "replicated"}),
                   "modules": len(keys)} if keys else {}


FUSED_QKV_MLP = {"dense_h_to_4h": "colwise", "dense_4h_to_h": "rowwise"}


def fused_qkv_plan(model, group_size: int) -> tuple[dict, list]:
    """A plan for a model transformers gives none (Falcon): its fused ``query_key_value`` column-wise, ``dense``
    row-wise, the MLP's ``dense_h_to_4h`` / ``dense_4h_to_h`` column- / row-wise; and the attention modules whose head
    counts are then this rank's. A ValueError names why a model cannot be split.

    With grouped KV heads (Falcon's ``new_decoder_architecture``) the fused rows are KV-group-major: per group its
    query heads, then its key and its value (``view(..., -1, heads / kv_heads + 2, head_dim)``), so a contiguous
    split hands each rank whole groups, its queries with their own key and value. The module reads its head counts
    from its attributes (``num_heads``, ``num_kv_heads``), so they are set to the rank's."""
    import torch

    name_of = type(model).__name__
    plan, attention = {}, []
    for name, module in model.named_modules():
        if not (isinstance(getattr(module, "query_key_value", None), torch.nn.Linear)
                and isinstance(getattr(module, "dense", None), torch.nn.Linear)):
            continue
        if not getattr(module, "new_decoder_architecture", False):
            raise ValueError(f"{name_of} declares no tensor-parallel plan, and its fused query_key_value is not "
                             "grouped by KV head (new_decoder_architecture false): it cannot be split by heads")
        if getattr(module.config, "alibi", False):
            raise ValueError(f"{name_of} declares no tensor-parallel plan, and its ALiBi biases are built for every "
                             "head: it cannot be split by heads")
        if module.num_kv_heads % group_size:
            raise ValueError(f"{name_of}: {module.num_kv_heads} KV heads (num_kv_heads) do not split over "
                             f"{group_size} ranks")
        key = _LAYER_INDEX.sub(".*.", name, count=1)
        plan.update({f"{key}.query_key_value": "colwise", f"{key}.dense": "rowwise"})
        layer = key.rpartition(".")[0]
        mlp = getattr(model.get_submodule(name.rpartition(".")[0]), "mlp", None)
        for child, style in FUSED_QKV_MLP.items():
            if isinstance(getattr(mlp, child, None), torch.nn.Linear):
                plan[f"{layer}.mlp.{child}"] = style
        attention.append(module)
    if not plan:
        raise ValueError(f"{name_of} declares no tensor-parallel plan")
    # The vocabulary split as transformers' plans split it: the embedding by rows, the LM head's logits gathered.
    ends = {id(model.get_input_embeddings()): "embedding_rowwise", id(model.get_output_embeddings()):
            "colwise_gather_output"}
    plan.update({name: ends[id(module)] for name, module in model.named_modules() if id(module) in ends})
    return plan, attention


def apply_tensor_parallel(model, group: Group, meter, *, skip_modules: tuple[type, ...] = (),
                          corrupt: bool = False) -> dict:
    """Split ``model`` in place per its tp plan (with MLA split by heads, ``mla_head_plan``); returns what was split
    how (and what the fault touched).

    ``corrupt`` mis-splits one MLP projection on the group's last rank (see ``split``).
    """
    plan, fused = dict(model.tp_plan or {}), []
    if not plan:
        plan, fused = fused_qkv_plan(model, group.size)
    mla_entries, mla = mla_head_plan(model, plan, group.size)
    plan.update(mla_entries)
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters())
    skipped_prefixes = tuple(f"{name}." for name, module in modules.items() if isinstance(module, skip_modules))
    targets = {}
    for key in plan:
        pattern = _pattern(key)
        names = [name for name in (*modules, *parameters) if pattern.fullmatch(name)]
        targets[key] = [name for name in names if not (name in modules and isinstance(modules[name], skip_modules))
                        and not name.startswith(skipped_prefixes)]
    fault_target = _fault_target(plan, targets) if corrupt and group.rank == group.size - 1 else None
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    tied = outputs is not None and inputs is not None and outputs.weight is inputs.weight
    styles = {}
    summary: dict[str, list[str]] = {}
    for key, style in plan.items():
        for name in targets[key]:
            _apply_style(model, modules, name, style, group, meter, misplit=name == fault_target)
            if name in modules:
                styles[id(modules[name])] = style
        if targets[key]:
            summary.setdefault(style, []).append(key)
    if tied and (styles.get(id(inputs)), styles.get(id(outputs))) == ("embedding_rowwise", "colwise_gather_output"):
        outputs.weight = inputs.weight  # both hold this rank's vocabulary rows: tied again, held once
    for attention in fused:  # this rank's heads, as its share of the fused rows holds them
        attention.num_heads //= group.size
        attention.num_kv_heads //= group.size
    return {"plan": summary, "corrupted": fault_target, **({"mla": mla} if mla else {}),
            **({"fused_qkv": f"d0's plan for a fused query_key_value, {len(fused)} attention modules split by KV "
                             "group"} if fused else {})}


def _apply_style(model, modules: dict, name: str, style: str, group: Group, meter, *, misplit: bool) -> None:
    import torch

    module = modules.get(name)
    if style in REPLICATED_STYLES:
        return
    if module is None:  # a parameter of an experts module, shaped [experts, out, in] unless transposed
        owner, attribute = _owner(model, name)
        transposed = getattr(owner, "is_transposed", False)
        out_dim, in_dim = (-1, -2) if transposed else (-2, -1)
        tensor = getattr(owner, attribute).data
        if style in COLUMN_STYLES:
            # An interleaved [g0, u0, g1, u1, ...] layout keeps gate and up together under a contiguous split.
            packed = style == "packed_colwise" and getattr(owner, "is_concatenated", True)
            _set_parameter(owner, attribute, split(tensor, out_dim, group, name, packed=packed, misplit=misplit))
        elif style in ("rowwise", "packed_rowwise"):
            _set_parameter(owner, attribute, split(tensor, in_dim, group, name, packed=style == "packed_rowwise"))
        else:
            raise ValueError(f"tensor-parallel style {style!r} on parameter {name} is not supported")
        return
    if style == "colwise" and isinstance(module, torch.nn.Linear):
        _set_parameter(module, "weight", split(module.weight.data, 0, group, name, misplit=misplit))
        if module.bias is not None:
            _set_parameter(module, "bias", split(module.bias.data, 0, group, name, misplit=misplit))
    elif style in ("rowwise", "rowwise_split_input") and isinstance(module, torch.nn.Linear):
        _set_parameter(module, "weight", split(module.weight.data, 1, group, name))
        if module.bias is not None and group.rank:
            # The bias is added once: kept on group rank 0, zero elsewhere, restored by the all_reduce.
            _set_parameter(module, "bias", torch.zeros_like(module.bias.data))
        if style == "rowwise_split_input":
            module.register_forward_pre_hook(_split_input_hook(group, name))
        module.register_forward_hook(_reduce_output_hook(meter, group))
    elif style in ("moe_tp_experts", "all_reduce"):
        module.register_forward_hook(_reduce_output_hook(meter, group))
    elif style == "moe_identity_expert":
        module.register_forward_pre_hook(lambda _module, args: (args[0] / group.size, *args[1:]))
    elif style == "embedding_colwise" and isinstance(module, torch.nn.Embedding):
        _set_parameter(module, "weight", split(module.weight.data, 1, group, name))
        module.register_forward_hook(_gather_output_hook(meter, group))
    elif style == "colwise_gather_output" and isinstance(module, torch.nn.Linear):
        _set_parameter(module, "weight", split(module.weight.data, 0, group, name))
        if module.bias is not None:
            _set_parameter(module, "bias", split(module.bias.data, 0, group, name))
        module.register_forward_hook(_gather_output_hook(meter, group))
    elif style == "embedding_rowwise" and isinstance(module, torch.nn.Embedding):
        rows = module.weight.shape[0] // group.size
        _set_parameter(module, "weight", split(module.weight.data, 0, group, name))
        module.padding_idx = None  # a global id; it only matters for training, and F.embedding checks it
        before, after = _vocab_parallel_hooks(meter, group, group.rank * rows, (group.rank + 1) * rows)
        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)
    else:
        raise ValueError(f"tensor-parallel style {style!r} on {name} ({type(module).__name__}) is not supported")
