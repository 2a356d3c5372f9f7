"""The stage kinds a node can run, each a function ``(params, progress) -> result dict`` with its declared
parameters (``parameters.Parameter``), collected from the capabilities that declare them.

Each capability package keeps its stages in its own ``stage.py``: the stage functions, their ``PARAMETERS`` and a
``STAGES`` tuple of ``StageSpec``. This registry reads them in pipeline order, then the modules named in
``D0_STAGE_MODULES`` (comma-separated: a deployment's own stage kinds, declared the same way), and ``register``
adds one at run time. The control plane's check of a job's parameters, the job form, the OpenAPI schema and the
node task all read ``STAGES``. Importing it imports neither torch nor transformers (the web tier reads it in every
process): each stage imports what it runs when it runs.

``progress(fraction, message)`` reports how far a stage is (0..1).
"""

from __future__ import annotations

import importlib
import os

from .parameters import MAX_DEPTH, Parameter, ParameterError, nesting_depth, user_parameters, validate
from .stage_spec import Progress, Stage, StageSpec

__all__ = ["NODES", "STAGES", "Progress", "Stage", "StageSpec", "check_job_parameters", "describe_parameters",
           "parameters_json_schema", "path_parameters", "register", "run_stage", "secret_parameters"]

# The capability packages that declare stages, in the order a whole adaptation runs them.
CAPABILITIES = ("envcheck", "coverage", "sharding", "sweep", "serving")
MODULES_VARIABLE = "D0_STAGE_MODULES"

STAGES: dict[str, StageSpec] = {}


def register(spec: StageSpec) -> StageSpec:
    """Adds a stage kind and returns its declaration: the same declaration again keeps the first, a different one
    for a known kind is a ValueError."""
    known = STAGES.get(spec.kind)
    if known is not None:
        if known != spec:
            raise ValueError(f"stage kind {spec.kind!r} is declared twice, differently ({known.run.__module__} and "
                             f"{spec.run.__module__})")
        return known
    STAGES[spec.kind] = spec
    return spec


def _declared_in(module_name: str) -> None:
    declared = getattr(importlib.import_module(module_name), "STAGES", None)
    if not isinstance(declared, tuple | list) or not all(isinstance(spec, StageSpec) for spec in declared):
        raise ImportError(f"{module_name} declares no STAGES (a tuple of StageSpec), named in {MODULES_VARIABLE}")
    for spec in declared:
        register(spec)


# Job-wide, beside the per-stage objects: which of the cluster's nodes may run the job's stages.
NODES = Parameter("nodes", "list", "hostnames of the cluster's nodes the job may use (default: every online one)",
                  max_items=1024, item=Parameter("hostname", "str", "a node's hostname", maximum=255))


def _spec(kind: str) -> StageSpec:
    try:
        return STAGES[kind]
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; this node knows {', '.join(STAGES)}") from None


def check_job_parameters(stages: list[str], parameters) -> dict:
    """A job's parameters as submitted: ``{"nodes": [...], "<stage>": {...}}`` for the job's own stages, each
    stage's keys as it declares them and none the control plane sets. Raises ParameterError naming the key
    (``sharded_run.tp``)."""
    if not isinstance(parameters, dict):
        raise ParameterError("parameters", "must be a JSON object")
    if nesting_depth(parameters) > MAX_DEPTH:
        raise ParameterError("parameters", f"nest deeper than {MAX_DEPTH} levels")
    cleaned = {}
    for key, value in parameters.items():
        if key == NODES.name:
            cleaned[key] = NODES.clean(value, key, None)
        elif key in stages:
            try:
                cleaned[key] = validate(key, _spec(key).parameters, value)
            except ParameterError as error:
                raise ParameterError(f"{key}.{error.key}" if error.key != key else key, error.message) from None
        else:
            raise ParameterError(key, f"is neither \"nodes\" nor a stage of this job ({', '.join(stages)}); "
                                      "give each stage's parameters under its name, e.g. "
                                      '{"sharded_run": {"tp": 2}}')
    return cleaned


def path_parameters(kind: str) -> list[str]:
    return [parameter.name for parameter in _spec(kind).parameters if parameter.kind == "path"]


def secret_parameters(kind: str) -> list[str]:
    return [parameter.name for parameter in _spec(kind).parameters if parameter.secret]


def describe_parameters() -> dict[str, list[dict]]:
    """What each stage takes, for people (the job form) and tests."""
    return {kind: user_parameters(spec.parameters) for kind, spec in STAGES.items()}


def parameters_json_schema() -> dict:
    """The job's ``parameters`` as JSON Schema, for the OpenAPI document."""
    properties = {NODES.name: NODES.json_schema()}
    for kind, spec in STAGES.items():
        properties[kind] = {"type": "object", "additionalProperties": False, "properties": {
            parameter.name: parameter.json_schema() for parameter in spec.parameters if parameter.set_by == "user"}}
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "description": "Per stage, an object under the stage's name; \"nodes\" limits the nodes."}


def run_stage(kind: str, params: dict, progress: Progress, *, data_roots: tuple[str, ...] = ()) -> dict:
    """Run a stage as the node does: its parameters checked again (what the control plane set included; paths
    under ``data_roots``, the roots this node's operator configured), then the stage."""
    spec = _spec(kind)
    params = validate(kind, spec.parameters, params or {}, control=True, data_roots=data_roots)
    try:
        return spec.run(params, progress)
    except MemoryError as error:  # Python's says nothing ("MemoryError: "); the job's error must say what happened
        raise OutOfMemory(f"out of memory: stage {kind} could not allocate what it asked for (the node's stage "
                          f"memory limit or the machine's RAM){': ' + str(error) if str(error) else ''}") from error


class OutOfMemory(MemoryError):
    """A stage ran out of host memory (its node's stage memory limit, workers/stage_memory.py, or the RAM)."""


for _capability in CAPABILITIES:
    _declared_in(f"{__package__}.{_capability}.stage")
for _module in filter(None, (name.strip() for name in os.environ.get(MODULES_VARIABLE, "").split(","))):
    _declared_in(_module)
