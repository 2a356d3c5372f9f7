"""The sweep's ``optuna-tpe`` search: Optuna's TPE sampler (Bergstra et al. 2011) choosing configurations of the
grid, with Optuna's successive-halving pruner (or Hyperband) stopping the unpromising early. Optuna is the
library vllm-tuner builds on; this is the baseline d0's own halving is measured against.

Each Optuna trial is one configuration served at growing workloads, the rungs of d0's halving (eta^(r - last) of
the workload, at least one full batch): after each rung it reports the output tokens/s at step eta^r and the pruner
decides whether it goes on. A configuration reaching the full workload is the trial's value. The study is in memory
(no storage, nothing leaves the node). A configuration the sampler proposes again is not served again: it is
told as pruned without a value, as Optuna's FAQ does for duplicates, which steers TPE away from it. The search
stops when its budget is spent, when every configuration has run, or after ``ASKS_PER_CONFIGURATION`` proposals
per configuration.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable

from .search import (ETA, PROXY, Budget, Progress, RunTrial, Space, _described, _Log, _short, default_budget,
                     halving_rungs, throughput)
from .workload import Workload

PRUNERS = ("halving", "hyperband")
ASKS_PER_CONFIGURATION = 5
# TPE proposes at random until it has this many trials (Optuna's default is 10, most of a small grid's budget).
STARTUP_TRIALS = 10


def _dimensions(configs: list, space: Space) -> tuple[list[tuple[str, list[str]]], dict[tuple, object]]:
    """The grid as categorical dimensions (each setting's distinct values, JSON-encoded so that any value is a
    valid Optuna choice) and the configuration at each combination of choices."""
    flat = [_flatten(space.as_dict(config)) for config in configs]
    names = list(dict.fromkeys(name for values in flat for name in values))
    dimensions = [(name, list(dict.fromkeys(values.get(name, "null") for values in flat))) for name in names]
    lookup = {tuple(values.get(name, "null") for name in names): config for values, config in zip(flat, configs,
                                                                                                  strict=True)}
    return dimensions, lookup


def _flatten(value: dict, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            flat.update(_flatten(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(item, sort_keys=True)
    return flat


def _pruner(name: str, eta: int, max_resource: int):
    import optuna

    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=eta)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_resource, reduction_factor=eta)
    raise ValueError(f"pruner must be one of {', '.join(PRUNERS)}, not {name!r}")


def optuna_tpe(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress, *, eta: int = ETA,
               space: Space = PROXY, budget: Budget | None = None, seed: int = 0, pruner: str = "halving",
               startup_trials: int = STARTUP_TRIALS, clock: Callable[[], float] = time.perf_counter) -> dict:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = budget or default_budget(configs, workload, space, eta)
    last_rung = halving_rungs(len(configs), eta)
    dimensions, lookup = _dimensions(configs, space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
        study = optuna.create_study(direction="maximize", sampler=sampler,
                                    pruner=_pruner(pruner, eta, eta ** last_rung))
    planned = len(configs) if budget.workloads is None else min(len(configs), int(budget.workloads * 3))
    log = _Log(planned, progress, workload, clock, budget)
    proposed: set[tuple] = set()
    out_of_memory: list[dict] = []
    outcomes = {"finished": 0, "pruned": 0, "proposed again": 0, "failed or skipped": 0}

    def finished_any() -> bool:
        return outcomes["finished"] > 0

    for _ in range(ASKS_PER_CONFIGURATION * len(configs)):
        # The first full run is always finished, or a search on a tight budget would have nothing to pick.
        if len(proposed) == len(configs) or (log.spent() and finished_any()):
            break
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            trial = study.ask()
            choice = tuple(trial.suggest_categorical(name, choices) for name, choices in dimensions)
        config = lookup.get(choice)
        if config is None:  # a combination outside an explicit list of configurations
            study.tell(trial, state=TrialState.FAIL)
            outcomes["failed or skipped"] += 1
            continue
        if choice in proposed:
            study.tell(trial, state=TrialState.PRUNED)
            outcomes["proposed again"] += 1
            continue
        proposed.add(choice)
        state, value = _serve_rungs(trial, config, workload, run_trial, log, space, out_of_memory, eta, last_rung,
                                    finished_any)
        study.tell(trial, value, state=state)
        outcomes[{TrialState.COMPLETE: "finished", TrialState.PRUNED: "pruned"}.get(state, "failed or skipped")] += 1
    return log.outcome("optuna-tpe", configurations=len(configs), eta=eta, seed=seed, pruner=pruner,
                       budget=_described(budget), optuna_trials=outcomes, optuna_version=optuna.__version__)


def _serve_rungs(trial, config, workload: Workload, run_trial: RunTrial, log: _Log, space: Space,
                 out_of_memory: list[dict], eta: int, last_rung: int, finished_any: Callable[[], bool]):
    """Serve ``config`` rung by rung until it is pruned, fails or serves the full workload: (state, value)."""
    from optuna.trial import TrialState

    for rung in range(last_rung + 1):
        if log.blocked(config, out_of_memory, rung, space):
            return TrialState.FAIL, None
        short = _short(workload, eta ** (rung - last_rung), space.batch_size(config))
        record = log.run(run_trial, config, short, rung, space)
        if space.out_of_memory(record):
            out_of_memory.append(record)
        if record["status"] != "ok":
            return TrialState.FAIL, None
        if short.requests == workload.requests:  # a full batch can already be the whole workload
            return TrialState.COMPLETE, throughput(record)
        trial.report(throughput(record), step=eta ** rung)
        if trial.should_prune() or (log.spent() and finished_any()):
            return TrialState.PRUNED, None
    raise AssertionError("the last rung serves the full workload")
