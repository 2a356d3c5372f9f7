"""A stage kind that d0 does not ship, declared only here: what a node operator's module named in
``$D0_STAGE_MODULES`` looks like (tests/engine/test_stage_registry.py loads it)."""

from workers.engine.parameters import Parameter
from workers.engine.stage_spec import StageSpec


def echo(params: dict, progress) -> dict:
    progress(0.5, "echoing")
    return {"echo": params.get("message", "hello")}


STAGES = (
    StageSpec("echo", echo, gated=False, placement="one", preload=("json",),
              parameters=(Parameter("message", "str", "what the stage answers", default="hello", maximum=100),)),
)
