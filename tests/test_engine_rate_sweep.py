"""The engine report's rate sweep charts: one per configuration whose trial searched for its goodput, latency
percentiles against the load with the SLOs, drawn from the stored trials (the search itself:
tests/engine/test_goodput.py)."""

import pytest
from django.test import Client

from adaptation.models import AdaptationJob, StageRun
from workers.engine.serving.goodput import Probe, find_goodput, sweep_point
from workers.engine.serving.simulated import SimulatedEngine
from workers.engine.sweep.metrics import summarize
from workers.engine.sweep.workload import Workload

SLO = {"ttft_p95_ms": 300, "ttft_p99_ms": 600, "tpot_p95_ms": 30}


def searched_trial(trial_id: int, max_num_seqs: int) -> dict:
    """A trial as ``run_trials`` stores it after a goodput search, measured on a simulated engine."""
    workload = Workload.from_dict({"requests": 60, "prompt_len": 64, "output_len": 16, "arrival": "poisson",
                                   "rate": 2.0, "slo": SLO, "goodput_search": "rate", "goodput_runs": 6})
    engine = SimulatedEngine(max_num_seqs=max_num_seqs, step_s=0.01, token_s=0.001, prefill_token_s=0.0001)

    def measure(rate: float) -> Probe:
        at_rate = Workload.from_dict({**workload.as_dict(), "rate": rate})
        records = engine.serve(at_rate.measured_requests(1000))
        metrics = summarize(records, SLO)
        point = sweep_point(rate, "rate", metrics, records, at_rate.requests, metrics["duration_s"])
        return Probe(rate, point["met"], metrics, point)

    search = find_goodput(measure, 2.0, "rate", 6)
    return {"id": trial_id, "settings": {"max_num_seqs": max_num_seqs}, "client": {}, "status": "ok",
            "metrics": search.shown().metrics, "workload": {"requests": 60, "arrival": "poisson"},
            "goodput": search.summary(1)}


def result(*trials: dict) -> dict:
    return {"engine": {"name": "vllm"}, "workload": {"slo": SLO, "goodput_search": "rate"}, "trials": list(trials),
            "search": {"strategy": "grid", "trials_run": len(trials)}}


def test_each_searched_configuration_gets_its_latency_against_rate_chart_with_the_slo_lines():
    from adaptation.serving.charts import figures

    plain = {"id": 2, "settings": {"max_num_seqs": 2}, "client": {}, "status": "ok", "metrics": {},
             "workload": {"requests": 60}}
    stored = result(searched_trial(0, 4), searched_trial(1, 16), plain)
    charts = figures(stored)
    assert sorted(charts) == ["rate-sweep-0", "rate-sweep-1"]  # the trial without a search has none
    figure, sweep = charts["rate-sweep-1"], stored["trials"][1]["goodput"]["rate_sweep"]
    traces = {trace.name: trace for trace in figure.data}
    assert list(traces["TTFT p95"].x) == [point["rate"] for point in sweep] == sorted(point["rate"] for point in sweep)
    assert list(traces["TTFT p95"].y) == [point["ttft_p95_ms"] for point in sweep]
    assert traces["TPOT p95"].yaxis == "y2" and traces["TTFT p99"].yaxis == "y"
    assert list(traces["SLO TTFT p95 ≤ 300 ms"].y) == [300, 300]
    assert list(traces["SLO TPOT p95 ≤ 30 ms"].y) == [30, 30]
    # Runs that broke an SLO are crosses; the highest rate meeting them is marked.
    assert list(traces["TTFT p95"].marker.symbol) == ["circle" if point["met"] else "x" for point in sweep]
    assert "x" in traces["TTFT p95"].marker.symbol
    best = stored["trials"][1]["goodput"]["max_load_meeting_slo"]
    assert figure.layout.shapes[0].x0 == best
    assert f"at rate {best:.3g}" in figure.layout.title.text


def test_a_report_with_figures_that_are_not_numbers_draws_what_it_can():
    from adaptation.serving.charts import figures

    trial = searched_trial(0, 4)
    trial["goodput"].update(max_load_meeting_slo="9; drop", goodput_requests_per_s=None)
    trial["goodput"]["rate_sweep"].append({"rate": "lots", "ttft_p95_ms": 1})
    figure = figures(result(trial))["rate-sweep-0"]
    assert "no load met the SLOs" in figure.layout.title.text
    assert "lots" not in list(figure.data[0].x)


@pytest.fixture
def engine_report(cluster, model_spec, owner, node):
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, stages=["serve_sweep"],
                                       submitted_by=owner, status="succeeded")
    return StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                   status="succeeded", result=result(searched_trial(0, 4)))


def test_the_engine_report_page_draws_the_rate_sweeps(engine_report, member):
    client = Client()
    client.force_login(member)
    page = client.get(f"/engines/{engine_report.pk}/").content.decode()
    assert "<h2>Rate sweeps</h2>" in page and 'data-chart="rate-sweep-0"' in page
    assert f'id="engine-charts-{engine_report.pk}"' in page  # the figures' json_script block
    assert "plotly.min.js" in page and "sweep_report.js" in page


def test_a_report_without_a_goodput_search_loads_no_chart_script(engine_report, member):
    StageRun.objects.filter(pk=engine_report.pk).update(result=result())
    client = Client()
    client.force_login(member)
    page = client.get(f"/engines/{engine_report.pk}/").content.decode()
    assert "Rate sweeps" not in page and "plotly.min.js" not in page


def test_a_smart_search_reports_its_share_of_the_full_grids_serving_time(engine_report, member):
    from workers.engine.sweep.result import ServeSweepResult

    def trial(trial_id, requests, serving_s):
        return {"id": trial_id, "settings": {"max_num_seqs": trial_id}, "client": {}, "status": "ok",
                "metrics": {"duration_s": 1.0}, "workload": {"requests": requests},
                "goodput": {"over": "rate", "serving_s": serving_s, "rate_sweep": []}}

    # Six configurations: four stopped after short searches (20 s each), two served the full workload (90, 110 s).
    # The grid would have served six full searches of 100 s on average: 280 / 600.
    stored = {**result(*(trial(index, 20, 20.0) for index in range(4)), trial(4, 60, 90.0), trial(5, 60, 110.0)),
              "workload": {"requests": 60, "slo": SLO}, "search": {"strategy": "smart", "configurations": 6}}
    assert ServeSweepResult.from_dict(stored).grid_share == pytest.approx(280 / 600)
    as_grid = {**stored, "search": {"strategy": "grid", "configurations": 6}}
    assert ServeSweepResult.from_dict(as_grid).grid_share is None
    StageRun.objects.filter(pk=engine_report.pk).update(result=stored)
    client = Client()
    client.force_login(member)
    assert "about 47% of the full grid's serving time" in client.get(f"/engines/{engine_report.pk}/").content.decode()
