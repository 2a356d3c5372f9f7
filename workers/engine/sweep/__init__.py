"""Tuning sweeps and benchmark reports: serve a model under a grid of engine settings and report, per trial, the
serving metrics (TTFT, TPOT, ITL, E2E latency, throughput, goodput, peak memory; vLLM's definitions, see
``metrics``) and a roofline (predicted ceiling time, efficiency, memory- or compute-bound; see ``roofline``).

Every trial is served ``repeats`` (>= 3) times and reported as its median run with the spread; the best
configuration is confirmed by re-measuring the search's top candidates (``confirm``); the roofline's ceilings are
the node's latest env check (the control plane passes them) or measured the env check's way, and its per-step
overhead is fitted over the sweep's smallest trials and reported (``roofline``).

``run_sweep(config, grid=..., workload=..., search="grid"|"smart")`` is the entry point; ``sweep_stage`` is the same
as a node stage. Plain Python + torch + transformers: no Django, so it runs on bare GPU nodes. Importing the package
imports neither (the stage's ``PARAMETERS`` are checked by the control plane and the web tier): the backends, the
roofline and torch are imported when a sweep runs.

    grid = {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16, 32],
            "max_batch_tokens": [256]}
    workload = {"requests": 16, "prompt_len": 32, "output_len": {"uniform": [8, 24]}, "arrival": "closed",
                "slo": {"ttft_s": 0.5, "tpot_s": 0.05}}
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from ..parameters import Parameter, device_string, validate
from .confirm import CONFIRM_TOP, confirm
from .metrics import DEFINITIONS
from .search import GRID_KEYS, SEARCH_HELP, SEARCHES, TrialParams, configurations
from .workload import Workload

if TYPE_CHECKING:
    import torch

MAX_CONFIGURATIONS = 4096
# One run of a trial can be 6x off another on a busy node (issue 14 saw batch 2 at 132 tok/s, batch 1 at 815): the
# median of three is the figure, and the spread says how far to trust it.
REPEATS = 3
MIN_REPEATS = 3
# The proxy's backends (``backends.BACKENDS``, which imports torch, is keyed by these names).
PROXY_BACKENDS = ("transformers",)
# Real serving engines are external programs on the node, served and benchmarked by the serve_sweep stage
# (``workers.engine.serving``); the proxy sweep only ever serves the reduced model in d0's own process.
REAL_ENGINES = ("vllm", "sglang")


def _grid(grid: dict) -> None:
    count = len(configurations(grid))
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
              "max_batch_tokens", default={}, check=_grid),
    Parameter("workload", "object", "requests, prompt_len, output_len (fixed, {\"uniform\": [lo, hi]} or a list), "
              "arrival (closed or poisson), rate, concurrency, warmup_requests, slo", default={},
              check=Workload.from_dict),
    Parameter("search", "choice", SEARCH_HELP, default="grid", choices=tuple(SEARCHES)),
    Parameter("repeats", "int", "times each configuration serves its workload; the trial is the median run by "
              "output tokens/s, with every run's figure and the spread beside it", default=REPEATS,
              minimum=MIN_REPEATS, maximum=20),
    Parameter("confirm_top", "int", "the best trials served again (each `repeats` times) to pick the best "
              "configuration by its re-measured median", default=CONFIRM_TOP, minimum=1, maximum=10),
    Parameter("hardware", "object", "memory_bandwidth_bytes_per_s and flops_per_s by precision for the roofline "
              "(default: the node's latest env check)", nullable=True, check=check_hardware),
    Parameter("device", "str", "device to serve on, e.g. cuda:0 (default: the node's first accelerator, else cpu)",
              nullable=True, check=device_string),
    Parameter("reduce", "bool", "serve the reduced model of the architecture (false: the full model)", default=True),
    Parameter("backend", "str", "the proxy's serving backend: transformers' continuous batching (real engines such "
              "as vLLM are the serve_sweep stage)", default="transformers", check=_backend),
)


def resolve_device(device) -> torch.device:
    """The device to serve on: the given one, else the first accelerator torch sees, else the CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu", 0)
    return torch.device("cpu")


def _no_progress(fraction: float, message: str) -> None:
    pass


