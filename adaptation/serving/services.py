"""Engine reports as the pages, the API and the downloads read them (the stored results read through the engine's
``ServeSweepResult`` and ``EndpointBenchResult``, their trials through its one row declaration, ``trial_row``), the
recipe for each launcher (``workers.engine.serving.launch_recipes``: bare metal, Slurm, Kubernetes LeaderWorkerSet),
and whether a cluster has a node that serves with a real engine (the whole adaptation ends in the engine's serve
sweep, which needs one)."""

from __future__ import annotations

from django.http import HttpResponse

from workers.engine.serving.launch_recipes import RECIPES, render
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
# On real weights the adaptation's sweep is over the variants (each checked against the reference and gated on
# accuracy) at one engine configuration: each variant is an engine start, and a wider grid is the serve sweep's
# own stage to run.
ADAPTATION_REAL_WEIGHTS = {"grid": {"max_num_seqs": [4], "block_size": [64]},
                           "variants": ["as_shipped", "w8a8-int8", "w4a16"],
                           "workload": {"requests": 8, "prompt_len": 32, "output_len": 16}}


def engine_of(host_facts: dict, name: str = "vllm") -> dict | None:
    """The node's usable engine of that name, as its registration reported it."""
    for engine in host_facts.get("engines") or []:
        if isinstance(engine, dict) and engine.get("name") == name and engine.get("usable"):
            return engine
    return None


# What the whole adaptation's log says when no node offers an engine yet (its serve sweep then cannot be placed).
NO_ENGINE = ("no online node of this cluster offers vLLM: start a node worker with --engine vllm=/path/to/its/python "
             "(scripts/vllm-env.sh makes that environment; `make run` prepares it for its local node)")


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


# Each launcher's download (launch_recipes.RECIPES): its content type and file name after "d0-recipe-<id>".
RECIPE_FILES = {"shell": ("text/x-shellscript", ".sh"), "slurm": ("text/x-shellscript", ".sbatch"),
                "lws": ("application/yaml", "-lws.yaml")}
RECIPE_LAUNCHERS = tuple(RECIPES)


def recipe_download(run: StageRun, launcher: str = "shell") -> HttpResponse:
    """An engine report's recipe for ``launcher`` (one of ``RECIPE_LAUNCHERS``: the bare-metal script, the Slurm
    batch script, the LeaderWorkerSet manifest), or a 409 saying why the node's report makes none."""
    content_type, suffix = RECIPE_FILES[launcher]
    try:
        text = render(run.result or {}, launcher, name=f"d0-engine-{run.pk}")
    except ValueError as error:
        return HttpResponse(f"No recipe can be written from this report: {error}\n", status=409,
                            content_type="text/plain; charset=utf-8")
    return download(text, content_type, f"d0-recipe-{run.pk}{suffix}")


def endpoint_report_context(run: StageRun) -> dict:
    result = EndpointBenchResult.from_dict(run.result)
    endpoint = result.endpoint
    return {"run": run, "result": result, "endpoint": endpoint, "best": result.best,
            "table": endpoint_bench_table(result),
            "title": f"{endpoint.get('served_model', 'endpoint')} at {endpoint.get('base_url', '?')} "
                     f"(model {run.job.model}, client on {run.node_name}, job {run.job_id})"}


def deployment_line(deployment, settings) -> str:
    """"tp=2 over 2 nodes (node-a, node-b)": the served layout and where, from a stored (node-reported) result."""
    deployment = deployment if isinstance(deployment, dict) else {}
    settings = settings if isinstance(settings, dict) else {}
    names = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp"}
    shape = [f"{short}={settings[key]}" for key, short in names.items()
             if isinstance(settings.get(key), int) and settings[key] > 1]
    if settings.get("enable_expert_parallel") is True:
        shape.append("ep")
    nodes = deployment.get("nodes") if isinstance(deployment.get("nodes"), int) else 1
    hostnames = [str(name)[:64] for name in deployment.get("hostnames") or [] if isinstance(name, str)]
    where = f"over {nodes} nodes ({', '.join(hostnames)})" if nodes > 1 else "on one node"
    return f"{' '.join(shape) or 'tp=1'} {where}"


def report_context(run: StageRun) -> dict:
    result = ServeSweepResult.from_dict(run.result)
    deployment = run.result.get("deployment") if isinstance(run.result.get("deployment"), dict) else {}
    plan = run.result.get("plan") if isinstance(run.result.get("plan"), dict) else {}
    try:  # over several nodes, each node's command (the bare-metal recipe) stands where one command stood
        node_script = render(run.result, "shell") if (deployment.get("nodes") or 1) > 1 else None
    except ValueError:
        node_script = None
    return {"run": run, "result": result, "recipe": result.recipe, "node_script": node_script,
            "deployment_line": deployment_line(deployment, (result.recipe or {}).get("settings")),
            "plan_why": plan.get("why") if isinstance(plan.get("why"), str) else None,
            "prediction_efficiency": result.prediction_efficiency, "engine": result.engine,
            "weights": result.weights, "tensors": result.tensors,
            "correctness": result.correctness or {}, "table": serve_sweep_table(result),
            "charts": chart_data(run.result or {}), "charts_id": f"engine-charts-{run.pk}",
            "title": f"{result.engine.get('name', 'engine')} serving {run.job.model} on "
                     f"{run.node_name} (job {run.job_id})"}
