"""Engine reports as the pages, the API and the downloads read them (the stored results read through the engine's
``ServeSweepResult`` and ``EndpointBenchResult``, their trials through its one row declaration, ``trial_row``), the
recipe for each launcher (``workers.engine.serving.launch_recipes``: bare metal, Slurm, Kubernetes LeaderWorkerSet),
and whether a cluster has a node that serves with a real engine (the whole adaptation ends in the engine's serve
sweep, which needs one)."""

from __future__ import annotations

from django.http import HttpResponse

from workers.engine.serving.launch_recipes import RECIPES, render
from workers.engine.serving.recipe import number
from workers.engine.sweep.result import EndpointBenchResult, ServeSweepResult
from workers.engine.sweep.trial_row import endpoint_bench_table, serve_sweep_table

from ..choices import NodeStatus
from ..models import Cluster, ServingEndpoint, StageRun
from ..reports import download
from .charts import chart_data, quality_chart_data

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


# ---- The "Validated against the reference" section, read from a node's result (``serving.quality``): each value is
# taken only in the shape the page expects (a figure a number, a sentence a string, a list a list), so a node's odd
# result shows less, never breaks the page; the template escapes every string.

# The figures each pass (alone, batched) is held to, as ``reference_check.THRESHOLDS`` names them, and the side of
# the limit that passes.
ANSWER_FIGURES = (("top1_agreement", "top-1 agreement", "≥"), ("mean_abs_logprob", "mean |Δ logprob|", "≤"),
                  ("max_abs_logprob", "max |Δ logprob|", "≤"), ("mean_topk_kl", "mean top-k KL", "≤"))
# Per-item samples shown per numerics (the JSON download has them all).
SAMPLES_SHOWN = 200
TEXT_CHARS = 2000


def _object(value) -> dict:
    return value if isinstance(value, dict) else {}


