"""The goodput search: the highest load meeting the SLOs, against latency models whose answer is known (a threshold,
a simulated continuous-batching engine) and against a real HTTP server of fixed capacity."""

import pytest

from workers.engine.parameters import ParameterError
from workers.engine.serving.goodput import (GoodputSearch, Probe, devices, find_goodput, goodput_trial,
                                            serve_goodput)
from workers.engine.serving.serve_sweep import EngineConfiguration, best_trial, engine_space
from workers.engine.serving.simulated import SimulatedEngine
from workers.engine.sweep.metrics import RequestRecord, summarize
from workers.engine.sweep.result import ServingTrial
from workers.engine.sweep.search import successive_halving
from workers.engine.sweep.workload import Workload

from .fake_endpoint import FakeEndpoint

SLO = {"ttft_p95_ms": 200, "tpot_p95_ms": 30}


def threshold_model(capacity: float, calls: list | None = None):
    """A load meets the SLOs exactly when it is at most ``capacity``."""

    def measure(load: float) -> Probe:
        if calls is not None:
            calls.append(load)
        met = load <= capacity
        metrics = {"requests_per_s": load, "goodput_requests_per_s": load if met else 0.0}
        return Probe(load, met, metrics, {"rate": load, "met": met, "seconds": 1.0})

    return measure


def test_it_finds_the_highest_rate_meeting_the_slos_within_the_tolerance():
    calls = []
    search = find_goodput(threshold_model(13.7, calls), start=1.0, over="rate", max_runs=12)
    assert calls[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]  # doubles until a rate fails, then bisects
    assert 13.7 / 1.05 <= search.best.load <= 13.7
    assert len(calls) <= 12
    # The same measurements give the same runs.
    again = []
    find_goodput(threshold_model(13.7, again), start=1.0, over="rate", max_runs=12)
    assert again == calls


def test_it_halves_from_a_start_above_the_capacity():
    search = find_goodput(threshold_model(0.3), start=8.0, over="rate", max_runs=12)
    loads = [probe.load for probe in search.probes]
    assert loads[:6] == [8.0, 4.0, 2.0, 1.0, 0.5, 0.25]
    assert 0.3 / 1.05 <= search.best.load <= 0.3


def test_a_concurrency_search_finds_the_exact_integer():
    search = find_goodput(threshold_model(5), start=1, over="concurrency", max_runs=10)
    assert search.best.load == 5
    assert all(isinstance(probe.load, int) for probe in search.probes)


def test_no_load_meeting_the_slos_is_zero_goodput_in_a_bounded_number_of_runs():
    search = find_goodput(threshold_model(0.0), start=4, over="concurrency", max_runs=8)
    assert search.best is None
    assert [probe.load for probe in search.probes] == [4, 2, 1]  # concurrency 1 is the floor
    summary = search.summary(device_count=2)
    assert summary["goodput_requests_per_s"] == 0.0 and summary["max_load_meeting_slo"] is None


def test_a_noisy_pass_above_a_failed_load_is_not_the_answer():
    search = GoodputSearch("rate", [Probe(load, met, {"goodput_requests_per_s": load}, {"rate": load, "seconds": 1})
                                    for load, met in [(4, True), (8, False), (6, True), (10, True), (5, True)]])
    assert search.best.load == 6
    assert [point["rate"] for point in search.rate_sweep] == [4, 5, 6, 8, 10]


def test_goodput_per_device_divides_by_the_layouts_ranks():
    assert devices({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}) == 8
    assert devices({"max_num_seqs": 4}) == 1
    search = GoodputSearch("rate", [Probe(3.0, True, {"requests_per_s": 2.9}, {"rate": 3.0, "seconds": 1})])
    summary = search.summary(device_count=4)
    # A rate search's goodput is the rate met; what a run of a few hundred Poisson requests measured is beside it.
    assert summary["goodput_per_device"] == pytest.approx(3.0 / 4) and summary["measured_requests_per_s"] == 2.9
    by_concurrency = GoodputSearch("concurrency",
                                   [Probe(8, True, {"requests_per_s": 2.9}, {"concurrency": 8, "seconds": 1})])
    assert by_concurrency.summary(device_count=1)["goodput_requests_per_s"] == 2.9


