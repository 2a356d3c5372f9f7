"""Expert parallelism: each rank of a group holds a contiguous block of experts and tokens travel to them.

Dispatch is the all_to_all scheme of GShard / DeepSpeed-MoE: every rank routes its own slice of the tokens,
sends each (token, expert) row to the rank that owns the expert, the owner runs the architecture's own experts
module on the rows it received, and the outputs travel back by the reverse all_to_all. The token slices are then
summed over the group (disjoint slices, so the sum is a concatenation) because the next layer's attention needs
every token on every rank of the group.

The routing weights are applied on the sending side, after the return trip, in the order of expert ids, which is
the order in which transformers' reference experts loop adds them up.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .tensor_parallel import Group


def keep_block(experts: nn.Module, group_size: int, owner_index: int, name: str) -> int:
    """Keep only this rank's contiguous block of experts in an experts module; returns the experts per rank.

    Per-expert parameters are [experts, ...] (transformers' fused experts) or [experts x width, ...] (DBRX keeps
    its experts' GLU weights flattened in a child module); either way the block is a contiguous slice of dim 0.
    """
    expert_count = experts.num_experts
    if expert_count % group_size:
        raise ValueError(f"{name}: {expert_count} experts do not split over ep={group_size} ranks")
    per_rank = expert_count // group_size
    for parameter_name, parameter in list(experts.named_parameters()):
        rows = parameter.shape[0] if parameter.dim() else 0
        if rows and rows % expert_count == 0:
            per_expert = rows // expert_count
            start = owner_index * per_rank * per_expert
            owner_name, _, attribute = parameter_name.rpartition(".")
            owner = experts.get_submodule(owner_name) if owner_name else experts
            local = parameter.data[start:start + per_rank * per_expert].clone()
            setattr(owner, attribute, nn.Parameter(local, requires_grad=False))
    experts.num_experts = per_rank
    return per_rank


class ExpertParallelExperts(nn.Module):
    """Stands in for an experts module called as ``experts(hidden_states, top_k_index, top_k_weights)``."""

    def __init__(self, experts: nn.Module, group: Group, meter, *, owner_index: int, name: str):
        super().__init__()
        self.per_rank = keep_block(experts, group.size, owner_index, name)
        self.local = experts
        self.group = group
        self.meter = meter

    def _exchange(self, send, send_counts: list[int], receive_counts: list[int]):
        received = send.new_empty((sum(receive_counts), *send.shape[1:]))
        self.meter.all_to_all(received, send.contiguous(), receive_counts, send_counts, self.group.handle)
        return received

    def forward(self, hidden_states, top_k_index, top_k_weights):
        # Most MoE blocks pass tokens flattened; DBRX passes [batch, sequence, hidden]: the output keeps the shape.
        shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, shape[-1])
        top_k_index, top_k_weights = top_k_index.reshape(hidden_states.shape[0], -1), top_k_weights.reshape(
            hidden_states.shape[0], -1)
        group = self.group
        tokens, top_k = top_k_index.shape
        start, end = tokens * group.rank // group.size, tokens * (group.rank + 1) // group.size
        experts_of_rows = top_k_index[start:end].reshape(-1)
        order = torch.argsort(experts_of_rows, stable=True)
        experts_of_rows = experts_of_rows[order]
        token_of_rows = torch.arange(start, end, device=hidden_states.device).repeat_interleave(top_k)[order]
        weight_of_rows = top_k_weights[start:end].reshape(-1)[order]

        send_counts = torch.bincount(experts_of_rows // self.per_rank, minlength=group.size)
        receive_counts = torch.empty_like(send_counts)
        self.meter.all_to_all(receive_counts, send_counts, None, None, group.handle)
        send_counts, receive_counts = send_counts.tolist(), receive_counts.tolist()

        rows = self._exchange(hidden_states[token_of_rows], send_counts, receive_counts)
        row_experts = self._exchange(experts_of_rows, send_counts, receive_counts)
        if rows.shape[0]:
            local_index = (row_experts - group.rank * self.per_rank).unsqueeze(-1)
            outputs = self.local(rows, local_index, torch.ones_like(local_index, dtype=top_k_weights.dtype))
            outputs = outputs.reshape(rows.shape)  # DBRX's experts answer [rows, 1, hidden]
        else:
            outputs = rows
        returned = self._exchange(outputs.to(hidden_states.dtype), receive_counts, send_counts)

        combined = torch.zeros_like(hidden_states)
        weighted = returned * weight_of_rows.unsqueeze(-1)
        combined.index_add_(0, token_of_rows, weighted.to(hidden_states.dtype))
        self.meter.all_reduce(combined, group.handle)
        return combined.view(shape)


class DenseExpertParallelExperts(nn.Module):
    """Stands in for an experts module that runs every expert on a pre-weighted copy of every token, called as
    ``experts(hidden_states)`` with [experts x tokens, hidden] rows (Llama-4's): each rank runs its block of experts
    on its block of rows, and the full output is summed over the group (the other blocks are zeros)."""

    def __init__(self, experts: nn.Module, group: Group, meter, *, owner_index: int, name: str):
        super().__init__()
        self.experts_total = experts.num_experts
        self.per_rank = keep_block(experts, group.size, owner_index, name)
        self.first = group.rank * self.per_rank
        self.local = experts
        self.group = group
        self.meter = meter

    def forward(self, hidden_states):
        rows = hidden_states.view(self.experts_total, -1, hidden_states.shape[-1])
        local = self.local(rows[self.first:self.first + self.per_rank].reshape(-1, hidden_states.shape[-1]))
        combined = hidden_states.new_zeros(rows.shape)
        combined[self.first:self.first + self.per_rank] = local.view(self.per_rank, -1, hidden_states.shape[-1])
        self.meter.all_reduce(combined, self.group.handle)
        return combined.view(-1, hidden_states.shape[-1])


def _dispatching(experts: nn.Module) -> bool:
    """Whether an experts module takes routed tokens (``top_k_index``), or every token weighted (Llama-4)."""
    import inspect

    return "top_k_index" in inspect.signature(experts.forward).parameters


def experts_modules(model) -> list[tuple[str, int, nn.Module]]:
    """(name, layer index, module) of every experts module on this rank, as the model's ep plan names them;
    none for a model without an ep plan."""
    plan = getattr(model.config, "base_model_ep_plan", None) or {}
    keys = [key for key, style in plan.items() if style == "ep_dispatch_experts"]
    patterns = [re.compile(re.escape(f"{model.base_model_prefix}.{key}").replace(r"\*", r"(\d+)")) for key in keys]
    found = []
    for name, module in model.named_modules():
        match = next((match for pattern in patterns if (match := pattern.fullmatch(name))), None)
        if match:
            found.append((name, int(match.group(1)), module))
    if found or plan:
        return found
    # No plan in this transformers (DBRX, Llama-4): the experts modules by what they are, a module named experts
    # that knows its expert count, inside a numbered layer.
    layer = re.compile(r"\.(\d+)\.")
    return [(name, int(match.group(1)), module) for name, module in model.named_modules()
            if name.rpartition(".")[2] == "experts" and isinstance(getattr(module, "num_experts", None), int)
            and (match := layer.search(name))]


def expert_fingerprints(experts: nn.Module) -> list[str]:
    """One checksum per expert of an experts module (its rows of every per-expert parameter): which expert a rank
    really holds, whatever its position in the rank's block says."""
    count = experts.num_experts
    sums = [[] for _ in range(count)]
    for _, parameter in sorted(experts.named_parameters()):
        rows = parameter.shape[0] if parameter.dim() else 0
        if not rows or rows % count:
            continue
        for expert, part in enumerate(parameter.data.double().reshape(count, -1)):
            sums[expert] += [float(part.sum()), float(part.abs().sum())]
    return [",".join(f"{value:.12g}" for value in values) for values in sums]


def placement_problems(held: list[dict[str, list[int | None]]], per_rank: dict[str, int]) -> list[str]:
    """What is wrong with where the experts are, given each group rank's held expert ids per experts module (in
    group-rank order) and the experts per rank; tokens go to rank ``expert // per_rank``, so rank r must hold
    exactly the block [r * per_rank, (r + 1) * per_rank). Empty when every expert sits where tokens are sent."""
    problems = []
    for name, block in per_rank.items():
        holders: dict[int, list[int]] = {}
        wrong = []
        for rank, modules in enumerate(held):
            ids = modules.get(name, [])
            expected = list(range(rank * block, (rank + 1) * block))
            for expert in ids:
                if expert is not None:
                    holders.setdefault(expert, []).append(rank)
            if ids != expected:
                shown = "unknown experts" if None in ids else f"experts {_span(ids)}"
                wrong.append(f"rank {rank} holds {shown} but is sent the tokens of experts {_span(expected)}")
        if not wrong:
            continue
        twice = sorted(expert for expert, ranks in holders.items() if len(ranks) > 1)
        missing = sorted(set(range(block * len(held))) - set(holders))
        details = wrong + ([f"experts {_span(twice)} held by more than one rank"] if twice else []) + \
            ([f"experts {_span(missing)} held by no rank"] if missing else [])
        problems.append(f"{name}: {'; '.join(details)}")
    return problems


def _span(ids: list[int]) -> str:
    return f"{ids[0]}–{ids[-1]}" if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 else \
        ", ".join(map(str, ids))


def apply_expert_parallel(model, group: Group, meter, *, corrupt: bool = False) -> dict:
    """Replace every experts module on this rank; ``corrupt`` gives the group's last rank the wrong block.

    A pipeline stage may hold only dense layers (DeepSeek-V3's first ones) and then has nothing to replace.
    Returns, besides what was replaced, the expert ids this rank holds per module (``held``, found by checksum
    against the full module) and the experts per rank, for ``placement_problems``.
    """
    found = experts_modules(model)
    if not found and not getattr(model.config, "base_model_ep_plan", None):
        raise ValueError(f"{type(model).__name__} has no experts to spread over ranks (a dense model?)")
    names = [name for name, _, _ in found]
    # The deliberate fault: the last rank loads its neighbour's experts while tokens still come to it by the
    # true ownership, like an expert map that is off by one block.
    corrupted = group.rank == group.size - 1 and corrupt
    owner_index = (group.rank + 1) % group.size if corrupted else group.rank
    held, per_rank = {}, {}
    for name in names:
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        experts = getattr(owner, attribute)
        everyone = expert_fingerprints(experts)
        wrapper = ExpertParallelExperts if _dispatching(experts) else DenseExpertParallelExperts
        setattr(owner, attribute, wrapper(experts, group, meter, owner_index=owner_index, name=name))
        held[name] = [everyone.index(print_) if print_ in everyone else None
                      for print_ in expert_fingerprints(experts)]
        per_rank[name] = len(held[name])
    return {"experts_modules": len(names), "corrupted": names if corrupted and names else None, "held": held,
            "per_rank": per_rank}
