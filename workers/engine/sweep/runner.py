"""``run_sweep``: serve a model under a grid of settings on this node (every configuration, or a successive-halving
subset), each trial served ``repeats`` times and reported as its median run, the best confirmed by re-measuring the
top candidates, every trial with its serving metrics and its roofline."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from .confirm import CONFIRM_TOP, confirm
from .metrics import DEFINITIONS
from .result import BestTrial
from .search import GRID_KEYS, SEARCHES, TrialParams, configurations
from .workload import Workload

if TYPE_CHECKING:
    import torch

# One run of a trial can be 6x off another on a busy node (batch 2 measured 132 tok/s, batch 1 815, in one sweep):
# the median of three is the figure, and the spread says how far to trust it.
REPEATS = 3


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
        best = BestTrial.from_dict({
            "id": first_pass["id"], "params": first_pass["params"], "metrics": confirmed["metrics"],
            "roofline": confirmed["roofline"], "repeats": confirmed.get("repeats"),
            "first_pass_output_tokens_per_s": first_pass["metrics"]["output_tokens_per_s"],
            "confirmed": remeasured}).as_dict()
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
