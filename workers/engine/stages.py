"""The stage kinds a node can run, each a function ``(params, progress) -> result dict``.

``progress(fraction, message)`` reports how far the stage is (0..1). Later issues add stages here; the
control plane's choices and the node task both read this registry, so a kind exists in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .coverage import op_coverage
from .envcheck import env_check, env_probe
from .sharding import shard_stage
from .sweep import sweep_stage

Progress = Callable[[float, str], None]
Stage = Callable[[dict, Progress], dict]



@dataclass(frozen=True)
class StageSpec:
    run: Stage
    # Gated stages are refused on nodes whose latest env check failed or is too old (the pre-flight gate);
    # the checks themselves are not gated, or a node could never prove itself fit again.
    gated: bool
    # Stages about a model get its config.json as params["config"]; a job for them must name a model.
    needs_model: bool = False
    # Where the control plane runs it: on "every" eligible node, on "one" (the first eligible), or on a "group"
    # of nodes forming one torch.distributed world (one stage run per node, told its node_rank and rendezvous).
    placement: str = "every"


STAGES: dict[str, StageSpec] = {
    "env_probe": StageSpec(env_probe, gated=False),
    "env_check": StageSpec(env_check, gated=False),
    "op_coverage": StageSpec(op_coverage, gated=True, needs_model=True),
    "sharded_run": StageSpec(shard_stage, gated=True, needs_model=True, placement="group"),
    "sweep": StageSpec(sweep_stage, gated=True, needs_model=True, placement="one"),
}
STAGE_KINDS = tuple(STAGES)


def run_stage(kind: str, params: dict, progress: Progress) -> dict:
    try:
        stage = STAGES[kind]
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; this node knows {', '.join(STAGE_KINDS)}") from None
    return stage.run(params, progress)
