"""What a node stage is, as its capability declares it (``<capability>/stage.py``'s ``STAGES``): a module of its own,
so that a capability's declaration and the registry (``stages.py``) that collects them do not import each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .parameters import Parameter

Progress = Callable[[float, str], None]
Stage = Callable[[dict, Progress], dict]


@dataclass(frozen=True)
class StageSpec:
    kind: str
    run: Stage
    # Gated stages are refused on nodes whose latest env check failed or is too old (the pre-flight gate);
    # the checks themselves are not gated, or a node could never prove itself fit again.
    gated: bool
    # Stages about a model get its config.json as params["config"]; a job for them must name a model.
    needs_model: bool = False
    # Where the control plane runs it: on "every" eligible node, on "one" (the first eligible), or on a "group"
    # of nodes forming one torch.distributed world (one stage run per node, told its node_rank and rendezvous).
    placement: str = "every"
    parameters: tuple[Parameter, ...] = ()
    # A stage that ends in milliseconds (a probe of the host): the node sends no "started" report for it, its
    # "finished" one says how long it ran, so the control plane takes one report instead of two.
    instant: bool = False
    # Modules the stage imports when it runs (torch, transformers, its machinery): a node worker imports them once
    # before its pool forks, so no stage pays for them, and none is cut short half-way through a first import.
    preload: tuple[str, ...] = ()

    def __post_init__(self):
        if self.placement not in ("every", "one", "group"):
            raise ValueError(f"stage {self.kind}: placement is every, one or group, not {self.placement!r}")