def record(ttft: float, tokens: int = 3, gap: float = 0.01) -> RequestRecord:
    return RequestRecord(0.0, [ttft + index * gap for index in range(tokens)], prompt_tokens=8)


def test_a_run_breaking_a_percentile_slo_has_no_goodput():
    # TTFTs 10..200 ms: the p95 is 190.5 ms (rank 18.05 of 0..19).
    records = [record(ms / 1000) for ms in range(10, 201, 10)]
    assert summarize(records, {"ttft_p95_ms": 191})["goodput_requests_per_s"] > 0
    broken = summarize(records, {"ttft_p95_ms": 190, "tpot_p95_ms": 50})
    assert broken["slo_breaches"] == ["ttft_p95_ms"]
    assert broken["goodput_requests_per_s"] == 0 and broken["good_requests"] == 0
    # Per-request SLOs keep vLLM's meaning: the requests meeting them, whatever the percentiles.
    assert summarize(records, {"ttft_s": 0.1})["good_requests"] == 10


@pytest.mark.parametrize("workload, reason", [
    ({"goodput_search": "rate", "arrival": "poisson", "rate": 1.0}, "needs SLOs"),
    ({"goodput_search": "rate", "slo": SLO}, "sends poisson arrivals"),
    ({"goodput_search": "concurrency", "arrival": "poisson", "rate": 1.0, "slo": SLO}, "sends closed arrivals"),
    ({"goodput_search": "bisect", "slo": SLO}, "must be one of rate, concurrency"),
    ({"slo": {"ttft_p97_ms": 100}}, "slo takes"),
    ({"slo": {"ttft_p95_ms": True}}, "slo takes"),
    ({"prompt_len": {"normal": [0, 4]}}, "prompt_len must be"),
])
def test_it_refuses_a_goodput_workload_it_cannot_run(workload, reason):
    with pytest.raises(ValueError, match=reason):
        Workload.from_dict(workload)


def test_it_bounds_the_runs_of_a_goodput_search():
    with pytest.raises(ParameterError, match="goodput_runs"):
        Workload.from_dict({"goodput_search": "concurrency", "slo": SLO, "goodput_runs": 1000})


def test_normal_lengths_stay_within_their_cut():
    workload = Workload.from_dict({"requests": 500, "prompt_len": {"normal": [100, 20]}, "output_len": 4})
    lengths = [len(request.prompt_ids) for request in workload.measured_requests(50)]
    assert workload.max_sequence_tokens() == 160 + 4
    assert max(lengths) <= 160 and min(lengths) >= 1
    assert 90 < sum(lengths) / len(lengths) < 110


def simulated_workload(**extra) -> Workload:
    return Workload.from_dict({"requests": 120, "prompt_len": 64, "output_len": 32, "arrival": "poisson",
                               "rate": 1.0, "slo": SLO, "goodput_search": "rate", "goodput_runs": 10, **extra})


def simulated_measure(engine: SimulatedEngine, workload: Workload):
    def measure(load: float) -> Probe:
        from workers.engine.serving.goodput import sweep_point

        at_load = Workload.from_dict({**workload.as_dict(), "rate": load})
        records = engine.serve(at_load.measured_requests(1000))
        metrics = summarize(records, at_load.slo)
        point = sweep_point(load, "rate", metrics, records, at_load.requests, 1.0)
        return Probe(load, point["met"], metrics, point)

    return measure


