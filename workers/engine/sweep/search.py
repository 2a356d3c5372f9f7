"""Which configurations a sweep runs: the full grid (the baseline), d0's successive halving ("smart"), a random
search or Optuna's TPE with pruning ("optuna-tpe", in ``optuna_search``) on the same budget.

The smart search is successive halving (Jamieson and Talwalkar 2016; Hyperband's inner loop, Li et al. 2018): every
configuration first serves a short workload, the best 1/ETA by output tokens/s go on to a workload ETA times longer,
and so on until the survivors serve the full workload, so configurations already dominated on a short run are
stopped early. Each rung costs about the same, so with N configurations the search costs about log_ETA(N) + 1 full
workloads instead of N. It also never runs a configuration at least as large as one that ran out of memory: the
same precision with a batch size, page size and max batch tokens all at least as large needs at least as much memory
(the paged cache holds batch_size x (sequence + page) tokens, activations grow with max_batch_tokens).

One short run ranks configurations that are close by noise as much as by merit, and one full run of the winner
overstates it (the winner's curse; ``benchmarks/search_vs_grid.py`` measures both). So the halving also promotes a
configuration within ``KEEP_WITHIN`` of the last one kept, always takes ``FINALISTS`` to the full workload, and
serves the finalists the full workload once more, interleaved, when they are within ``CONFIRM_WITHIN`` of each
other; the pick is the highest median over a configuration's full-workload runs (``best_trial``), not one run's
maximum.

Every search runs over any kind of configuration described by a ``Space``: the proxy sweep's ``TrialParams``
(``PROXY``) and a real engine's settings (``serving.serve_sweep``'s ``engine_space``). The random search and
Optuna's stop on a budget: seconds, or full workloads served (requests served / the workload's requests), by
default what the halving plans to serve for the same grid, so that the three can be compared as they are offered.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..parameters import ParameterError
from .result import SweepTrial
from .workload import Workload

GRID_KEYS = ("precision", "batch_size", "page_size", "max_batch_tokens")
GRID_DEFAULTS = {"precision": ["fp32"], "batch_size": [1, 2, 4], "page_size": [16], "max_batch_tokens": [256]}
# Upper bounds of the grid's numbers: requests batched per step (transformers' max_requests_per_batch, vLLM's
# max_num_seqs, whose defaults are 256-1024), tokens per KV page (engines use 16-256) and per forward step. A batch
# of 1e9 would size a paged cache of 1e9 sequences; at most MAX_GRID_VALUES values a key.
GRID_MAXIMA = {"batch_size": 4096, "page_size": 1024, "max_batch_tokens": 1 << 20}
MAX_GRID_VALUES = 64
OBJECTIVE = "output_tokens_per_s"
ETA = 3
# A short run's throughput within this share of the last configuration promoted goes on too (a busy node's runs of
# one configuration differ by more than that; a pick at 0.907 of the best was seen after one short run).
KEEP_WITHIN = 0.05
# Configurations that reach the full workload, and extra full runs each, interleaved, before the pick: only
# when the runner-up's full run is within CONFIRM_WITHIN of the leader's (a clear lead needs no second look).
FINALISTS = 2
CONFIRM_RUNS = 1
CONFIRM_WITHIN = 0.10


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
    out of memory, and whether a configuration is at least as large as one that did (so it would too).
    ``confirm_finalists``: whether the halving serves its finalists the full workload again before the pick (only
    where the pick is the median of a configuration's runs, as ``best_trial`` takes it)."""

    label: Callable[[Any], str]
    as_dict: Callable[[Any], dict]
    batch_size: Callable[[Any], int]
    out_of_memory: Callable[[dict], bool]
    at_least_as_large: Callable[[Any, dict], bool]
    skipped: Callable[[Any, str], dict]
    confirm_finalists: bool = True


