"""The sweep's search strategies (workers/engine/sweep/search.py, optuna_search.py) on a synthetic noisy objective
with a seeded generator and a simulated clock: every strategy picks a configuration of the grid, the budgeted ones
start no trial once their budget is spent, Optuna's TPE prunes on short runs, the pick is a median and not one
run's maximum, and an unknown strategy is refused by the sweep's parameters."""

import random

import pytest

from workers.engine.parameters import ParameterError, validate
from workers.engine.sweep import PARAMETERS
from workers.engine.sweep.search import (PROXY, SEARCHES, Budget, TrialParams, best_trial, configurations,
                                         default_budget, optuna_tpe, random_search, successive_halving)
from workers.engine.sweep.workload import Workload

GRID = {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4, 8], "page_size": [16, 32],
        "max_batch_tokens": [128, 512]}
WORKLOAD = Workload.from_dict({"requests": 36})


def true_throughput(params: TrialParams) -> float:
    """Grows with the batch, bf16 is 30% faster, a page of 32 and 512 batch tokens a little: one clear best."""
    return (100 * params.batch_size ** 0.7 * (1.3 if params.precision == "bf16" else 1.0)
            * (1.05 if params.page_size == 32 else 1.0) * (1.1 if params.max_batch_tokens == 512 else 1.0))


TRUE_BEST = max(true_throughput(params) for params in configurations(GRID))


class Objective:
    """Trials with 10% log-normal noise whose simulated time is a fixed 0.5 s plus 0.1 s per request served."""

    def __init__(self, seed: int = 0, noise: float = 0.1, out_of_memory=lambda params: False):
        self.rng = random.Random(seed)
        self.noise = noise
        self.out_of_memory = out_of_memory
        self.now = 0.0
        self.calls: list[tuple[TrialParams, int, float]] = []  # configuration, requests, start time

    def clock(self) -> float:
        return self.now

    def __call__(self, params: TrialParams, workload: Workload) -> dict:
        self.calls.append((params, workload.requests, self.now))
        self.now += 0.5 + 0.1 * workload.requests
        oom = self.out_of_memory(params)
        value = true_throughput(params) * self.rng.lognormvariate(0, self.noise)
        return {"params": params.as_dict(), "workload": {"requests": workload.requests, "arrival": "closed"},
                "status": "oom" if oom else "ok", "reason": "out of memory" if oom else None,
                "metrics": None if oom else {"output_tokens_per_s": value}, "roofline": None, "details": {}}


def run(name: str, objective: Objective, **options) -> dict:
    return SEARCHES[name](configurations(GRID), WORKLOAD, objective, lambda fraction, message: None,
                          clock=objective.clock, **options)


@pytest.mark.parametrize("name", ["grid", "smart", "random", "optuna-tpe"])
def test_every_strategy_picks_a_configuration_of_the_grid_that_served_the_full_workload(name):
    objective = Objective(seed=3)
    outcome = run(name, objective)
    best = best_trial(outcome["trials"], WORKLOAD)
    assert outcome["strategy"] == name
    assert TrialParams(**best["params"]) in configurations(GRID)
    assert best["workload"]["requests"] == WORKLOAD.requests and best["status"] == "ok"
    assert outcome["trials_run"] == len(objective.calls) and outcome["seconds"] == pytest.approx(objective.now)


@pytest.mark.parametrize("name", ["random", "optuna-tpe"])
def test_a_budgeted_search_starts_no_trial_once_its_seconds_are_spent(name):
    objective = Objective(seed=1)
    outcome = run(name, objective, budget=Budget(seconds=20.0), seed=1)
    starts = [started for _, _, started in objective.calls]
    assert starts and all(started < 20.0 for started in starts)
    # It used the budget rather than stopping early: the next trial would have started after 20 s.
    assert objective.now >= 20.0 and outcome["budget"] == {"seconds": 20.0, "workloads": None}


@pytest.mark.parametrize("name", ["random", "optuna-tpe"])
def test_by_default_a_budgeted_search_serves_about_what_the_halving_plans(name):
    objective = Objective(seed=2)
    outcome = run(name, objective, seed=2)
    budget = default_budget(configurations(GRID), WORKLOAD, PROXY).workloads
    served = outcome["requests_served"] / WORKLOAD.requests
    # It stops at the first trial past the budget: at most one full workload over, and far below the grid's 32.
    assert budget - 1 <= served <= budget + 1 and budget < 0.5 * len(configurations(GRID))


