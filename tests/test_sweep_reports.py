"""Sweep reports: a real sweep's result stored on a stage run, shown with charts, downloaded as self-contained
HTML / JSON / CSV that match the stored trials, and compared side by side."""

import csv
import io
import json

import pytest
from django.test import Client

from adaptation.intake import services as intake
from adaptation.jobs import placement
from adaptation.jobs import services as jobs
from adaptation.models import StageRun
from adaptation.sweeps.charts import chart_data
from workers.engine.sweep import run_sweep
from workers.engine.sweep.result import Roofline

from .conftest import load_config


@pytest.fixture(scope="module")
def sweep_result():
    return run_sweep(load_config("qwen3-0.6b.json"),
                     grid={"precision": ["fp32"], "batch_size": [1, 2], "page_size": [16], "max_batch_tokens": [64]},
                     workload={"requests": 2, "prompt_len": 8, "output_len": 3}, search="grid")


@pytest.fixture
def sweep_run(cluster, owner, node, sweep_result):
    spec = intake.add_from_catalog(team=cluster.team, user=owner, slug="qwen3-0.6b")[0]
    job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=spec, stages=["sweep"])
    run = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname, result=sweep_result)
    run.start()
    run.finish(result=sweep_result)
    return run


@pytest.fixture
def client_for(member):
    client = Client()
    client.force_login(member)
    return client


def test_the_report_page_shows_every_chart_and_trial(client_for, sweep_run, sweep_result):
    page = client_for.get(f"/sweeps/{sweep_run.pk}/").content.decode()
    for chart in ("throughput", "latency", "cdf", "pareto", "roofline", "predicted"):
        # Ids unique per report, so two reports on one page (the comparison) never share one
        assert f'id="sweep-charts-{sweep_run.pk}-{chart}"' in page
    trials_table = page[page.index('class="trials"'):]
    assert trials_table.count("<tr><td>") == len(sweep_result["trials"])
    assert "<td>sweep</td>" in page  # the job's stages, with their status
    assert "Roofline inputs: memory bandwidth" in page
    model = sweep_result["model"]
    assert "A proxy, not the deployment" in page
    assert f"({model['layers']} of {model['full_layers']} layers, hidden size {model['hidden_size']})" in page


def test_the_html_download_is_self_contained(client_for, sweep_run):
    response = client_for.get(f"/sweeps/{sweep_run.pk}/report.html")
    body = response.content.decode()
    assert response["Content-Disposition"] == f'attachment; filename="d0-sweep-{sweep_run.pk}.html"'
    head, _, page = body.partition("</script></head>")
    assert "plotly.js v" in head and page  # the library is inlined in the head
    assert "<script src=" not in page and 'href="http' not in page and "Plotly.newPlot" in page


def test_the_json_and_csv_downloads_match_the_stored_trials(client_for, sweep_run, sweep_result):
    stored = json.loads(client_for.get(f"/sweeps/{sweep_run.pk}/report.json").content)
    assert stored["trials"] == json.loads(json.dumps(sweep_result["trials"]))  # as the JSONField keeps them
    rows = list(csv.DictReader(io.StringIO(client_for.get(f"/sweeps/{sweep_run.pk}/trials.csv").content.decode())))
    assert [int(row["id"]) for row in rows] == [trial["id"] for trial in sweep_result["trials"]]
    for row, trial in zip(rows, sweep_result["trials"], strict=True):
        assert float(row["output_tokens_per_s"]) == pytest.approx(trial["metrics"]["output_tokens_per_s"])
        assert row["bound"] == trial["roofline"]["bound"]


def test_two_reports_compare_side_by_side(client_for, sweep_run):
    page = client_for.get("/sweeps/compare/", {"a": sweep_run.pk, "b": sweep_run.pk}).content.decode()
    assert page.count('class="side"') == 2


def test_sweep_reports_are_private_to_the_team(outsider, sweep_run):
    client = Client()
    client.force_login(outsider)
    for url in ("/sweeps/{}/", "/sweeps/{}/report.html", "/sweeps/{}/report.json", "/sweeps/{}/trials.csv"):
        assert client.get(url.format(sweep_run.pk)).status_code == 404
    assert 'class="side"' not in client.get("/sweeps/compare/", {"a": sweep_run.pk}).content.decode()
    assert Client().get(f"/sweeps/{sweep_run.pk}/")["Location"].startswith("/login/")


def test_a_sweep_on_a_node_gets_the_figures_its_env_check_measured(cluster, owner, node):
    node.devices.update(measured={"copy_bandwidth_bytes_per_s": 4e10, "matmul_flops_per_s": {"fp32": 1.6e11}})
    spec = intake.add_from_catalog(team=cluster.team, user=owner, slug="qwen3-0.6b")[0]
    job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=spec, stages=["sweep"])
    [(chosen, params)] = placement.stage_assignments(job, "sweep", [node])
    assert params["hardware"] == {"memory_bandwidth_bytes_per_s": 4e10, "flops_per_s": {"fp32": 1.6e11}}


