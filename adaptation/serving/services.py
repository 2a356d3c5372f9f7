"""Engine reports as the pages, the API and the downloads read them (the stored results read through the engine's
``ServeSweepResult`` and ``EndpointBenchResult``, their trials through its one row declaration, ``trial_row``), the
recipe as a script, and whether a cluster has a node that serves with a real engine (then the whole adaptation runs
the engine sweep)."""

from __future__ import annotations

import shlex

from workers.engine.sweep.result import EndpointBenchResult, ServeSweepResult
from workers.engine.sweep.trial_row import endpoint_bench_table, serve_sweep_table

from ..choices import NodeStatus
from ..models import Cluster, ServingEndpoint, StageRun

ENGINE_REPORT_KIND = "serve_sweep"
ENDPOINT_REPORT_KIND = "endpoint_bench"
# The whole adaptation's engine sweep: four engine starts (max-num-seqs x block size), a short closed-loop
# workload; teams give their own grid and SLOs through the job form or the API.
ADAPTATION_SERVE_SWEEP = {"grid": {"max_num_seqs": [2, 4], "block_size": [32, 64]},
                          "workload": {"requests": 8, "prompt_len": 32, "output_len": 16}}


def engine_of(host_facts: dict, name: str = "vllm") -> dict | None:
    """The node's usable engine of that name, as its registration reported it."""
    for engine in host_facts.get("engines") or []:
        if isinstance(engine, dict) and engine.get("name") == name and engine.get("usable"):
            return engine
    return None


def cluster_serves(cluster: Cluster, name: str = "vllm") -> bool:
    return any(engine_of(node.host_facts or {}, name)
               for node in cluster.nodes.filter(status=NodeStatus.ONLINE))


def endpoint_parameters(team, endpoint_id) -> dict:
    """What the control plane adds to an ``endpoint_bench`` stage: the team's endpoint's URL, model and API key.
    A ValueError (the endpoint was deleted, its key unreadable) fails the job with the reason."""
    endpoint = ServingEndpoint.objects.filter(team=team, pk=endpoint_id).first()
    if endpoint is None:
        raise ValueError(f"no serving endpoint {endpoint_id} in this team (deleted since the job was submitted?)")
    return {"base_url": endpoint.base_url, "served_model": endpoint.served_model, "api_key": endpoint.api_key()}


def recipe_script(result: dict) -> str:
    """The recipe as a shell script: the engine's exact command and environment, with the checkpoint folder given
    by $MODEL when d0 served a validation checkpoint of its own (its folder lived only for the stage)."""
    recipe = result["recipe"]
    command = shlex.split(recipe["command"])
    while command and "=" in command[0] and not command[0].startswith("-"):
        command.pop(0)  # the environment is written out below, one variable per line
    quoted = [shlex.quote(part) for part in command]
    weights = recipe.get("weights") or {}
    lines = ["#!/bin/sh", f"# d0 deployment recipe: {recipe['engine']} {recipe.get('version') or ''}".rstrip(),
             f"# measured: {recipe['measured'].get('output_tokens_per_s') or 0:.1f} output tokens/s, "
             f"engine start {recipe.get('startup_s') or 0:.0f} s (trial {recipe['trial']})",
             f"# weights: {weights.get('kind', '?')}"]
    predicted = recipe.get("prediction") or {}
    if predicted.get("available"):
        lines.append(f"# roofline ceiling: {predicted['predicted_output_tokens_per_s']:.1f} output tokens/s "
                     f"({predicted['precision']}, {predicted['bound']}, from the node's env check)")
    if weights.get("kind") != "checkpoint" and "--model" in command:
        quoted[command.index("--model") + 1] = '"${MODEL:?the checkpoint folder}"'
        lines.append("# d0 served a validation checkpoint (reduced, random weights): set MODEL to your checkpoint")
    if "--port" in command:
        quoted[command.index("--port") + 1] = '"${PORT:-8000}"'
    lines += [f"export {key}={shlex.quote(str(value))}" for key, value in sorted(recipe["env"].items())]
    lines.append("exec " + " ".join(quoted))
    return "\n".join(lines) + "\n"


def endpoint_report_context(run: StageRun) -> dict:
    result = EndpointBenchResult.from_dict(run.result)
    endpoint = result.endpoint
    return {"run": run, "result": result, "endpoint": endpoint, "best": result.best,
            "table": endpoint_bench_table(result),
            "title": f"{endpoint.get('served_model', 'endpoint')} at {endpoint.get('base_url', '?')} "
                     f"(model {run.job.model}, client on {run.node_name}, job {run.job_id})"}


def report_context(run: StageRun) -> dict:
    result = ServeSweepResult.from_dict(run.result)
    return {"run": run, "result": result, "recipe": result.recipe,
            "prediction_efficiency": result.prediction_efficiency, "engine": result.engine,
            "weights": result.weights, "tensors": result.tensors,
            "correctness": result.correctness or {}, "table": serve_sweep_table(result),
            "title": f"{result.engine.get('name', 'engine')} serving {run.job.model} on "
                     f"{run.node_name} (job {run.job_id})"}
