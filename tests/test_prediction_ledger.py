"""The prediction ledger in the control plane: the cluster page shows how far d0's predictions were from what the
cluster's serve sweeps measured (median and P90 per engine and metric), and the next serve sweep dispatched to the
cluster is given the calibration fitted on them (the trials themselves: tests/engine/test_prediction_ledger.py)."""

import re

from django.test import Client
from django.utils.html import escape

from adaptation.models import AdaptationJob, Cluster, Node, StageRun
from adaptation.serving.stage import ServeSweep

# (roofline tok/s, measured tok/s, roofline TPOT, measured TPOT): the roofline is 4x too fast, give or take.
FIGURES = [(400.0, 100.0, 0.01, 0.04), (400.0, 110.0, 0.01, 0.036), (800.0, 180.0, 0.01, 0.045),
           (800.0, 200.0, 0.01, 0.04), (1600.0, 320.0, 0.01, 0.05)]


def served_trial(trial_id: int, roofline_tps, measured_tps, roofline_tpot, measured_tpot) -> dict:
    roofline = {"output_tokens_per_s": roofline_tps, "ttft_s": 0.002, "tpot_s": roofline_tpot,
                "peak_memory_bytes": 2**30}
    return {"id": trial_id, "settings": {"max_num_seqs": 4}, "client": {}, "status": "ok",
            "metrics": {"output_tokens_per_s": measured_tps, "ttft_s": {"p50": 0.01}, "tpot_s": {"p50": measured_tpot},
                        "peak_memory_bytes": 3 * 2**30},
            "prediction": {"available": True, "roofline": roofline, "predicted": roofline, "calibration": None,
                           "basis": "roofline from the node's env-check figures, not calibrated"}}


def serve_sweep_run(cluster, node, model_spec, owner, figures=FIGURES) -> StageRun:
    job = AdaptationJob.objects.create(team=cluster.team, cluster=cluster, model=model_spec, stages=["serve_sweep"],
                                       submitted_by=owner, status="succeeded")
    trials = [served_trial(index, *row) for index, row in enumerate(figures)]
    # A failed trial and one without a prediction (no env check then) are not in the ledger.
    trials += [{"id": 90, "status": "failed", "settings": {}, "client": {}},
               {**served_trial(91, 1.0, 1.0, 1.0, 1.0), "prediction": {"available": False, "reason": "no figures"}}]
    return StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                   status="succeeded", result={"engine": {"name": "vllm"}, "trials": trials})


