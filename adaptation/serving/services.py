"""Engine reports as the pages, the API and the downloads read them (the stored results read through the engine's
``ServeSweepResult`` and ``EndpointBenchResult``, their trials through its one row declaration, ``trial_row``), the
recipe as a script (``workers.engine.serving.recipe``), and whether a cluster has a node that serves with a real
engine (then the whole adaptation runs the engine sweep)."""

from __future__ import annotations

from django.http import HttpResponse

from workers.engine.serving.recipe import recipe_script
from workers.engine.sweep.result import EndpointBenchResult, ServeSweepResult
from workers.engine.sweep.trial_row import endpoint_bench_table, serve_sweep_table

from ..choices import NodeStatus
from ..models import Cluster, ServingEndpoint, StageRun
from ..reports import download
from .charts import chart_data

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
    A ValueError (the endpoint was deleted, its key unreadable) fails the job with the reason. The key stays in
    this process: ``jobs.services.send_stage`` seals it to the node (a secret parameter) before the message leaves."""
    endpoint = ServingEndpoint.objects.filter(team=team, pk=endpoint_id).first()
    if endpoint is None:
        raise ValueError(f"no serving endpoint {endpoint_id} in this team (deleted since the job was submitted?)")
    return {"base_url": endpoint.base_url, "served_model": endpoint.served_model, "api_key": endpoint.api_key()}


def recipe_download(run: StageRun) -> HttpResponse:
    """``recipe.sh`` of an engine report, or a 409 saying why the node's report makes none."""
    try:
        script = recipe_script(run.result or {})
    except ValueError as error:
        return HttpResponse(f"No recipe can be written from this report: {error}\n", status=409,
                            content_type="text/plain; charset=utf-8")
    return download(script, "text/x-shellscript", f"d0-recipe-{run.pk}.sh")


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
            "charts": chart_data(run.result or {}), "charts_id": f"engine-charts-{run.pk}",
            "title": f"{result.engine.get('name', 'engine')} serving {run.job.model} on "
                     f"{run.node_name} (job {run.job_id})"}