def repeated(run_once, repeats: int) -> dict:
    """The trial of ``repeats`` runs: the median run by output tokens/s (its figures are one real run's, all of a
    piece), with every run's throughput and the spread ((max - min) / median) added as ``repeats``. A run that fails
    ends the repeats: the failure is the trial."""
    runs = []
    for _ in range(repeats):
        trial = run_once()
        if trial["status"] != "ok":
            return trial
        runs.append(trial)
    runs.sort(key=lambda trial: trial["metrics"]["output_tokens_per_s"])
    chosen = runs[(len(runs) - 1) // 2]
    figures = [trial["metrics"]["output_tokens_per_s"] for trial in runs]
    median = chosen["metrics"]["output_tokens_per_s"]
    chosen["repeats"] = {"count": len(runs), "output_tokens_per_s": figures, "min": figures[0], "max": figures[-1],
                         "median": median, "spread": (figures[-1] - figures[0]) / median if median else None,
                         "ttft_p50_s": [trial["metrics"]["ttft_s"]["p50"] for trial in runs]}
    return chosen


def run_sweep(config: dict, *, grid: dict, workload: dict, search: str = "grid", device=None,
              hardware: dict | None = None, progress=None, reduce: bool = True, backend: str = "transformers",
              repeats: int = REPEATS, confirm_top: int = CONFIRM_TOP) -> dict:
    """Run the grid's configurations (all of them, or a successive-halving subset with ``search="smart"``).

    Returns ``trials`` (each: ``id``, ``rung``, ``params``, ``workload``, ``status`` ok/oom/unsupported/failed/
    skipped, ``reason``, ``metrics``, ``roofline``, ``details``), ``best`` (the highest output tokens/s over the full
    workload after re-measuring the top ``confirm_top``, or None), ``confirmation`` (the candidates' first-pass and
    re-measured figures), ``search`` (``strategy``, ``trials_run``, ``seconds``...), ``roofline`` (the bandwidth and
    FLOP/s used, where each came from, their spread when measured here, the per-step ``overhead`` fit, the formulas),
    ``model``, ``backend``, ``backends``, ``workload``, ``grid`` and ``metric_definitions``.
    """
    from .backends import BACKENDS, Trial
    from .evaluation import evaluate, with_step_overhead
    from .roofline import hardware_figures

    progress = progress or _no_progress
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, not {search!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    parsed_workload = Workload.from_dict(workload)
    configs = configurations(grid)
    torch_device = resolve_device(device)
    if not BACKENDS[backend].available():
        raise RuntimeError(BACKENDS[backend].unavailable_reason())
    progress(0.0, "reducing the model" if reduce else "reading the model config")
    bench = BACKENDS[backend](config, device=torch_device, reduce=reduce)
    progress(0.01, "measuring the device for the roofline" if not hardware else "reading the hardware figures")
    figures = hardware_figures(hardware, torch_device, sorted({params.precision for params in configs}))

    def run_trial(params: TrialParams, trial_workload: Workload) -> dict:
        return repeated(lambda: evaluate(bench.run(Trial(params, trial_workload)), trial_workload, figures),
                        repeats)

    # transformers' manager runs gc.collect() twice on every stop, which costs more than a short trial once the
    # process holds torch and transformers; frozen objects are skipped (vLLM's serving benchmark freezes the heap
    # the same way). Only sweep time changes: the collections happen after each trial's measured window.
    gc.collect()
    gc.freeze()
    try:
        outcome = SEARCHES[search](configs, parsed_workload, run_trial,
                                   lambda fraction, message: progress(0.02 + 0.95 * fraction, message))
        trials = outcome.pop("trials")
        progress(0.97, f"confirming the best by re-measuring the top {confirm_top}")
        confirmation = confirm(trials, parsed_workload.requests,
                               lambda trial: run_trial(TrialParams(**trial["params"]), parsed_workload), confirm_top)
    finally:
        gc.unfreeze()
    progress(1.0, "done")
    # The overhead is fitted over every trial that ran, the confirmation runs included, and taken out of each.
    confirmed = confirmation.pop("best")
    remeasured = confirmed is not None and all(confirmed is not trial for trial in trials)
    figures["overhead"] = with_step_overhead(trials + ([confirmed] if remeasured else []))
    best = None
    if confirmed is not None:
        first_pass = next(trial for trial in trials if trial["id"] == confirmation["picked"])
        best = {"id": first_pass["id"], "params": first_pass["params"], "metrics": confirmed["metrics"],
                "roofline": confirmed["roofline"], "repeats": confirmed.get("repeats"),
                "first_pass_output_tokens_per_s": first_pass["metrics"]["output_tokens_per_s"],
                "confirmed": remeasured}
    return {
        "model": bench.model_description,
        "backend": bench.describe(),
        "serving_paths": _serving_paths(trials),
        "backends": {name: {"available": cls.available(), "unavailable_reason": cls.unavailable_reason()}
                     for name, cls in BACKENDS.items()},
        "grid": {key: list(dict.fromkeys(getattr(params, key) for params in configs)) for key in GRID_KEYS},
        "workload": parsed_workload.as_dict(),
        "search": outcome,
        "repeats": repeats,
        "trials": trials,
        "best": best,
        "confirmation": confirmation,
        "roofline": figures,
        "metric_definitions": DEFINITIONS,
    }


def _serving_paths(trials: list[dict]) -> dict:
    """Which path served how many trials, and why a trial was not served by the paged cache: numbers from static
    batches measure another thing (no paging, waves instead of continuous batching), so the report says so."""
    paths: dict = {}
    for trial in trials:
        details = trial.get("details") or {}
        if trial.get("status") != "ok":
            continue
        path = details.get("serving_path", "continuous batching with a paged KV cache")
        entry = paths.setdefault(path, {"trials": 0, "why": details.get("paged_cache_error")})
        entry["trials"] += 1
    return paths


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


class SweepFailed(RuntimeError):
    """No trial of the sweep served its whole workload; the message counts what the trials ran into."""

    def __init__(self, trials: list[dict]):
        outcomes: dict[str, int] = {}
        for trial in trials:
            reason = (trial.get("reason") or "").strip().splitlines()
            outcome = f"{trial.get('status', '?')}: {reason[0][:200]}" if reason else str(trial.get("status", "?"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        super().__init__(f"no trial of {len(trials)} completed: " + "; ".join(
            f"{count} × {outcome}" for outcome, count in sorted(outcomes.items(), key=lambda item: -item[1])))
