"""The stage kinds a node can run, each a function ``(params, progress) -> result dict`` with its declared
parameters (``parameters.Parameter``).

``progress(fraction, message)`` reports how far the stage is (0..1). The control plane's choices, its check of a
job's parameters, the job form, the OpenAPI schema and the node task all read this registry, so a kind and what it
takes exist in one place. Importing it imports neither torch nor transformers (the web tier reads it in every
process): each capability package declares its stages without them and imports them when a stage runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import coverage, envcheck, serving, sharding, sweep
from .envcheck import report as envcheck_report
from .parameters import MAX_DEPTH, Parameter, ParameterError, nesting_depth, user_parameters, validate

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
    parameters: tuple[Parameter, ...] = ()
    # A stage that ends in milliseconds (a probe of the host): the node sends no "started" report for it, its
    # "finished" one says how long it ran, so the control plane takes one report instead of two.
    instant: bool = False


STAGES: dict[str, StageSpec] = {
    "env_probe": StageSpec(envcheck.env_probe, gated=False, instant=True),
    "env_check": StageSpec(envcheck.env_check, gated=False, parameters=envcheck_report.PARAMETERS),
    "op_coverage": StageSpec(coverage.op_coverage, gated=True, needs_model=True,
                             parameters=coverage.PARAMETERS),
    "sharded_run": StageSpec(sharding.shard_stage, gated=True, needs_model=True, placement="group",
                             parameters=sharding.PARAMETERS),
    "sweep": StageSpec(sweep.sweep_stage, gated=True, needs_model=True, placement="one", parameters=sweep.PARAMETERS),
    "serve_sweep": StageSpec(serving.serve_sweep, gated=True, needs_model=True, placement="one",
                             parameters=serving.PARAMETERS),
    # Only a client runs (the endpoint is someone else's server), so the node needs no fresh env check.
    "endpoint_bench": StageSpec(serving.endpoint_bench, gated=False, needs_model=True, placement="one",
                                parameters=serving.ENDPOINT_PARAMETERS),
}
STAGE_KINDS = tuple(STAGES)
# Job-wide, beside the per-stage objects: which of the cluster's nodes may run the job's stages.
NODES = Parameter("nodes", "list", "hostnames of the cluster's nodes the job may use (default: every online one)",
                  max_items=1024, item=Parameter("hostname", "str", "a node's hostname", maximum=255))


def _spec(kind: str) -> StageSpec:
    try:
        return STAGES[kind]
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; this node knows {', '.join(STAGE_KINDS)}") from None


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
    return spec.run(validate(kind, spec.parameters, params or {}, control=True, data_roots=data_roots), progress)