def _objects(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(value) -> str | None:
    return value[:TEXT_CHARS] if isinstance(value, str) else None


def _texts(value) -> list[str]:
    return [item[:TEXT_CHARS] for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _flag(value) -> bool | None:
    return value if isinstance(value, bool) else None


def _pick(data, texts=(), figures=(), flags=()) -> dict:
    """The named strings, numbers and booleans of a stored object (None where the node sent another type)."""
    data = _object(data)
    return {**{key: _text(data.get(key)) for key in texts}, **{key: number(data.get(key)) for key in figures},
            **{key: _flag(data.get(key)) for key in flags}}


def _accuracy(stored) -> dict | None:
    """An lm-eval result (measured, or a published score) or its failure."""
    if not isinstance(stored, dict):
        return None
    return _pick(stored, texts=("source", "task", "harness", "error"),
                 figures=("accuracy", "n", "stderr", "wilson_lower_95", "seconds"))


def _samples(served, reference) -> list[dict]:
    """The served side's per-item samples beside the reference's for the same document (by ``doc_id``)."""
    def side(sample: dict) -> dict:
        return _pick(sample, texts=("chosen",), flags=("correct",))

    theirs = {str(sample.get("doc_id")): sample for sample in _objects(_object(reference).get("samples"))}
    rows = []
    for sample in _objects(_object(served).get("samples"))[:SAMPLES_SHOWN]:
        doc_id = sample.get("doc_id")
        rows.append({"doc_id": doc_id if isinstance(doc_id, int | str) else None,
                     **_pick(sample, texts=("prompt", "target")), "served": side(sample),
                     "reference": side(theirs[str(doc_id)]) if str(doc_id) in theirs else None})
    return rows


def _answers(correctness: dict) -> dict:
    """Both passes' figures against the limits they were held to, one row per figure, and the rest of each pass."""
    limits = _object(correctness.get("thresholds"))
    passes = {mode: _object(correctness.get(mode)) for mode in ("single", "batched")}
    rows = []
    for key, name, side in ANSWER_FIGURES:
        limit = number(limits.get(key))
        row = {"name": name, "side": side, "limit": limit}
        for mode, figures in passes.items():
            value = number(figures.get(key))
            row[mode] = value
            row[f"{mode}_within"] = None if value is None or limit is None else (
                value >= limit if side == "≥" else value <= limit)
        rows.append(row)
    return {"rows": rows, **{mode: _pick(figures, figures=("tokens_compared", "prompts_diverging", "max_topk_kl"))
                             for mode, figures in passes.items()}}


def _diverging(row) -> dict | None:
    if not isinstance(row, dict):
        return None
    return _pick(row, texts=("prompt", "reference_answer", "engine_answer"),
                 figures=("first_divergence", "reference_margin"))


def _correctness(stored: dict) -> dict:
    parity = _object(stored.get("parity"))
    mismatches = [_pick(row, texts=("prompt", "reference_text", "engine_text"),
                        figures=("position", "reference_tokens", "engine_tokens"))
                  for row in _objects(parity.get("mismatches"))]
    weights = stored.get("weights_versus_reference")
    return {**_pick(stored, texts=("verdict", "precision_class")), "reasons": _texts(stored.get("reasons")),
            "parity": {**_pick(parity, figures=("prompts",), flags=("equal",)), "mismatches": mismatches,
                       "first": mismatches[0] if mismatches else None} if parity else None,
            "answers": _answers(stored),
            "first_diverging_prompt": _diverging(stored.get("first_diverging_prompt")),
            "weights": None if not isinstance(weights, dict) else {
                **_pick(weights, figures=("compared", "differing_count")),
                "differing": [_pick(row, texts=("name",), figures=("max_abs_difference", "reference_max_abs"))
                              for row in _objects(weights.get("differing"))]}}


def _entry(stored: dict, reference_accuracy, chosen: str | None) -> dict:
    variant = stored.get("variant")
    perplexity = _object(stored.get("perplexity"))
    label = _text(stored.get("label"))
    return {"label": label, "chosen": label is not None and label == chosen,
            **_pick(stored, texts=("verdict",)), "reasons": _texts(stored.get("reasons")),
            "variant": _pick(variant, texts=("name", "method", "made_by", "path"),
                             figures=("bits", "threshold", "disk_bytes")) if isinstance(variant, dict) else None,
            "correctness": _correctness(_object(stored.get("correctness"))),
            "accuracy": _accuracy(stored.get("accuracy")),
            "samples": _samples(stored.get("accuracy"), reference_accuracy),
            "perplexity": {**_pick(perplexity, texts=("error",), figures=("word_perplexity",))} if perplexity
            else None,
            "gate": _pick(stored["gate"], texts=("rule", "reference_source"), flags=("passed",),
                          figures=("served_wilson_lower", "reference_accuracy", "max_drop_points"))
            if isinstance(stored.get("gate"), dict) else None,
            "recovery": _pick(stored["recovery"], texts=("rule", "against"), flags=("passed",),
                              figures=("accuracy_pct", "delta_perplexity", "top1_agreement", "threshold_pct"))
            if isinstance(stored.get("recovery"), dict) else None}


def _variant_row(row: dict, index: int) -> dict:
    recovery = _object(row.get("recovery"))
    return {"number": index, **_pick(row, texts=("label", "method", "verdict"), flags=("recommended",),
                                     figures=("bits", "disk_bytes", "output_tokens_per_s", "peak_memory_bytes",
                                              "accuracy", "word_perplexity", "top1_agreement")),
            "reasons": _texts(row.get("reasons")),
            "recovery": _pick(recovery, texts=("against",), flags=("passed",),
                              figures=("accuracy_pct", "threshold_pct")) if recovery else None}


def validation(stored: dict) -> dict:
    """What the report's "Validated against the reference" section and its Variants table show: on real weights the
    reference, the accuracy settings and each numerics' entry (the chosen one marked), the variants' rows numbered
    as the quality-against-speed chart numbers its points; on random weights only that nothing was checked."""
    quality = _object(stored.get("quality"))
    correctness = _object(stored.get("correctness"))
    entries = quality.get("entries")
    if not isinstance(entries, list):
        random_weights = _object(stored.get("weights")).get("kind") == "validation checkpoint"
        return {"checked": False, "random_weights": random_weights or "note" in quality}
    reference = _object(quality.get("reference"))
    chosen = _text(correctness.get("numerics")) if correctness.get("kind") == "real weights" else None
    return {"checked": True,
            "reference": {**_pick(reference, texts=("implementation", "dtype", "checkpoint"),
                                  figures=("tokens", "top_k", "seconds")),
                          "prompts": [_pick(prompt, texts=("name", "answer"), figures=("prompt_tokens",))
                                      for prompt in _objects(reference.get("prompts"))],
                          "accuracy": _accuracy(reference.get("accuracy"))},
            "accuracy": _pick(quality.get("accuracy"), texts=("task", "perplexity_task"),
                              figures=("max_drop_points",)) if isinstance(quality.get("accuracy"), dict) else None,
            "entries": [_entry(entry, reference.get("accuracy"), chosen) for entry in _objects(entries)],
            "variants": [_variant_row(row, index) for index, row in enumerate(_objects(stored.get("variants")), 1)]}


def report_context(run: StageRun) -> dict:
    result = ServeSweepResult.from_dict(run.result)
    validated = validation(run.result or {})
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
            "validation": validated, "quality_chart": quality_chart_data(validated),
            "quality_chart_id": f"engine-quality-{run.pk}",
            "title": f"{result.engine.get('name', 'engine')} serving {run.job.model} on "
                     f"{run.node_name} (job {run.job_id})"}
