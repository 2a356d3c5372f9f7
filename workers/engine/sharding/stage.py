"""The ``sharded_run`` node stage: what it takes (``PARAMETERS``) and ``shard_stage``, which runs ``run_sharded``
with them; placed on a group of nodes when its world spans several (the control plane sends each its rendezvous)."""

from __future__ import annotations

from collections.abc import Callable

from ..parameters import Parameter, validate
from ..stage_spec import StageSpec
from .compare import THRESHOLDS
from .layout import PLAN_AXES, parse_fault
from .runner import run_sharded


def _fault(fault: str) -> None:
    parse_fault(fault, world_size=2**20)  # the world's real size is checked again when the run starts


def _planned(planned: dict) -> None:
    for axis, size in planned.items():
        if axis not in PLAN_AXES:
            raise ValueError(f"unknown axis {axis!r}; a planned layout has {', '.join(PLAN_AXES)}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{axis} must be a positive integer, not {size!r}")


PARAMETERS = (
    Parameter("config", "object", "the model's config.json (the job's model)", set_by="control"),
    Parameter("tp", "int", "tensor-parallel ranks", default=1, minimum=1, maximum=64),
    Parameter("pp", "int", "pipeline stages", default=1, minimum=1, maximum=64),
    Parameter("ep", "int", "expert-parallel ranks (MoE; equal to tp when both are above 1)", default=1, minimum=1,
              maximum=64),
    Parameter("dtype", "choice", "dtype of the sharded run (the reference is fp32)", default="fp32",
              choices=tuple(THRESHOLDS)),
    Parameter("decode_steps", "int", "greedy decode steps after the prefill", default=16, minimum=0, maximum=1024),
    Parameter("seed", "int", "seed of the random weights and the prompt", default=0, minimum=0, maximum=2**31 - 1),
    Parameter("prompt_tokens", "int", "prompt length", default=8, minimum=1, maximum=8192),
    Parameter("weights_path", "path", "a safetensors checkpoint folder on the node, under one of its data roots "
              "(default: seeded random weights)", nullable=True),
    Parameter("shrink", "bool", "run a small model of the architecture (false: the config's own sizes)", default=True),
    Parameter("device", "choice", "where the ranks run", default="auto", choices=("auto", "cpu", "cuda")),
    Parameter("timeout_s", "float", "seconds before a hung run is ended", default=600.0, minimum=1, maximum=86400),
    Parameter("fault", "str", "test hook: corrupt_shard, corrupt_experts, or hang_rank_N / crash_rank_N / "
              "kill_rank_N", nullable=True, maximum=32, check=_fault),
    Parameter("planned", "object", "the planner's layout this run was scaled from ({tp, pp, dp, ep, nodes}); the "
              "report names it beside the axes the run exercised", nullable=True, check=_planned),
    Parameter("node_count", "int", "nodes the world spans (the control plane places the ranks)", default=1, minimum=1,
              maximum=64),
    Parameter("rendezvous", "object", "master address and port, world size, node rank, ranks per node",
              set_by="control"),
)


def shard_stage(params: dict, progress: Callable[[float, str], None]) -> dict:
    """The ``sharded_run`` stage: ``run_sharded`` with its keyword arguments taken from ``params``."""
    params = validate("sharded_run", PARAMETERS, params, control=True)
    arguments = {key: value for key, value in params.items() if key not in ("config", "node_count")}
    return run_sharded(params.get("config"), **arguments, progress=progress)


STAGES = (
    StageSpec(kind="sharded_run", run=shard_stage, gated=True, needs_model=True, placement="group",
              parameters=PARAMETERS, preload=("torch", "transformers", "workers.engine.models.reducer",
                                              "workers.engine.sharding.launcher")),
)
