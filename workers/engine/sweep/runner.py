"""``run_sweep``: serve a model under a grid of settings on this node (every configuration, or a successive-halving
subset), each trial served ``repeats`` times and reported as its median run, the best judged by re-measuring the
top candidates (confirmed, or a tie at this noise: ``verdict``), every trial with its serving metrics and its
roofline. Where the paged cache cannot serve the architecture, page size and max batch tokens are not swept."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from .confirm import CONFIRM_TOP, MIN_CONFIRM_TOP, confirm
from .metrics import DEFINITIONS
from .result import BestTrial
from .search import GRID_KEYS, SEARCHES, TrialParams, configurations
from .verdict import CONFIRMED
from .workload import Workload

if TYPE_CHECKING:
    import torch

# One run of a trial can be 6x off another on a busy node (batch 2 measured 132 tok/s, batch 1 815, in one sweep):
# the median of three is the figure, and the spread says how far to trust it.
REPEATS = 3
# The knobs of transformers' paged cache; the static path (the model's own cache) has neither.
PAGED_KNOBS = ("page_size", "max_batch_tokens")


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
    skipped, ``reason``, ``metrics``, ``roofline``, ``details``), ``best`` (the highest median output tokens/s over
    the full workload after re-measuring the top ``confirm_top``, or None; ``confirmed`` only when the verdict is),
    ``verdict`` (``verdict.judge`` over the re-measured runs), ``confirmation`` (the candidates' first-pass and
    re-measured figures), ``knobs_not_swept`` (page size and max batch tokens where the paged cache cannot serve
    the architecture, else None), ``search`` (``strategy``, ``trials_run``, ``seconds``...), ``roofline`` (the
    bandwidth and FLOP/s used, where each came from, their spread when measured here, the per-step ``overhead``
    fit, the formulas), ``model``, ``backend``, ``backends``, ``workload``, ``grid`` and ``metric_definitions``.
    """
    from .backends import BACKENDS, Trial
    from .evaluation import evaluate, with_step_overhead
    from .roofline import hardware_figures

    progress = progress or _no_progress
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, not {search!r}")
    if 0 < confirm_top < MIN_CONFIRM_TOP:
        raise ValueError(f"confirm_top must be at least {MIN_CONFIRM_TOP} (a verdict needs a runner-up served "
                         f"again), or 0 to take the first pass's leader unjudged; not {confirm_top}")
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
    not_swept = None
    if any(len({getattr(params, knob) for params in configs}) > 1 for knob in PAGED_KNOBS):
        progress(0.015, "checking whether the paged cache serves this architecture")
        if not bench.pages(configs):
            configs, not_swept = without_paged_knobs(configs, bench.paged_cache_error)

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
    verdict = confirmation.pop("verdict")
    confirmed = confirmation.pop("best")
    remeasured = confirmed is not None and all(confirmed is not trial for trial in trials)
    figures["overhead"] = with_step_overhead(trials + ([confirmed] if remeasured else []))
    best = best_of(trials, confirmation, confirmed, verdict)
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
        "verdict": verdict,
        "knobs_not_swept": not_swept,
        "roofline": figures,
        "metric_definitions": DEFINITIONS,
    }


def best_of(trials: list[dict], confirmation: dict, confirmed: dict | None, verdict: dict | None) -> dict | None:
    """The stored ``best``: the picked first-pass trial's id and configuration with the figures of its re-measured
    trial (``confirmed``, ``confirm``'s ``best``), the first pass's figure beside them; ``confirmed`` only when the
    verdict is."""
    if confirmed is None:
        return None
    first_pass = next(trial for trial in trials if trial["id"] == confirmation["picked"])
    return BestTrial.from_dict({
        "id": first_pass["id"], "params": first_pass["params"], "metrics": confirmed["metrics"],
        "roofline": confirmed["roofline"], "repeats": confirmed.get("repeats"),
        "first_pass_output_tokens_per_s": first_pass["metrics"]["output_tokens_per_s"],
        "confirmed": bool(verdict) and verdict["verdict"] == CONFIRMED,
        "remeasured": all(confirmed is not trial for trial in trials)}).as_dict()


def without_paged_knobs(configs: list[TrialParams], why: str | None) -> tuple[list[TrialParams], dict]:
    """The configurations a path without a paged cache can tell apart: one per precision and batch size, at the
    grid's first page size and max batch tokens (configurations differing only in those would serve the same
    thing, and their differences would be noise a pick could be made of); and what was not swept, and why."""
    kept: dict[tuple[str, int], TrialParams] = {}
    for params in configs:
        kept.setdefault((params.precision, params.batch_size), params)
    knobs = {knob: {"given": list(dict.fromkeys(getattr(params, knob) for params in configs)),
                    "served_at": getattr(configs[0], knob)}
             for knob in PAGED_KNOBS if len({getattr(params, knob) for params in configs}) > 1}
    return list(kept.values()), {"knobs": knobs, "why": why,
                                 "note": "the paged cache cannot serve this architecture, so trials are served by "
                                         "static batches, where page size and max batch tokens have no effect: "
                                         "they were not swept"}


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
