"""Which configurations a sweep runs: the full grid (the baseline), or a smarter search.

The smart search is successive halving (Jamieson and Talwalkar 2016; Hyperband's inner loop, Li et al. 2018): every
configuration first serves a short workload, the best 1/ETA by output tokens/s go on to a workload ETA times longer,
and so on until the survivors serve the full workload, so configurations already dominated on a short run are
stopped early. Each rung costs about the same, so with N configurations the search costs about log_ETA(N) + 1 full
workloads instead of N. It also never runs a configuration at least as large as one that ran out of memory: the
same precision with a batch size, page size and max batch tokens all at least as large needs at least as much memory
(the paged cache holds batch_size x (sequence + page) tokens, activations grow with max_batch_tokens).

Both searches run over any kind of configuration described by a ``Space``: the proxy sweep's ``TrialParams``
(``PROXY``) and a real engine's settings (``serving.serve_sweep``'s ``ENGINE_SPACE``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .workload import Workload

GRID_KEYS = ("precision", "batch_size", "page_size", "max_batch_tokens")
GRID_DEFAULTS = {"precision": ["fp32"], "batch_size": [1, 2, 4], "page_size": [16], "max_batch_tokens": [256]}
OBJECTIVE = "output_tokens_per_s"
ETA = 3


@dataclass(frozen=True)
class TrialParams:
    """One configuration. ``batch_size``: requests served per step at most (transformers' max_requests_per_batch,
    vLLM's max_num_seqs), and the closed loop's concurrency unless the workload sets its own; ``page_size``: tokens
    per KV-cache page (block); ``max_batch_tokens``: tokens per forward step at most (longer prefills are chunked);
    ``precision``: fp32, bf16, fp16 or int8 (dynamic)."""

    precision: str
    batch_size: int
    page_size: int
    max_batch_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


RunTrial = Callable[[Any, Workload], dict]
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Space:
    """What the search needs to know of a kind of configuration (the proxy's ``TrialParams``, an engine's
    settings): a label for progress, the stored form, the batch a short run must still fill, whether a trial ran
    out of memory, and whether a configuration is at least as large as one that did (so it would too)."""

    label: Callable[[Any], str]
    as_dict: Callable[[Any], dict]
    batch_size: Callable[[Any], int]
    out_of_memory: Callable[[dict], bool]
    at_least_as_large: Callable[[Any, dict], bool]
    skipped: Callable[[Any, str], dict]


def configurations(grid: dict | None) -> list[TrialParams]:
    """Every combination of the grid's values, precision outermost (so a backend rebuilds its model least often)."""
    grid = dict(grid or {})
    unknown = set(grid) - set(GRID_KEYS)
    if unknown:
        raise ValueError(f"unknown grid keys: {', '.join(sorted(unknown))}; known: {', '.join(GRID_KEYS)}")
    values = {key: grid.get(key, GRID_DEFAULTS[key]) for key in GRID_KEYS}
    for key, options in values.items():
        if not isinstance(options, list) or not options:
            raise ValueError(f"grid {key} must be a non-empty list, not {options!r}")
        if key == "precision":
            if not all(isinstance(option, str) for option in options):
                raise ValueError(f"grid precision takes names such as fp32 or bf16, not {options!r}")
        elif not all(isinstance(option, int) and not isinstance(option, bool) and option >= 1 for option in options):
            raise ValueError(f"grid {key} takes positive ints, not {options!r}")
    return [TrialParams(*combination) for combination in itertools.product(*(values[key] for key in GRID_KEYS))]


def label(params: TrialParams) -> str:
    return (f"{params.precision} batch {params.batch_size} page {params.page_size} "
            f"max tokens {params.max_batch_tokens}")


def throughput(trial: dict) -> float:
    return trial["metrics"][OBJECTIVE]


def best_trial(trials: list[dict], workload: Workload) -> dict | None:
    """The highest-throughput trial among those that served the full workload."""
    finished = [trial for trial in trials
                if trial["status"] == "ok" and trial["workload"]["requests"] == workload.requests]
    return max(finished, key=throughput, default=None)


def _proxy_at_least_as_large(params: TrialParams, trial: dict) -> bool:
    other = trial["params"]
    return (other["precision"] == params.precision and params.batch_size >= other["batch_size"]
            and params.page_size >= other["page_size"] and params.max_batch_tokens >= other["max_batch_tokens"])


PROXY = Space(label=label, as_dict=TrialParams.as_dict, batch_size=lambda params: params.batch_size,
              out_of_memory=lambda trial: trial["status"] == "oom", at_least_as_large=_proxy_at_least_as_large,
              skipped=lambda params, reason: {"params": params.as_dict(), "workload": None, "status": "skipped",
                                              "reason": reason, "metrics": None, "roofline": None, "details": {}})


class _Log:
    """The trials of one search, numbered in the order they were run or skipped."""

    def __init__(self, planned: int, progress: Progress):
        self.trials: list[dict] = []
        self.planned = planned
        self.progress = progress
        self.started = time.perf_counter()

    def add(self, trial: dict, rung: int) -> dict:
        trial.update(id=len(self.trials), rung=rung)
        self.trials.append(trial)
        return trial

    def run(self, run_trial: RunTrial, config, workload: Workload, rung: int, space: Space) -> dict:
        done = sum(trial["status"] != "skipped" for trial in self.trials)
        self.progress(min(done / self.planned, 0.99),
                      f"trial {done + 1}: {space.label(config)}, {workload.requests} requests")
        return self.add(run_trial(config, workload), rung)

    def outcome(self, strategy: str, **extra) -> dict:
        ran = [trial for trial in self.trials if trial["status"] != "skipped"]
        # Trials of a smart search serve shorter workloads, so their count alone overstates its cost.
        return {"strategy": strategy, "trials": self.trials, "trials_run": len(ran),
                "requests_served": sum((trial.get("workload") or {}).get("requests", 0) for trial in ran),
                "seconds": time.perf_counter() - self.started, **extra}


def grid_search(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress,
                space: Space = PROXY) -> dict:
    log = _Log(len(configs), progress)
    for config in configs:
        log.run(run_trial, config, workload, 0, space)
    return log.outcome("grid", configurations=len(configs))


def successive_halving(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress,
                       eta: int = ETA, space: Space = PROXY) -> dict:
    last_rung = int(math.log(len(configs), eta) + 1e-9) if len(configs) > 1 else 0
    sizes = [len(configs)]
    for _ in range(last_rung):
        sizes.append(math.ceil(sizes[-1] / eta))
    log = _Log(sum(sizes), progress)
    survivors, out_of_memory, rungs = list(configs), [], []
    for rung in range(last_rung + 1):
        fraction = eta ** (rung - last_rung)
        ran = []
        for config in survivors:
            blocker = next((trial for trial in out_of_memory if space.at_least_as_large(config, trial)), None)
            if blocker:
                log.add(space.skipped(config, f"at least as large as trial {blocker['id']}, which ran out of "
                                              "memory"), rung)
                continue
            # A short run still fills the batch once, or it would judge a large batch by a batch it never fills.
            batch = space.batch_size(config)
            short = workload.scaled(fraction, min_requests=workload.in_flight_limit(batch) or batch)
            trial = log.run(run_trial, config, short, rung, space)
            ran.append((trial, config))
            if space.out_of_memory(trial):
                out_of_memory.append(trial)
        ranked = sorted(((trial, config) for trial, config in ran if trial["status"] == "ok"),
                        key=lambda pair: throughput(pair[0]), reverse=True)
        rungs.append({"rung": rung, "workload_fraction": fraction, "configurations": len(survivors),
                      "ran": len(ran), "kept": None})
        if rung == last_rung or not ranked:
            break
        kept = ranked[:max(1, math.ceil(len(ranked) / eta))]
        rungs[-1]["kept"] = len(kept)
        survivors = [config for _, config in kept]
    return log.outcome("smart", configurations=len(configs), eta=eta, rungs=rungs)


SEARCHES = {"grid": grid_search, "smart": successive_halving}