def grid_values(grid: dict | None) -> dict[str, list]:
    """The grid's lists, defaults filled in, each checked: known keys, at most ``MAX_GRID_VALUES`` values within
    ``GRID_MAXIMA``. Nothing is multiplied out: a grid's size is the product of its lists' lengths."""
    grid = dict(grid or {})
    unknown = set(grid) - set(GRID_KEYS)
    if unknown:
        raise ValueError(f"unknown grid keys: {', '.join(sorted(unknown))}; known: {', '.join(GRID_KEYS)}")
    values = {key: grid.get(key, GRID_DEFAULTS[key]) for key in GRID_KEYS}
    for key, options in values.items():
        if not isinstance(options, list) or not options:
            raise ValueError(f"grid {key} must be a non-empty list, not {options!r}")
        if len(options) > MAX_GRID_VALUES:
            raise ParameterError(key, f"takes at most {MAX_GRID_VALUES} values, not {len(options)}")
        if key == "precision":
            if not all(isinstance(option, str) for option in options):
                raise ValueError(f"grid precision takes names such as fp32 or bf16, not {options!r}")
            continue
        if not all(isinstance(option, int) and not isinstance(option, bool) and option >= 1 for option in options):
            raise ValueError(f"grid {key} takes positive ints, not {options!r}")
        if max(options) > GRID_MAXIMA[key]:
            raise ParameterError(key, f"values must be at most {GRID_MAXIMA[key]}, not {max(options)}")
    return values


def configurations(grid: dict | None) -> list[TrialParams]:
    """Every combination of the grid's values, precision outermost (so a backend rebuilds its model least often)."""
    values = grid_values(grid)
    return [TrialParams(*combination) for combination in itertools.product(*(values[key] for key in GRID_KEYS))]


def label(params: TrialParams) -> str:
    return (f"{params.precision} batch {params.batch_size} page {params.page_size} "
            f"max tokens {params.max_batch_tokens}")


def throughput(trial: dict) -> float:
    return trial["metrics"][OBJECTIVE]