def test_the_api_lists_reports_and_downloads_them_with_a_token(member_api, outsider_api, sweep_run, sweep_result):
    assert [row["id"] for row in member_api.get("/api/sweep-reports/").json()["results"]] == [sweep_run.pk]
    detail = member_api.get(f"/api/sweep-reports/{sweep_run.pk}/").json()
    assert detail["result"]["search"]["configurations"] == sweep_result["search"]["configurations"]
    html = member_api.get(f"/api/sweep-reports/{sweep_run.pk}/html/")
    assert html["Content-Type"].startswith("text/html") and b"plotly.js v" in html.content
    rows = member_api.get(f"/api/sweep-reports/{sweep_run.pk}/csv/").content.decode().splitlines()
    assert len(rows) == 1 + len(sweep_result["trials"])
    assert outsider_api.get(f"/api/sweep-reports/{sweep_run.pk}/html/").status_code == 404


def test_an_efficiency_above_one_is_never_shown_without_the_ceiling_marked_suspect(client_for, cluster, owner,
                                                                                   node, sweep_result):
    import copy

    result = copy.deepcopy(sweep_result)
    fast = next(trial for trial in result["trials"] if trial["roofline"])
    # What a ceiling measured on a loaded machine produced in a real report stored before flags existed (the trial
    # itself may already be flagged on this machine: its own ratio is cleared so the stored 1.9 is what is read)
    fast["roofline"].update(efficiency=1.9, ceiling_ratio=None, flag=None, note=None)
    result["best"] = {key: fast[key] for key in ("id", "params", "metrics", "roofline")}
    run = stored_sweep(cluster, owner, node, result)
    page = client_for.get(f"/sweeps/{run.pk}/").content.decode()
    assert "roofline ceiling suspect: measured 1.90× faster than it" in page
    # (a real trial of this loaded machine may be over its ceiling too: it is counted the same way)
    over = sum(Roofline.from_dict(trial["roofline"] or {}).efficiency.flagged for trial in result["trials"])
    assert f"{over} trial(s) measured faster than the roofline's ceiling" in page
    assert "ceiling suspect (1.90×)" in page and "roofline efficiency 1.90" not in page
    rows = list(csv.DictReader(io.StringIO(client_for.get(f"/sweeps/{run.pk}/trials.csv").content.decode())))
    flagged = [row["id"] for row in rows if row["roofline_ceiling_suspect"] == "True"]
    assert str(fast["id"]) in flagged and len(flagged) == over
    # The trials of a real sweep here stay below their ceiling or are flagged in the same way
    plain = client_for.get(f"/sweeps/{stored_sweep(cluster, owner, node, sweep_result).pk}/").content.decode()
    assert ("ceiling suspect" in plain) == any(trial["roofline"] and trial["roofline"]["flag"] == "over_ceiling"
                                               for trial in sweep_result["trials"])


def test_the_sweep_page_shows_the_per_step_overhead_and_a_flag_in_place_of_an_impossible_efficiency(
        client_for, cluster, owner, node, sweep_result):
    import copy

    result = copy.deepcopy(sweep_result)
    overhead = result["roofline"]["overhead"]
    assert overhead["seconds_per_step"] >= 0
    flagged_trial = result["trials"][0]
    flagged_trial["roofline"].update(flag="over_ceiling", efficiency=None, ceiling_ratio=1.37,
                                     note="measured faster than the predicted ceiling")
    for trial in result["trials"][1:]:
        trial["roofline"].update(flag=None, efficiency=0.42, ceiling_ratio=None)
    run = stored_sweep(cluster, owner, node, result)
    page = client_for.get(f"/sweeps/{run.pk}/").content.decode()
    assert f"Per-step overhead: {overhead['seconds_per_step']:.5f} s a step" in page
    assert "ceiling suspect (1.37×)" in page and "1 trial(s) measured faster" in page
    assert page.count("<td>0.42</td>") == len(result["trials"]) - 1
    # The roofline chart plots no efficiency for it: it is marked on its ceiling instead
    roofline = chart_data(result)["roofline"]["data"]
    [marked] = [trace for trace in roofline if trace["name"].startswith("flagged")]
    [plotted] = [trace for trace in roofline if trace["name"].startswith("trials")]
    assert len(marked["x"]) == 1 and len(plotted["x"]) == len(result["trials"]) - 1
    rows = list(csv.DictReader(io.StringIO(client_for.get(f"/sweeps/{run.pk}/trials.csv").content.decode())))
    assert [row["roofline_ceiling_suspect"] for row in rows] == ["True"] + ["False"] * (len(rows) - 1)
    assert rows[0]["roofline_efficiency"] == "" and rows[1]["step_overhead_s"] != ""


