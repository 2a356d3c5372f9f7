"""The verdict over a sweep's finalists (workers/engine/sweep/verdict.py) and the proxy sweep's confirmation that
uses it: a winner is confirmed only when every run of it is above every run of the runner-up; overlapping runs are a
tie at this noise; a first pass that won by a fluke does not decide. The figures are the ones issue 29 quotes."""

from workers.engine.sweep.confirm import confirm
from workers.engine.sweep.runner import repeated
from workers.engine.sweep.verdict import CONFIRMED, INCONCLUSIVE, UNCONTESTED, judge, summary


def test_overlapping_runs_are_a_tie_at_this_noise_never_a_confirmed_winner():
    # Kimi-K2's proxy pick measured 54 to 377 tok/s in its three runs
    verdict = judge([{"id": 1, "runs": [54.0, 300.0, 377.0]}, {"id": 2, "runs": [158.0, 200.0, 250.0]}],
                    "output_tokens_per_s")
    assert verdict["verdict"] == INCONCLUSIVE == "inconclusive at this noise"
    assert verdict["winner"]["id"] == 1 and verdict["runner_up"]["id"] == 2
    assert verdict["winner"]["median"] == 300.0 and (verdict["winner"]["min"], verdict["winner"]["max"]) == (54, 377)
    assert "overlap" in verdict["reason"] and verdict["interval"] == "min-max of the runs"


def test_a_winner_whose_every_run_beats_every_run_of_the_runner_up_is_confirmed():
    verdict = judge([{"id": 7, "runs": [190.0, 200.0, 210.0]}, {"id": 3, "runs": [295.0, 305.0, 315.0]}],
                    "output_tokens_per_s")
    assert verdict["verdict"] == CONFIRMED and verdict["winner"]["id"] == 3 and verdict["runner_up"]["id"] == 7
    # Touching is overlapping: 295 against a runner-up that also reached 295 is no longer confirmed
    touching = judge([{"id": 7, "runs": [190.0, 200.0, 295.0]}, {"id": 3, "runs": [295.0, 305.0, 315.0]}], "x")
    assert touching["verdict"] == INCONCLUSIVE


def test_the_winner_is_the_highest_median_not_the_highest_single_run():
    # DeepSeek-V3's pick measured 26.4 then 403.5: one lucky run does not make a winner
    verdict = judge([{"id": 0, "runs": [26.4, 30.0, 403.5]}, {"id": 1, "runs": [100.0, 110.0, 120.0]}], "x")
    assert verdict["winner"]["id"] == 1 and verdict["verdict"] == INCONCLUSIVE


def test_fewer_than_three_runs_never_confirm_and_a_lone_finalist_is_uncontested():
    few = judge([{"id": 0, "runs": [500.0, 510.0]}, {"id": 1, "runs": [100.0, 101.0, 102.0]}], "x")
    assert few["verdict"] == INCONCLUSIVE and "too few runs" in few["reason"]
    lone = judge([{"id": 0, "runs": [5.0, 6.0, 7.0]}], "x")
    assert lone["verdict"] == UNCONTESTED and lone["runner_up"] is None
    assert judge([], "x") is None
    assert summary([3.0, 1.0, 2.0]) == {"runs": [3.0, 1.0, 2.0], "count": 3, "median": 2.0, "mean": 2.0,
                                        "min": 1.0, "max": 3.0, "spread": 1.0}
    # An even count's median is a real run's figure, the lower middle, as a trial's reported run is
    assert summary([1.0, 4.0, 2.0, 3.0])["median"] == 2.0


def scripted(runs_by_batch: dict[int, list[list[float]]]):
    """A trial runner at the serving edge: each call serves a configuration three times (the runner's ``repeated``)
    and takes the next scripted runs of its batch size: the first pass's, then the re-measurement's."""
    def run_trial(batch_size: int) -> dict:
        runs = iter(runs_by_batch[batch_size].pop(0))

        def run_once():
            return {"status": "ok", "params": {"precision": "fp32", "batch_size": batch_size, "page_size": 16,
                                               "max_batch_tokens": 256},
                    "workload": {"requests": 8},
                    "metrics": {"output_tokens_per_s": next(runs), "ttft_s": {"p50": 0.01}}}
        return repeated(run_once, 3)
    return run_trial


def test_a_first_pass_fluke_is_re_measured_and_the_truly_better_configuration_is_confirmed():
    # Batch 4 led the first pass at 739 by luck; served again it measures 158. Batch 2 is steadily the best.
    run_trial = scripted({4: [[700, 739, 760], [150, 158, 170]], 2: [[290, 300, 310], [295, 305, 315]],
                          1: [[190, 200, 210], [195, 205, 215]]})
    trials = [{**run_trial(batch), "id": index} for index, batch in enumerate((1, 2, 4))]
    outcome = confirm(trials, requests=8, remeasure=lambda trial: run_trial(trial["params"]["batch_size"]), top=3)
    verdict = outcome["verdict"]
    assert outcome["first_pass_leader"] == 2 and outcome["picked"] == 1
    assert verdict["verdict"] == CONFIRMED and verdict["winner"]["runs"] == [295, 305, 315]
    assert verdict["runner_up"]["id"] == 0 and verdict["runner_up"]["runs"] == [195, 205, 215]
    assert outcome["best"]["metrics"]["output_tokens_per_s"] == verdict["winner"]["median"] == 305
    fluke = next(row for row in outcome["candidates"] if row["id"] == 2)
    assert (fluke["first_pass"], fluke["remeasured"]) == (739, 158)


def test_a_noisy_re_measurement_is_a_tie_even_when_the_first_pass_looked_clear():
    run_trial = scripted({4: [[700, 739, 760], [54, 300, 377]], 2: [[290, 300, 310], [158, 200, 250]]})
    trials = [{**run_trial(batch), "id": index} for index, batch in enumerate((2, 4))]
    outcome = confirm(trials, requests=8, remeasure=lambda trial: run_trial(trial["params"]["batch_size"]), top=2)
    assert outcome["verdict"]["verdict"] == INCONCLUSIVE and outcome["picked"] == 1
    assert outcome["verdict"]["winner"]["runs"] == [54, 300, 377] and outcome["verdict"]["runner_up"]["id"] == 0
