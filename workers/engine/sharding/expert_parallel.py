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


class ExpertParallelExperts(nn.Module):
    """Stands in for an experts module called as ``experts(hidden_states, top_k_index, top_k_weights)``."""

    def __init__(self, experts: nn.Module, group: Group, meter, *, owner_index: int, name: str):
        super().__init__()
        expert_count = experts.num_experts
        if expert_count % group.size:
            raise ValueError(f"{name}: {expert_count} experts do not split over ep={group.size} ranks")
        self.per_rank = expert_count // group.size
        first = owner_index * self.per_rank
        for attribute, parameter in list(experts.named_parameters(recurse=False)):
            if parameter.shape[0] == expert_count:  # per-expert weights and biases: keep this rank's block
                local = parameter.data[first:first + self.per_rank].clone()
                setattr(experts, attribute, nn.Parameter(local, requires_grad=False))
        experts.num_experts = self.per_rank
        self.local = experts
        self.group = group
        self.meter = meter

    def _exchange(self, send, send_counts: list[int], receive_counts: list[int]):
        received = send.new_empty((sum(receive_counts), *send.shape[1:]))
        self.meter.all_to_all(received, send.contiguous(), receive_counts, send_counts, self.group.handle)
        return received

    def forward(self, hidden_states, top_k_index, top_k_weights):
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
        else:
            outputs = rows
        returned = self._exchange(outputs.to(hidden_states.dtype), receive_counts, send_counts)

        combined = torch.zeros_like(hidden_states)
        weighted = returned * weight_of_rows.unsqueeze(-1)
        combined.index_add_(0, token_of_rows, weighted.to(hidden_states.dtype))
        self.meter.all_reduce(combined, group.handle)
        return combined


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
    return found


def apply_expert_parallel(model, group: Group, meter, *, corrupt: bool = False) -> dict:
    """Replace every experts module on this rank; ``corrupt`` gives the group's last rank the wrong block.

    A pipeline stage may hold only dense layers (DeepSeek-V3's first ones) and then has nothing to replace.
    """
    if not getattr(model.config, "base_model_ep_plan", None):
        raise ValueError(f"{type(model).__name__} declares no expert-parallel plan in this transformers (a dense "
                         "model, or an MoE like DBRX whose experts transformers does not dispatch): use tp, which "
                         "splits each expert instead")
    names = [name for name, _, _ in experts_modules(model)]
    # The deliberate fault: the last rank loads its neighbour's experts while tokens still come to it by the
    # true ownership, like an expert map that is off by one block.
    corrupted = group.rank == group.size - 1 and corrupt
    owner_index = (group.rank + 1) % group.size if corrupted else group.rank
    for name in names:
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, attribute, ExpertParallelExperts(getattr(owner, attribute), group, meter,
                                                        owner_index=owner_index, name=name))
    return {"experts_modules": len(names), "corrupted": names if corrupted and names else None}
