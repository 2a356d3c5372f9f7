"""Which rank holds what: pipeline stages, each made of one tensor/expert-parallel group.

Ranks are numbered stage-major: rank = stage * group_size + group_rank. Expert parallelism follows vLLM's
``--enable-expert-parallel``: the experts are spread over the same ranks that split attention by heads, so with
both tp > 1 and ep > 1 they must be equal; with tp = 1 the non-expert weights are replicated on the ep ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAULTS = ("corrupt_shard", "corrupt_experts", "hang_rank_N", "crash_rank_N", "kill_rank_N")
PLAN_AXES = ("tp", "pp", "dp", "ep", "nodes")
_RANK_FAULT = re.compile(r"(hang|crash|kill)_rank_(\d+)")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("tp", "pp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.tp > 1 and self.ep > 1 and self.tp != self.ep:
            raise ValueError(f"tp={self.tp} and ep={self.ep}: experts are spread over the tensor-parallel ranks, "
                             "so ep must equal tp (or one of them be 1)")

    @property
    def group_size(self) -> int:
        return max(self.tp, self.ep)

    @property
    def world_size(self) -> int:
        return self.pp * self.group_size

    @property
    def reporting_rank(self) -> int:
        """The first rank of the last stage: it has the logits, so it runs the reference and compares."""
        return (self.pp - 1) * self.group_size

    def stage_of(self, rank: int) -> int:
        return rank // self.group_size

    def group_rank_of(self, rank: int) -> int:
        return rank % self.group_size

    def group_ranks(self, stage: int) -> list[int]:
        return list(range(stage * self.group_size, (stage + 1) * self.group_size))

    def describe(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "world_size": self.world_size,
                "group_size": self.group_size}

    def label(self) -> str:
        """"EP2 × TP1", "TP2 × PP2", "PP2": expert parallelism shows the tensor split beside it (TP1: attention
        whole on every rank, as DP attention keeps it)."""
        parts = ([f"EP{self.ep}", f"TP{self.tp}"] if self.ep > 1 else [f"TP{self.tp}"] if self.tp > 1 else [])
        parts += [f"PP{self.pp}"] if self.pp > 1 else []
        return " × ".join(parts) or "one rank"


def parse_fault(fault: str | None, world_size: int, ep: int | None = None) -> tuple[str, int | None] | None:
    """``None``, ``("corrupt_shard", None)``, ``("corrupt_experts", None)`` or ``(kind, rank)`` for hang/crash/kill
    of one rank. ``corrupt_shard`` mis-splits the innermost split the layout has; ``corrupt_experts`` gives the last
    rank of each expert-parallel group its neighbour's experts (refused without EP when ``ep`` is known)."""
    if not fault:
        return None
    if fault in ("corrupt_shard", "corrupt_experts"):
        if world_size == 1:
            raise ValueError(f"fault {fault!r} needs a sharded layout: one rank has no shard to mis-split")
        if fault == "corrupt_experts" and ep is not None and ep < 2:
            raise ValueError("fault 'corrupt_experts' needs expert parallelism (ep >= 2): no experts are placed")
        return fault, None
    match = _RANK_FAULT.fullmatch(fault)
    if not match:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    rank = int(match.group(2))
    if rank >= world_size:
        raise ValueError(f"fault {fault!r} names rank {rank}, but the world has {world_size} ranks")
    return match.group(1), rank


def _halved(size: int) -> int:
    """The next smaller size of an axis: divided by its smallest factor, so a power of two stays one."""
    return size // next(factor for factor in range(2, size + 1) if size % factor == 0)


def plan_text(planned: dict) -> str:
    """A planner layout as the issue tracker and the pages write it: "DP16 + EP16 on 16 devices"."""
    parts = [f"{axis.upper()}{planned[axis]}" for axis in ("tp", "pp", "dp", "ep") if int(planned.get(axis, 1)) > 1]
    devices = int(planned.get("tp", 1)) * int(planned.get("pp", 1)) * int(planned.get("dp", 1))
    return f"{' + '.join(parts) or 'one device'} on {devices} device{'s' if devices != 1 else ''}"


def _planned_axes(planned: dict) -> tuple[int, int]:
    """(the plan's group: its EP size, vLLM's TP x DP, where it has experts, else its TP; its pipeline stages)."""
    tp, pp, dp, ep = (int(planned.get(axis, 1)) for axis in ("tp", "pp", "dp", "ep"))
    return (tp * dp if ep > 1 else tp), pp


def ranks_keeping_axes(planned: dict) -> int:
    """The fewest ranks on which every axis the plan uses keeps a split of 2 (at least 2): what a node without
    accelerators runs as processes, 4 only for a plan with both a tensor/expert group and pipeline stages."""
    group, stages = _planned_axes(planned)
    return max(2, (2 if group > 1 else 1) * (2 if stages > 1 else 1))


def scaled_from_plan(planned: dict, ranks: int) -> tuple[Layout, str]:
    """The sharded run's layout for a planner layout ``{"tp", "pp", "dp", "ep"}`` on ``ranks`` ranks, and a sentence
    saying how it was scaled.

    The axes the plan uses are kept: its expert-parallel group (vLLM spreads experts over TP x DP ranks) or its
    tensor-parallel group becomes this run's group, its pipeline its stages. Data parallelism without experts only
    copies the model (nothing to validate); with experts it is what spreads them, and attention stays whole on each
    rank as DP attention keeps it. When the plan needs more ranks than there are, the larger axis (the pipeline on a
    tie) is divided by its smallest factor, but not below 2, and an axis gives up its last split (2 -> 1) only when
    every axis is down to 2 (pipeline before the group): TP8 x PP2 on 4 ranks -> TP2 x PP2, on 2 -> TP2; DP16 + EP16
    on 2 -> EP2; TP2 x PP3 x DP3 (EP6) on 8 -> EP3 x TP3 x PP2.
    """
    tp, pp, dp, ep = (int(planned.get(axis, 1)) for axis in ("tp", "pp", "dp", "ep"))
    if ranks < 2:
        raise ValueError(f"a sharded run needs at least 2 ranks; {ranks} available")
    experts = ep > 1
    group, stages = _planned_axes(planned)
    while group * stages > ranks:
        if max(group, stages) > 2:  # the larger axis gives way (the pipeline on a tie), not below 2 yet
            if stages >= group:
                stages = max(2, _halved(stages))
            else:
                group = max(2, _halved(group))
        elif stages > 1:
            stages = 1
        else:
            group = 1
    if group * stages == 1:  # a plan of one device (or only DP replicas): the model's own split is still checked
        return Layout(tp=2), (f"TP2 on 2 ranks: the plan ({plan_text(planned)}) splits nothing a sharded run "
                              "could check")
    layout = Layout(tp=group if tp > 1 else 1, pp=stages, ep=group if experts else 1)
    same = (layout.tp, layout.pp, layout.ep) == (tp, pp, ep) and (dp == 1 or experts and group == tp * dp)
    dropped = " (DP replicas are copies of the model: not run)" if dp > 1 and not experts else ""
    how = "the plan as it is" if same else f"the plan scaled to the {ranks} ranks at hand"
    return layout, f"{layout.label()} on {layout.world_size} ranks: {how} ({plan_text(planned)}){dropped}"