def test_random_search_is_reproducible_from_its_seed_and_differs_between_seeds():
    def order(seed: int) -> list[TrialParams]:
        objective = Objective()
        run("random", objective, seed=seed)
        return [params for params, _, _ in objective.calls]

    assert order(5) == order(5) and order(5) != order(6)


def test_optuna_tpe_prunes_on_short_runs_and_finishes_some_configurations():
    objective = Objective(seed=4)
    outcome = run("optuna-tpe", objective, seed=4)
    counts = outcome["optuna_trials"]
    assert counts["pruned"] > 0 and counts["finished"] > 0 and outcome["pruner"] == "halving"
    short = [requests for _, requests, _ in objective.calls if requests < WORKLOAD.requests]
    assert short, "pruned trials stop on a short run"
    best = best_trial(outcome["trials"], WORKLOAD)
    # TPE with pruning on a clear objective: its pick is among the good configurations, not a random one.
    assert true_throughput(TrialParams(**best["params"])) >= 0.8 * TRUE_BEST


def test_optuna_tpe_with_hyperband_and_over_a_list_that_is_not_a_full_grid():
    subset = [params for params in configurations(GRID) if params.batch_size != 2 or params.precision == "bf16"]
    objective = Objective(seed=5)
    outcome = optuna_tpe(subset, WORKLOAD, objective, lambda fraction, message: None, pruner="hyperband",
                         clock=objective.clock)
    best = best_trial(outcome["trials"], WORKLOAD)
    assert outcome["pruner"] == "hyperband" and TrialParams(**best["params"]) in subset
    assert all(params in subset for params, _, _ in objective.calls)
    with pytest.raises(ValueError, match="pruner must be one of halving, hyperband"):
        optuna_tpe(subset, WORKLOAD, objective, lambda fraction, message: None, pruner="median")


def test_searches_skip_what_is_at_least_as_large_as_a_configuration_that_ran_out_of_memory():
    def out_of_memory(params):
        return params.precision == "fp32" and params.batch_size >= 4

    for name in ("random", "optuna-tpe"):
        objective = Objective(seed=6, out_of_memory=out_of_memory)
        outcome = run(name, objective, seed=6, budget=Budget(workloads=40.0))
        served_oom = [params for params, _, _ in objective.calls if out_of_memory(params)]
        # Only configurations not larger than an earlier failure ever ran out of memory; the rest were skipped.
        assert len(served_oom) < 8
        assert any(trial["status"] == "skipped" for trial in outcome["trials"]), name


def test_the_halving_confirms_close_finalists_on_the_full_workload_and_picks_by_median():
    objective = Objective(seed=7)
    # Finalists 10% apart or more are not confirmed; the synthetic ones are, when any gap counts as close.
    clear = successive_halving(configurations(GRID), WORKLOAD, objective, lambda fraction, message: None,
                               confirm_within=0.0)
    assert not clear["rungs"][-1].get("confirmation")
    objective = Objective(seed=7)
    outcome = successive_halving(configurations(GRID), WORKLOAD, objective, lambda fraction, message: None,
                                 clock=objective.clock, confirm_within=1.0)
    confirmation = outcome["rungs"][-1]
    assert confirmation.get("confirmation") and confirmation["ran"] == 2
    full = [trial for trial in outcome["trials"] if trial["workload"] and trial["workload"]["requests"] == 36]
    finalists = {tuple(sorted(trial["params"].items())) for trial in full}
    assert len(finalists) == 2 and len(full) == 4  # two finalists, each served the full workload twice
    best = best_trial(outcome["trials"], WORKLOAD)
    assert true_throughput(TrialParams(**best["params"])) >= 0.95 * TRUE_BEST


