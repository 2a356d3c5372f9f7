"""Which rank holds what: pipeline stages, each made of one tensor/expert-parallel group.

Ranks are numbered stage-major: rank = stage * group_size + group_rank. Expert parallelism follows vLLM's
``--enable-expert-parallel``: the experts are spread over the same ranks that split attention by heads, so with
both tp > 1 and ep > 1 they must be equal; with tp = 1 the non-expert weights are replicated on the ep ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAULTS = ("corrupt_shard", "hang_rank_N", "crash_rank_N", "kill_rank_N")
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


def parse_fault(fault: str | None, world_size: int) -> tuple[str, int | None] | None:
    """``None``, ``("corrupt_shard", None)`` or ``(kind, rank)`` for hang/crash/kill of one rank."""
    if not fault:
        return None
    if fault == "corrupt_shard":
        if world_size == 1:
            raise ValueError("fault 'corrupt_shard' needs a sharded layout: one rank has no shard to mis-split")
        return fault, None
    match = _RANK_FAULT.fullmatch(fault)
    if not match:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    rank = int(match.group(2))
    if rank >= world_size:
        raise ValueError(f"fault {fault!r} names rank {rank}, but the world has {world_size} ranks")
    return match.group(1), rank