def test_the_cluster_page_shows_the_error_distribution_per_engine_and_metric(cluster, node, model_spec, owner,
                                                                             member):
    serve_sweep_run(cluster, node, model_spec, owner)
    client = Client()
    client.force_login(member)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    ledger = page[page.index('id="prediction-ledger"'):]
    ledger = ledger[:ledger.index("</section>")]
    body = ledger.split("<tbody>")[1].split("</tbody>")[0]
    rows = {cells[1]: cells for cells in (re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>")[:-1])}
    # Throughput errors |r - m| / m: 3, 2.636, 3.444, 3, 4 -> median 300.0%, P90 3.444 + 0.6 x (4 - 3.444) = 377.8%.
    assert rows["output tok/s"][:5] == ["vllm", "output tok/s", "5", "300.0%", "377.8%"]
    # TPOT errors: .75, .722, .778, .75, .8 -> median 75.0%, P90 79.1%.
    assert rows["TPOT (p50)"][2:5] == ["5", "75.0%", "79.1%"]
    assert {"TTFT (p50)", "peak memory"} <= set(rows)
    assert escape("calibrated on 5 trials of this cluster") in ledger
    # TPOT's roofline is the same in every trial: no line, the median ratio (.04/.01 ..). Throughput's spreads 4x:
    # a line in seconds per token (1/100 = 0.000991 + 3.41 x 1/400 .., Theil-Sen's median slope).
    assert "TPOT (p50): roofline × 4;" in ledger
    assert "output tok/s: 1 / (0.000991 s + 3.41 × the roofline&#x27;s s per token)" in ledger


def test_a_cluster_without_measured_trials_says_it_has_none(cluster, node, member):
    client = Client()
    client.force_login(member)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "No predictions have been measured on this cluster yet" in page


def test_the_next_serve_sweep_is_calibrated_on_the_clusters_trials_and_on_no_others(cluster, node, model_spec,
                                                                                    owner, team):
    job = AdaptationJob.objects.create(team=team, cluster=cluster, model=model_spec, stages=["serve_sweep"],
                                       submitted_by=owner)
    prepared = ServeSweep().prepare(job, {"engine": "vllm"}, [node])
    # No measurement yet: no calibration, and no figures for a node that ran no env check.
    assert prepared["calibration"] is None and prepared["hardware"] is None
    other = Cluster.objects.create(team=team, name="elsewhere")
    other_node = Node.objects.create(cluster=other, hostname="cpu-02", queue_name="d0.node.elsewhere.cpu-02")
    serve_sweep_run(other, other_node, model_spec, owner)
    assert ServeSweep().prepare(job, {"engine": "vllm"}, [node])["calibration"] is None
    serve_sweep_run(cluster, node, model_spec, owner, FIGURES[:3])
    calibration = ServeSweep().prepare(job, {"engine": "vllm"}, [node])["calibration"]
    assert calibration["trials"] == 3 and calibration["engine"] == "vllm"
    assert calibration["ratios"]["output_tokens_per_s"] == 0.25  # the median of .25, .275, .225
    assert calibration["ratios"]["tpot_s"] == 4.0
    # Another engine's trials calibrate nothing for this one.
    assert ServeSweep().prepare(job, {"engine": "sglang"}, [node])["calibration"] is None


def test_the_engine_report_says_what_d0_predicted_for_the_recipes_trial_and_on_what(cluster, node, model_spec,
                                                                                   owner, member):
    run = serve_sweep_run(cluster, node, model_spec, owner)
    entry = {**run.result["trials"][0]["prediction"], "basis": "calibrated on 6 trials of this cluster"}
    entry["predicted"] = {"output_tokens_per_s": 123.4, "ttft_s": 0.0123, "tpot_s": 0.0456,
                          "peak_memory_bytes": 3 * 2**30}
    run.result = {**run.result, "best": {"id": 0, "settings": {"max_num_seqs": 4}},
                  "recipe": {"engine": "vllm", "settings": {"max_num_seqs": 4}, "trial": 0, "command": "vllm serve",
                             "measured": {"output_tokens_per_s": 100.0},
                             "prediction": {"available": False, "reason": "no figures", "ledger": entry}}}
    run.save(update_fields=["result"])
    client = Client()
    client.force_login(member)
    page = client.get(f"/engines/{run.pk}/").content.decode()
    line = page[page.index('class="prediction-ledger"'):]
    line = " ".join(line[:line.index("</p>")].split())
    assert "d0 predicted for this trial 123.4 output tokens/s, TTFT 0.0123 s, TPOT 0.0456 s, 3.0" in line
    assert "(calibrated on 6 trials of this cluster)" in line


def test_the_api_gives_the_clusters_ledger_to_its_team_only(cluster, node, model_spec, owner, member_api,
                                                            outsider_api):
    serve_sweep_run(cluster, node, model_spec, owner)
    response = member_api.get(f"/api/clusters/{cluster.pk}/prediction-ledger/")
    assert response.status_code == 200, response.content
    ledger = response.json()
    throughput = next(row for row in ledger["table"] if row["metric"] == "output_tokens_per_s")
    assert throughput["trials"] == 5 and throughput["median"] == 3.0 and throughput["roofline"]["median"] == 3.0
    assert ledger["calibrations"][0]["trials"] == 5
    assert ledger["calibrations"][0]["lines"]["output_tokens_per_s"]["slope"] > 0
    assert outsider_api.get(f"/api/clusters/{cluster.pk}/prediction-ledger/").status_code == 404