def test_on_a_simulated_engine_latency_rises_with_the_rate_and_the_answer_sits_at_the_knee():
    engine = SimulatedEngine(max_num_seqs=8, step_s=0.01, token_s=0.001, prefill_token_s=0.0001)
    workload = simulated_workload()
    search = find_goodput(simulated_measure(engine, workload), 1.0, "rate", workload.goodput_runs)
    sweep = search.rate_sweep
    assert [point["met"] for point in sweep] == sorted((point["met"] for point in sweep), reverse=True)
    assert sweep[-1]["ttft_p95_ms"] > SLO["ttft_p95_ms"] > sweep[0]["ttft_p95_ms"]
    best = search.best.load
    # The next rate up (within the tolerance) breaks the SLOs on the same engine; the best one does not.
    assert simulated_measure(engine, workload)(best * 1.06).met is False
    assert simulated_measure(engine, workload)(best).met is True


def test_successive_halving_with_goodput_trials_picks_the_configuration_with_the_highest_goodput():
    engines = {seqs: SimulatedEngine(max_num_seqs=seqs, step_s=0.01, token_s=0.0012 * seqs ** 0.5,
                                     prefill_token_s=0.0001) for seqs in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    workload = simulated_workload()

    def run_trial(config: EngineConfiguration, trial_workload: Workload) -> dict:
        search = find_goodput(simulated_measure(engines[config.settings["max_num_seqs"]], trial_workload), 1.0,
                              "rate", trial_workload.goodput_runs)
        shown = search.shown()
        return ServingTrial(settings=config.settings, client={}, status="ok",
                            metrics={**shown.metrics, "goodput_requests_per_s": search.summary(1)[
                                "goodput_requests_per_s"]},
                            workload={"requests": trial_workload.requests, "arrival": "poisson"},
                            goodput=search.summary(1)).as_dict()

    configs = [EngineConfiguration({"max_num_seqs": seqs}, {}) for seqs in engines]
    grid = {seqs: run_trial(config, workload) for seqs, config in zip(engines, configs, strict=True)}
    truth = max(grid, key=lambda seqs: grid[seqs]["goodput"]["goodput_requests_per_s"])
    outcome = successive_halving(configs, workload, run_trial, lambda fraction, message: None,
                                 space=engine_space(lambda settings: settings))
    pick = best_trial(outcome["trials"], workload)
    assert pick["settings"]["max_num_seqs"] == truth
    assert outcome["requests_served"] < len(configs) * workload.requests


def test_against_a_server_of_fixed_capacity_the_concurrency_found_is_its_slots():
    # 2 slots, 6 tokens of 15 ms: a third request in flight waits ~90 ms for its first token; alone it waits 15.
    workload = Workload.from_dict({"requests": 12, "prompt_len": 4, "output_len": 6, "concurrency": 1,
                                   "slo": {"ttft_p95_ms": 60}, "goodput_search": "concurrency", "goodput_runs": 6,
                                   "timeout_s": 60})
    with FakeEndpoint(slots=2, token_s=0.015) as server:
        from workers.engine.serving.client import Endpoint

        search, runs = serve_goodput(Endpoint(server.base_url, "fake"), workload, vocab=100, batch=1)
    assert search.best.load == 2
    assert [probe.load for probe in search.probes] == [1, 2, 4, 3]
    assert len(runs) == 4
    over = [point for point in search.rate_sweep if point["concurrency"] > 2]
    assert over and all(not point["met"] and point["ttft_p95_ms"] > 60 for point in over)


def test_a_goodput_trial_against_a_server_carries_the_sweep_and_the_goodput_per_device():
    workload = Workload.from_dict({"requests": 16, "prompt_len": 4, "output_len": 4, "arrival": "poisson",
                                   "rate": 10.0, "slo": {"ttft_p95_ms": 100}, "goodput_search": "rate",
                                   "goodput_runs": 4, "timeout_s": 60})
    with FakeEndpoint(slots=4, token_s=0.005) as server:
        from workers.engine.serving.client import Endpoint

        served = goodput_trial(Endpoint(server.base_url, "fake"), workload, vocab=100, batch=4,
                               settings={"tensor_parallel_size": 2})
    goodput = served["goodput"]
    assert goodput["runs"] == len(goodput["rate_sweep"]) <= 4
    assert goodput["devices"] == 2
    assert goodput["goodput_per_device"] == pytest.approx(goodput["goodput_requests_per_s"] / 2)
    assert served["metrics"]["goodput_requests_per_s"] == goodput["goodput_requests_per_s"]
    point = goodput["rate_sweep"][0]
    assert {"rate", "met", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p95_ms", "requests_per_s"} <= set(point)
    stored = ServingTrial.from_dict({"status": "ok", "goodput": goodput})
    assert stored.goodput.rate_sweep == goodput["rate_sweep"] and stored.as_dict()["goodput"] == goodput


def test_a_prompts_file_becomes_the_workloads_lengths_in_turn(tmp_path):
    from workers.engine.sweep.workload import read_prompts_file

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_len": 40, "output_len": 3}\n\n{"prompt_len": 7, "output_len": 9}\n')
    workload = Workload.from_dict({"requests": 3, **read_prompts_file(str(trace))})
    assert [(len(request.prompt_ids), request.output_tokens) for request in workload.measured_requests(50)] == [
        (40, 3), (7, 9), (40, 3)]
    trace.write_text('{"prompt_len": 40, "output_len": 3}\n{"prompt_len": 0, "output_len": 9}\n')
    with pytest.raises(ParameterError, match="line 2 needs positive ints"):
        read_prompts_file(str(trace))
    trace.write_text("not json\n")
    with pytest.raises(ParameterError, match="line 1 is not JSON"):
        read_prompts_file(str(trace))


def test_a_load_the_server_cannot_drain_in_time_is_a_run_that_missed_not_a_failed_search():
    # One slot, 0.1 s a request: six requests need 0.6 s, past the 0.5 s timeout at any rate.
    workload = Workload.from_dict({"requests": 6, "prompt_len": 4, "output_len": 5, "arrival": "poisson",
                                   "rate": 100.0, "slo": {"ttft_p95_ms": 1000}, "goodput_search": "rate",
                                   "goodput_runs": 3, "timeout_s": 0.5, "warmup_requests": 0})
    with FakeEndpoint(slots=1, token_s=0.02) as server:
        from workers.engine.serving.client import Endpoint

        served = goodput_trial(Endpoint(server.base_url, "fake"), workload, vocab=100, batch=1, settings={})
    goodput = served["goodput"]
    assert [point["rate"] for point in goodput["rate_sweep"]] == [25.0, 50.0, 100.0]
    assert all(point["timed_out"] and not point["met"] for point in goodput["rate_sweep"])
    assert goodput["max_load_meeting_slo"] is None and goodput["goodput_requests_per_s"] == 0.0
    assert served["metrics"]["completed"] == 0 and "not all answered" in served["failed"][0]
    assert served["any_failed"]


def test_the_pick_is_the_highest_goodput_per_device_not_the_highest_goodput():
    """TP=2 serves 10 req/s within the SLOs on 2 devices (5 each); TP=1 serves 7 on one: TP=1 is the recipe, three
    runs each, all above TP=2's per device (confirmed)."""
    workload = simulated_workload()

    def trial(index: int, tp: int, goodput: float) -> dict:
        return ServingTrial(id=index, settings={"tensor_parallel_size": tp}, client={}, status="ok",
                            metrics={"output_tokens_per_s": 100.0 * goodput, "goodput_requests_per_s": goodput},
                            workload={"requests": workload.requests, "arrival": "poisson"},
                            goodput={"over": "rate", "goodput_requests_per_s": goodput, "devices": tp,
                                     "goodput_per_device": goodput / tp}).as_dict()

    trials = [trial(index * 2 + offset, tp, goodput + index * 0.1) for index in range(3)
              for offset, (tp, goodput) in enumerate(((2, 10.0), (1, 7.0)))]
    pick = best_trial(trials, workload)
    assert pick["settings"] == {"tensor_parallel_size": 1}
    assert pick["verdict"]["verdict"] == "confirmed" and pick["verdict"]["figure"] == "goodput_per_device"
