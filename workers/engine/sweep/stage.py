"""The ``sweep`` node stage (the proxy sweep: the reduced model on transformers' continuous batching in d0's own
process): what it takes (``PARAMETERS``) and ``sweep_stage``, which runs ``run_sweep`` with them and fails when no
trial served the whole workload."""

from __future__ import annotations

import math

from ..parameters import Parameter, device_string, validate
from ..stage_spec import StageSpec
from .confirm import CONFIRM_TOP, MIN_CONFIRM_TOP
from .runner import REPEATS, run_sweep
from .search import GRID_MAXIMA, MAX_GRID_VALUES, SEARCH_HELP, SEARCHES, grid_values
from .workload import WORKLOAD_BOUNDS, Workload

MAX_CONFIGURATIONS = 4096
MIN_REPEATS = 3
# The proxy's backends (``backends.BACKENDS``, which imports torch, is keyed by these names).
PROXY_BACKENDS = ("transformers",)
# Real serving engines are external programs on the node, served and benchmarked by the serve_sweep stage
# (``workers.engine.serving``); the proxy sweep only ever serves the reduced model in d0's own process.
REAL_ENGINES = ("vllm", "sglang")


def _grid(grid: dict) -> None:
    count = math.prod(len(values) for values in grid_values(grid).values())
    if count > MAX_CONFIGURATIONS:
        raise ValueError(f"the grid has {count} configurations; at most {MAX_CONFIGURATIONS}")


def check_hardware(hardware: dict) -> None:
    unknown = set(hardware) - {"memory_bandwidth_bytes_per_s", "flops_per_s"}
    if unknown:
        raise ValueError(f"takes memory_bandwidth_bytes_per_s and flops_per_s, not {', '.join(sorted(unknown))}")
    flops = hardware.get("flops_per_s", {})
    if not isinstance(flops, dict):
        raise ValueError("flops_per_s maps precisions to FLOP/s")
    figures = [*flops.values(), *([hardware["memory_bandwidth_bytes_per_s"]]
                                  if "memory_bandwidth_bytes_per_s" in hardware else [])]
    if not all(isinstance(value, int | float) and not isinstance(value, bool) and value > 0 for value in figures):
        raise ValueError("figures must be positive numbers (bytes/s, FLOP/s by precision)")


def _backend(name: str) -> None:
    if name in REAL_ENGINES:
        raise ValueError(f"{name} is a real serving engine: run the serve_sweep stage on a node started with "
                         f"--engine {name}=PYTHON (the proxy sweep serves the reduced model on transformers)")
    if name not in PROXY_BACKENDS:
        raise ValueError(f"one of {', '.join(PROXY_BACKENDS)}, not {name!r}")


PARAMETERS = (
    Parameter("config", "object", "the model's config.json (the job's model)", set_by="control"),
    Parameter("grid", "object", "lists of values to try: precision (fp32, bf16, fp16, int8), batch_size, page_size, "
              f"max_batch_tokens (at most {MAX_GRID_VALUES} values each; "
              + ", ".join(f"{key} at most {limit}" for key, limit in GRID_MAXIMA.items()) + ")",
              default={}, check=_grid),
    Parameter("workload", "object", "requests, prompt_len, output_len (fixed, {\"uniform\": [lo, hi]} or a list), "
              "arrival (closed or poisson), rate, concurrency, warmup_requests, slo (" + WORKLOAD_BOUNDS + ")",
              default={}, check=Workload.from_dict),
    Parameter("search", "choice", SEARCH_HELP, default="grid", choices=tuple(SEARCHES)),
    Parameter("repeats", "int", "times each configuration serves its workload; the trial is the median run by "
              "output tokens/s, with every run's figure and the spread beside it", default=REPEATS,
              minimum=MIN_REPEATS, maximum=20),
    Parameter("confirm_top", "int", "the best trials served again (each `repeats` times) to pick the best "
              "configuration by its re-measured median: confirmed when all its runs are above the runner-up's, "
              "else inconclusive at this noise (at least 2: a verdict needs a runner-up)", default=CONFIRM_TOP,
              minimum=MIN_CONFIRM_TOP, maximum=10),
    Parameter("hardware", "object", "memory_bandwidth_bytes_per_s and flops_per_s by precision for the roofline "
              "(default: the node's latest env check)", nullable=True, check=check_hardware),
    Parameter("device", "str", "device to serve on, e.g. cuda:0 (default: the node's first accelerator, else cpu)",
              nullable=True, check=device_string),
    Parameter("reduce", "bool", "serve the reduced model of the architecture (false: the full model)", default=True),
    Parameter("backend", "str", "the proxy's serving backend: transformers' continuous batching (real engines such "
              "as vLLM are the serve_sweep stage)", default="transformers", check=_backend),
)


def sweep_stage(params: dict, progress) -> dict:
    """The sweep as a node stage. ``params``: ``config`` (the config.json dict), optional ``grid``, ``workload``,
    ``search`` ("grid" or "smart"), ``hardware`` (``memory_bandwidth_bytes_per_s`` and ``flops_per_s`` by precision,
    from the node's env check), ``device``, ``reduce`` (default True) and ``backend``. Returns ``run_sweep``'s dict.

    A stage that produced no result has failed: when no trial served the whole workload, it raises SweepFailed
    with what each trial ran into, rather than reporting a sweep without a best configuration as a success."""
    params = validate("sweep", PARAMETERS, params, control=True)
    if not isinstance(params.get("config"), dict):
        raise ValueError("a sweep needs the model's config.json, as a JSON object, in params['config']")
    result = run_sweep(params["config"], grid=params.get("grid") or {}, workload=params.get("workload") or {},
                       search=params.get("search", "grid"), device=params.get("device"),
                       hardware=params.get("hardware"), progress=progress, reduce=params.get("reduce", True),
                       backend=params.get("backend", "transformers"), repeats=params.get("repeats", REPEATS),
                       confirm_top=params.get("confirm_top", CONFIRM_TOP))
    if result["best"] is None:
        raise SweepFailed(result["trials"])
    return result


OUTCOMES = {"oom": "out of memory"}  # a trial's status as the job's error says it


class SweepFailed(RuntimeError):
    """No trial of the sweep served its whole workload; the message counts what the trials ran into."""

    def __init__(self, trials: list[dict]):
        outcomes: dict[str, int] = {}
        for trial in trials:
            reason = (trial.get("reason") or "").strip().splitlines()
            status = OUTCOMES.get(trial.get("status"), trial.get("status", "?"))
            outcome = f"{status}: {reason[0][:200]}" if reason else str(status)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        super().__init__(f"no trial of {len(trials)} completed: " + "; ".join(
            f"{count} × {outcome}" for outcome, count in sorted(outcomes.items(), key=lambda item: -item[1])))


STAGES = (
    StageSpec(kind="sweep", run=sweep_stage, gated=True, needs_model=True, placement="one", parameters=PARAMETERS,
              preload=("torch", "transformers", "workers.engine.models.reducer", "workers.engine.sweep.backends",
                       "workers.engine.sweep.evaluation", "workers.engine.sweep.roofline")),
)