def best_trial(trials: list[dict], workload: Workload) -> dict | None:
    """The pick among trials that served the full workload: the configuration with the highest median output
    tokens/s over its full-workload runs (one run each in a grid; the finalists of a halving have more), and of its
    runs the one at that median (the lower middle of an even count), so the reported figures are one real run's."""
    runs: dict[str, list[dict]] = {}
    for trial in trials:
        if trial["status"] == "ok" and trial["workload"]["requests"] == workload.requests:
            runs.setdefault(json.dumps(trial["params"], sort_keys=True), []).append(trial)
    if not runs:
        return None
    chosen = max(runs.values(), key=lambda group: statistics.median(map(throughput, group)))
    ordered = sorted(chosen, key=throughput)
    return ordered[(len(ordered) - 1) // 2]


def _proxy_at_least_as_large(params: TrialParams, trial: dict) -> bool:
    other = trial["params"]
    return (other["precision"] == params.precision and params.batch_size >= other["batch_size"]
            and params.page_size >= other["page_size"] and params.max_batch_tokens >= other["max_batch_tokens"])


PROXY = Space(label=label, as_dict=TrialParams.as_dict, batch_size=lambda params: params.batch_size,
              out_of_memory=lambda trial: trial["status"] == "oom", at_least_as_large=_proxy_at_least_as_large,
              skipped=lambda params, reason: SweepTrial(params=params.as_dict(), status="skipped",
                                                        reason=reason).as_dict())


@dataclass(frozen=True)
class Budget:
    """When a budgeted search stops starting trials: after ``seconds``, or once it has served ``workloads`` full
    workloads (requests served / the workload's requests, so a short run counts for its share). None: no limit."""

    seconds: float | None = None
    workloads: float | None = None


class _Log:
    """The trials of one search, numbered in the order they were run or skipped. ``clock`` is the search's time
    (a test gives a simulated one)."""

    def __init__(self, planned: int, progress: Progress, workload: Workload,
                 clock: Callable[[], float] = time.perf_counter, budget: Budget | None = None):
        self.trials: list[dict] = []
        self.planned = max(planned, 1)
        self.progress = progress
        self.workload = workload
        self.clock = clock
        self.budget = budget or Budget()
        self.started = clock()

    @property
    def ran(self) -> list[dict]:
        return [trial for trial in self.trials if trial["status"] != "skipped"]

    def requests_served(self) -> int:
        return sum((trial.get("workload") or {}).get("requests", 0) for trial in self.ran)

    def seconds(self) -> float:
        return self.clock() - self.started

    def spent(self) -> bool:
        """Whether the budget is used up (a search checks before it starts a trial, so the last one may overrun)."""
        seconds, workloads = self.budget.seconds, self.budget.workloads
        return ((seconds is not None and self.seconds() >= seconds)
                or (workloads is not None and self.requests_served() >= workloads * self.workload.requests))

    def _fraction(self) -> float:
        fractions = [len(self.ran) / self.planned]
        if self.budget.seconds:
            fractions.append(self.seconds() / self.budget.seconds)
        if self.budget.workloads:
            fractions.append(self.requests_served() / (self.budget.workloads * self.workload.requests))
        return min(max(fractions), 0.99)

    def add(self, trial: dict, rung: int) -> dict:
        trial.update(id=len(self.trials), rung=rung)
        self.trials.append(trial)
        return trial

    def run(self, run_trial: RunTrial, config, workload: Workload, rung: int, space: Space) -> dict:
        self.progress(self._fraction(), f"trial {len(self.ran) + 1}: {space.label(config)}, "
                                        f"{workload.requests} requests")
        return self.add(run_trial(config, workload), rung)

    def blocked(self, config, out_of_memory: list[dict], rung: int, space: Space) -> bool:
        """Records ``config`` as skipped when it is at least as large as a trial that ran out of memory."""
        blocker = next((trial for trial in out_of_memory if space.at_least_as_large(config, trial)), None)
        if blocker:
            self.add(space.skipped(config, f"at least as large as trial {blocker['id']}, which ran out of memory"),
                     rung)
        return blocker is not None

    def outcome(self, strategy: str, **extra) -> dict:
        # Trials of a smart search serve shorter workloads, so their count alone overstates its cost.
        return {"strategy": strategy, "trials": self.trials, "trials_run": len(self.ran),
                "requests_served": self.requests_served(), "seconds": self.seconds(), **extra}


def grid_search(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress,
                space: Space = PROXY, clock: Callable[[], float] = time.perf_counter) -> dict:
    log = _Log(len(configs), progress, workload, clock)
    for config in configs:
        log.run(run_trial, config, workload, 0, space)
    return log.outcome("grid", configurations=len(configs))


def halving_rungs(configurations: int, eta: int = ETA) -> int:
    """The last rung of successive halving over this many configurations: rung r serves eta^(r - last) of the
    workload, so the first serves about 1/configurations of it."""
    return int(math.log(configurations, eta) + 1e-9) if configurations > 1 else 0


def halving_plan(configurations: int, eta: int = ETA, finalists: int = FINALISTS,
                 confirm_runs: int = CONFIRM_RUNS) -> list[tuple[float, int]]:
    """``[(workload fraction, configurations)]`` per rung as planned (more go on where short runs are close), then
    the finalists' extra full runs."""
    last_rung = halving_rungs(configurations, eta)
    plan = [(float(eta ** -last_rung), configurations)]
    for rung in range(1, last_rung + 1):
        plan.append((float(eta ** (rung - last_rung)), max(min(finalists, plan[-1][1]) if rung == last_rung else 1,
                                                           math.ceil(plan[-1][1] / eta))))
    if plan[-1][1] > 1:
        plan += [(1.0, plan[-1][1])] * confirm_runs
    return plan


def default_budget(configs: list, workload: Workload, space: Space = PROXY, eta: int = ETA) -> Budget:
    """What the halving plans to serve over these configurations, in full workloads (at least 2; short runs fill
    a batch at least once, as the halving's do): the budget a random or Optuna search gets unless told otherwise,
    so that each is compared at the same cost."""
    batches = [space.batch_size(config) for config in configs]
    plan = halving_plan(len(configs), eta, confirm_runs=CONFIRM_RUNS if space.confirm_finalists else 0)
    requests = sum(count * statistics.mean(_short(workload, fraction, batch).requests for batch in batches)
                   for fraction, count in plan)
    return Budget(workloads=max(2.0, requests / workload.requests))


def _short(workload: Workload, fraction: float, batch_size: int) -> Workload:
    # A short run still fills the batch once, or it would judge a large batch by a batch it never fills.
    return workload.scaled(fraction, min_requests=workload.in_flight_limit(batch_size) or batch_size)


def successive_halving(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress,
                       eta: int = ETA, space: Space = PROXY, *, keep_within: float = KEEP_WITHIN,
                       finalists: int = FINALISTS, confirm_runs: int = CONFIRM_RUNS,
                       confirm_within: float = CONFIRM_WITHIN, clock: Callable[[], float] = time.perf_counter) -> dict:
    last_rung = halving_rungs(len(configs), eta)
    plan = halving_plan(len(configs), eta, finalists, confirm_runs)
    log = _Log(sum(count for _, count in plan), progress, workload, clock)
    survivors, out_of_memory, rungs, ranked = list(configs), [], [], []
    # A configuration's last run by the number of requests it served: where a rung's short workload is no longer
    # than the last rung's (a short run is at least one full batch, so the first rungs of a small workload all
    # serve one batch), running it again would cost as much and say the same; its run stands for this rung too.
    last_run: dict[int, dict] = {}
    for rung in range(last_rung + 1):
        fraction = eta ** (rung - last_rung)
        ran = []
        for config in survivors:
            if log.blocked(config, out_of_memory, rung, space):
                continue
            short = _short(workload, fraction, space.batch_size(config))
            earlier = last_run.get(id(config))
            if earlier is not None and (earlier.get("workload") or {}).get("requests", 0) >= short.requests:
                ran.append((earlier, config))
                continue
            trial = log.run(run_trial, config, short, rung, space)
            last_run[id(config)] = trial
            ran.append((trial, config))
            if space.out_of_memory(trial):
                out_of_memory.append(trial)
        ranked = sorted(((trial, config) for trial, config in ran if trial["status"] == "ok"),
                        key=lambda pair: throughput(pair[0]), reverse=True)
        rungs.append({"rung": rung, "workload_fraction": fraction, "configurations": len(survivors),
                      "ran": len(ran), "kept": None})
        if rung == last_rung or not ranked:
            break
        count = max(finalists if rung == last_rung - 1 else 1, math.ceil(len(ranked) / eta))
        kept = ranked[:count]
        # One short run cannot tell apart configurations this close: those go on too (at most twice as many).
        cutoff = throughput(kept[-1][0]) * (1 - keep_within)
        kept += [pair for pair in ranked[count:2 * count] if throughput(pair[0]) >= cutoff]
        rungs[-1]["kept"] = len(kept)
        survivors = [config for _, config in kept]
    finals = [config for trial, config in ranked[:finalists] if trial["workload"]["requests"] == workload.requests
              and throughput(trial) >= throughput(ranked[0][0]) * (1 - confirm_within)]
    if len(finals) > 1 and space.confirm_finalists:
        # The finalists again, interleaved, so that a slow spell of the node does not decide between them.
        for _ in range(confirm_runs):
            for config in finals:
                log.run(run_trial, config, workload, last_rung + 1, space)
        rungs.append({"rung": last_rung + 1, "workload_fraction": 1, "configurations": len(finals),
                      "ran": len(finals) * confirm_runs, "kept": None, "confirmation": True})
    return log.outcome("smart", configurations=len(configs), eta=eta, rungs=rungs)


def random_search(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress,
                  space: Space = PROXY, *, budget: Budget | None = None, seed: int = 0,
                  clock: Callable[[], float] = time.perf_counter) -> dict:
    """Configurations in a seeded random order, each on the full workload, until the budget is spent (by default
    the halving's planned cost); like the halving, it skips what is at least as large as one that ran out of
    memory. The baseline a smarter search has to beat (Bergstra and Bengio 2012)."""
    budget = budget or default_budget(configs, workload, space)
    order = list(configs)
    random.Random(seed).shuffle(order)
    planned = math.ceil(budget.workloads) if budget.workloads else len(configs)
    log = _Log(min(planned, len(configs)), progress, workload, clock, budget)
    out_of_memory: list[dict] = []
    for config in order:
        if log.spent():
            break
        if log.blocked(config, out_of_memory, 0, space):
            continue
        trial = log.run(run_trial, config, workload, 0, space)
        if space.out_of_memory(trial):
            out_of_memory.append(trial)
    return log.outcome("random", configurations=len(configs), seed=seed, budget=_described(budget))


def _described(budget: Budget) -> dict:
    return {"seconds": budget.seconds, "workloads": budget.workloads}


def optuna_tpe(configs: list, workload: Workload, run_trial: RunTrial, progress: Progress, eta: int = ETA,
               space: Space = PROXY, **options) -> dict:
    """Optuna's TPE sampler with successive-halving (or Hyperband) pruning; see ``optuna_search``."""
    from .optuna_search import optuna_tpe as run

    return run(configs, workload, run_trial, progress, eta=eta, space=space, **options)


# The strategies a sweep's ``search`` parameter names; each takes (configs, workload, run_trial, progress) and a
# ``space`` keyword, and returns its trials and outcome.
SEARCHES = {"grid": grid_search, "smart": successive_halving, "random": random_search, "optuna-tpe": optuna_tpe}
SEARCH_HELP = ("grid: every configuration; smart: d0's successive halving (short runs first, the best third and "
               "those close to it go on, the finalists confirmed); random: random configurations on the full "
               "workload for what the halving would spend; optuna-tpe: Optuna's TPE sampler with successive-halving "
               "pruning, for the same budget")
