"""The engine side of a stage kind that exists only for the tests (``tests/test_stage_registry.py``): no torch, no
Django, a result computed from what the job and the control plane gave it. Node and control workers load it through
``D0_STAGE_MODULES``, as a deployment's own stage kind would be loaded."""

from workers.engine.parameters import Parameter
from workers.engine.stages import StageSpec

KIND = "number_sum"


def number_sum(params: dict, progress) -> dict:
    progress(0.5, "adding")
    numbers = params.get("numbers", [])
    return {"total": sum(numbers) + params.get("offset", 0), "count": len(numbers)}


STAGES = (
    StageSpec(kind=KIND, run=number_sum, gated=False, placement="one", parameters=(
        Parameter("numbers", "list", "whole numbers to add", max_items=100,
                  item=Parameter("number", "int", "a whole number", minimum=-1000, maximum=1000)),
        Parameter("offset", "int", "added by the control plane", set_by="control"),
    )),
)