def stored_sweep(cluster, owner, node, result, slug="qwen3-0.6b") -> StageRun:
    """A sweep stage run of a job, succeeded with ``result``, as a node would have stored it."""
    spec = intake.add_from_catalog(team=cluster.team, user=owner, slug=slug)[0]
    job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=spec, stages=["sweep"])
    run = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname)
    run.start()
    run.finish(result=result)
    return run


def test_a_tie_at_this_noise_is_never_shown_as_confirmed_and_the_headline_says_it_is_a_proxy(client_for, cluster,
                                                                                            owner, node):
    """Issue 29: Kimi-K2's proxy pick measured 54 to 377 tok/s in its three runs, was shown as "Confirmed" in green,
    and the job's headline "best 304.1 output tok/s" read as the release's figure."""
    from .test_sweep_charts import noisy_sweep

    stored = noisy_sweep({1: [[100, 110, 120], [100, 105, 110]], 2: [[290, 300, 310], [158, 200, 250]],
                          4: [[700, 739, 760], [54, 300, 377]]})
    stored["knobs_not_swept"] = {"knobs": {"page_size": {"given": [16, 32], "served_at": 16}},
                                 "why": "RuntimeError: index_copy_", "note": "they were not swept"}
    run = stored_sweep(cluster, owner, node, stored)
    page = client_for.get(f"/sweeps/{run.pk}/").content.decode()
    assert '<p class="verdict tie">Leading, but inconclusive at this noise:' in page
    assert 'class="verdict ok"' not in page
    assert "300.0 output tokens/s\n  (median of 3 re-measured runs, 54.0 – 377.0)" in page
    assert "Verdict: inconclusive at this noise — the winner&#x27;s runs (54–377 over 3 runs) overlap" in page
    # The first pass's 739 stands in the table only beside the re-measurement that contradicts it, flagged
    assert "first pass; re-measured 300.0 (3 runs: 54.0 – 377.0)" in page
    rows = list(csv.DictReader(io.StringIO(client_for.get(f"/sweeps/{run.pk}/trials.csv").content.decode())))
    assert [float(row["remeasured_output_tokens_per_s"]) for row in rows] == [105, 200, 300]
    outcomes = client_for.get(f"/jobs/{run.job_id}/").content.decode()
    assert ("proxy (2-layer reduced model, hidden size 128, random weights): best 300.0 output tok/s (median of 3 "
            "runs, 54.0–377.0) — inconclusive at this noise; 3 of 3 trials served") in outcomes
    assert "no winner at this noise" in outcomes
    assert "Not swept: page_size\n  (given 16, 32, served at 16)" in page
    assert "not swept: page_size, which the static path this architecture is served by does not use" in outcomes


def test_a_confirmed_pick_is_green_and_a_report_stored_before_verdicts_is_not_called_confirmed(client_for, cluster,
                                                                                              owner, node):
    from .test_sweep_charts import FLUKE, noisy_sweep

    stored = noisy_sweep({batch: [list(runs) for runs in script] for batch, script in FLUKE.items()})
    page = client_for.get(f"/sweeps/{stored_sweep(cluster, owner, node, stored).pk}/").content.decode()
    assert '<p class="verdict ok">Best, confirmed:' in page and "which changed the pick from trial 2" in page
    old = {**stored, "best": {**stored["best"], "confirmed": True}}
    del old["verdict"], old["best"]["remeasured"]
    page = client_for.get(f"/sweeps/{stored_sweep(cluster, owner, node, old).pk}/").content.decode()
    assert "Best (not judged: this report was stored before verdicts)" in page and 'class="verdict ok"' not in page
    assert "Finalists re-measured (no verdict: a report stored before verdicts)" in page


def test_an_engine_sweeps_tie_is_shown_as_one_with_both_finalists_runs(job, node, member):
    """The engine report shows the verdict as the proxy's does: a tie is not green, and the runs are there."""
    from workers.engine.sweep.verdict import judge

    from .test_trial_row import stored_serve_sweep

    stored = stored_serve_sweep()
    stored["verdict"] = judge([{"settings": {"max_num_seqs": 4}, "client": {"concurrency": 4}, "trial_ids": [1, 2, 3],
                                "runs": [431.25, 380.0, 520.0]},
                               {"settings": {"max_num_seqs": 2}, "client": {"concurrency": 2}, "trial_ids": [4, 5, 6],
                                "runs": [400.0, 410.0, 300.0]}], "output_tokens_per_s")
    run = StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                  status="succeeded", result=stored)
    client = Client()
    client.force_login(member)
    page = client.get(f"/engines/{run.pk}/").content.decode()
    assert '<p class="verdict tie">Best configuration (trial 1, inconclusive at this noise)' in page
    assert "<td>runner-up</td><td>max_num_seqs=2, concurrency=2</td>" in page
    assert "<td>400.00, 410.00, 300.00</td>" in page
    outcomes = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "the pick is inconclusive at this noise: the winner&#x27;s runs (380–520 over 3 runs) overlap" in outcomes