def test_the_halving_promotes_a_configuration_within_noise_of_the_last_one_kept():
    # Rung 0 of 9 configurations keeps 3; the fourth is 2% behind the third, so it goes on too.
    configs = configurations({"batch_size": [1, 2, 3, 4, 5, 6, 7, 8, 9]})
    figures = {9: 1000.0, 8: 990.0, 7: 900.0, 6: 882.0, 5: 500.0, 4: 400.0, 3: 300.0, 2: 200.0, 1: 100.0}

    def scripted(params: TrialParams, workload: Workload) -> dict:
        return {"params": params.as_dict(), "workload": {"requests": workload.requests}, "status": "ok",
                "reason": None, "metrics": {"output_tokens_per_s": figures[params.batch_size]}, "details": {}}

    outcome = successive_halving(configs, Workload.from_dict({"requests": 90}), scripted, lambda f, m: None)
    assert outcome["rungs"][0]["kept"] == 4
    assert outcome["rungs"][1]["configurations"] == 4


def test_the_halving_does_not_rerun_a_configuration_on_a_workload_no_longer_than_its_last():
    # 36 requests over 32 configurations: rungs 0-2 would serve 1, 2 and 4 requests, but a short run is at least
    # one full batch, so a batch of 4 or 8 serves the same 4 or 8 requests in each; its first run stands for them.
    objective = Objective(seed=3)
    outcome = successive_halving(configurations(GRID), WORKLOAD, objective, lambda fraction, message: None,
                                 clock=objective.clock)
    served = {}
    for params, requests, _ in objective.calls:
        served.setdefault(params, []).append(requests)
    for params, requests in served.items():
        shorter = [count for count in requests if count < WORKLOAD.requests]
        assert shorter == sorted(set(shorter)), (params, requests)  # each short size once, growing
    assert len(objective.calls) == len(outcome["trials"])
    assert [rung["ran"] for rung in outcome["rungs"][:3]] == [32, outcome["rungs"][0]["kept"],
                                                              outcome["rungs"][1]["kept"]]
    best = best_trial(outcome["trials"], WORKLOAD)
    assert true_throughput(TrialParams(**best["params"])) >= 0.95 * TRUE_BEST


def test_the_pick_is_the_highest_median_not_the_single_luckiest_run():
    def trial(batch_size: int, value: float) -> dict:
        return {"params": TrialParams("fp32", batch_size, 16, 256).as_dict(), "workload": {"requests": 36},
                "status": "ok", "metrics": {"output_tokens_per_s": value}}

    lucky, steady = [trial(8, 130.0), trial(8, 60.0)], [trial(4, 101.0), trial(4, 100.0)]
    short = {**trial(2, 999.0), "workload": {"requests": 4}}  # a short run never becomes the pick
    best = best_trial([*lucky, *steady, short], WORKLOAD)
    # Batch 8 has the best single run (130) but a median of 95; batch 4's median is 100.5. The figures reported
    # are one real run's: the lower middle of batch 4's.
    assert best["params"]["batch_size"] == 4 and best["metrics"]["output_tokens_per_s"] == 100.0


def test_the_sweep_parameters_name_every_strategy_and_refuse_an_unknown_one():
    for name in ("grid", "smart", "random", "optuna-tpe"):
        assert validate("sweep", PARAMETERS, {"search": name})["search"] == name
    with pytest.raises(ParameterError, match="search: must be one of grid, smart, random, optuna-tpe, not 'bayes'"):
        validate("sweep", PARAMETERS, {"search": "bayes"})


def test_the_serve_sweep_takes_the_same_strategies():
    from workers.engine.serving.stage import PARAMETERS as SERVE_PARAMETERS

    search = next(parameter for parameter in SERVE_PARAMETERS if parameter.name == "search")
    assert search.choices == tuple(SEARCHES)
    with pytest.raises(ParameterError, match="search: must be one of"):
        search.clean("hyperopt", "search", None)


def test_random_search_over_a_space_with_a_clear_best_finds_it_when_the_budget_covers_the_grid():
    objective = Objective(seed=8, noise=0.0)
    outcome = random_search(configurations(GRID), WORKLOAD, objective, lambda f, m: None,
                            budget=Budget(workloads=32.0), clock=objective.clock)
    assert outcome["trials_run"] == 32
    assert true_throughput(TrialParams(**best_trial(outcome["trials"], WORKLOAD)["params"])) == TRUE_BEST
