"""The job page leads with what each stage found: a headline per stage run, and its warnings (a proxy sweep says it
is one; a sweep with a trial over its ceiling says the ceiling is suspect)."""

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from adaptation.models import StageRun


def test_the_job_page_leads_with_each_stages_outcome(member, job, node):
    probe = job.stage_runs.get()
    probe.start()
    probe.finish(result={"devices": [{"kind": "cpu", "name": "EPYC"}]})
    sweep = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname)
    sweep.start()
    sweep.finish(result={"trials": [{"status": "ok", "roofline": {"efficiency": 1.9}},
                                    {"status": "failed", "roofline": None}],
                         "best": {"metrics": {"output_tokens_per_s": 812.5}}, "model": {"reduced": True}})
    failed = StageRun.objects.create(job=job, kind="op_coverage", node=node, node_name=node.hostname)
    failed.start()
    failed.fail("tracing failed: no kernel")
    client = Client()
    client.force_login(member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    outcomes = page[page.index('id="job-outcomes"'):page.index("</ul>", page.index('id="job-outcomes"'))]
    assert "env_probe</strong> on gpu-01: 1 device(s): EPYC" in outcomes
    assert ("proxy (reduced model, random weights): best 812.5 output tok/s, not judged (stored before verdicts); "
            "1 of 2 trials served") in outcomes
    assert "a proxy: a reduced model with random weights on transformers" in outcomes
    assert "the ceiling is suspect" in outcomes
    assert "op_coverage</strong> on gpu-01: tracing failed: no kernel" in outcomes


def test_the_cluster_page_shows_how_busy_each_node_is(member, job, node, cluster):
    from adaptation.models import Node

    running = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname)
    running.start()
    Node.objects.create(cluster=cluster, hostname="gpu-02", queue_name="d0.node.alpha.h100-pod.gpu-02")
    client = Client()
    client.force_login(member)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    cells = [page[index:page.index("</td>", index)] for index in
             [position for position in range(len(page)) if page.startswith('<td class="busy">', position)]]
    assert [cell.removeprefix('<td class="busy">') for cell in cells] == ["1 running, 1 waiting", "idle"]


def test_the_join_command_names_this_installs_broker_without_its_credentials(member, cluster, settings):
    from adaptation.clusters import services

    settings.D0_EMBEDDED_BROKER = False
    settings.D0_BROKER_URL = "redis://control:s3cret@redis.internal:6380/2"
    assert services.node_broker_hint() == {"url": "redis://NODE-USER:PASSWORD@redis.internal:6380/2",
                                           "local_only": False}
    client = Client()
    client.force_login(member)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "--broker redis://NODE-USER:PASSWORD@redis.internal:6380/2" in page and "s3cret" not in page
    settings.D0_EMBEDDED_BROKER = True
    settings.D0_BROKER_URL = "redis+socket:///srv/d0/var/valkey.sock"
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "only a node on this\n  machine can reach it" in page


def test_a_cluster_with_an_active_job_is_not_deleted(owner_api, cluster, job):
    from adaptation.models import AdaptationJob, Cluster

    response = owner_api.delete(f"/api/clusters/{cluster.pk}/")
    assert response.status_code == 409 and f"#{job.pk}" in response.json()["detail"]
    assert Cluster.objects.filter(pk=cluster.pk).exists() and AdaptationJob.objects.filter(pk=job.pk).exists()
    job.cancel()
    assert owner_api.delete(f"/api/clusters/{cluster.pk}/").status_code == 204
    assert not Cluster.objects.filter(pk=cluster.pk).exists()


def test_the_admin_keeps_a_cluster_with_an_active_job(admin_client, cluster, job):
    page = admin_client.get(f"/admin/adaptation/cluster/{cluster.pk}/delete/")
    assert page.status_code == 403
    admin_client.post("/admin/adaptation/cluster/", {"action": "delete_selected", "_selected_action": [cluster.pk],
                                                     "post": "yes"})
    from adaptation.models import Cluster

    assert Cluster.objects.filter(pk=cluster.pk).exists()


def test_the_progress_json_leads_with_the_running_stage_and_the_outcomes_so_far(member, job, node):
    """A running job's poll carries each ended stage's outcome and a headline on the stage running now (it once
    carried no outcome until the job ended, so the page led with "running env_probe" while the sweep ran)."""
    from adaptation.models import AdaptationJob

    job.stages = ["env_probe", "sweep"]
    job.save(update_fields=["stages"])
    AdaptationJob.objects.filter(pk=job.pk).update(status="running")
    client = Client()
    client.force_login(member)
    probe = job.stage_runs.get()
    probe.start()
    StageRun.objects.filter(pk=probe.pk).update(progress=0.4, message="probing devices")
    live = client.get(f"/jobs/{job.pk}/progress/").json()
    assert live["terminal"] is False
    assert live["headline"] == "Running env_probe on gpu-01: 40% (probing devices)"
    assert [(item["kind"], item["status"]) for item in live["outcomes"]] == [("env_probe", "running")]

    probe.finish(result={"devices": [{"kind": "cpu", "name": "EPYC"}]})
    sweep = StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname)
    sweep.start()
    StageRun.objects.filter(pk=sweep.pk).update(progress=0.77, message="trial 7 of 9",
                                                result={"partial": "never decoded on a poll"})
    live = client.get(f"/jobs/{job.pk}/progress/").json()
    assert live["headline"] == "Running sweep on gpu-01: 77% (trial 7 of 9)"
    assert [(item["kind"], item["status"], item["summary"]) for item in live["outcomes"]] == [
        ("env_probe", "succeeded", "1 device(s): EPYC"), ("sweep", "running", "trial 7 of 9")]
    assert live["pending_stages"] == []
    # The ended stage's outcome was worked out once: later polls read no result (a sweep's can be 500 KB).
    with CaptureQueriesContext(connection) as polled:
        assert client.get(f"/jobs/{job.pk}/progress/").json()["outcomes"] == live["outcomes"]
    assert not any('"result"' in query["sql"] for query in polled), [query["sql"] for query in polled]

    AdaptationJob.objects.filter(pk=job.pk).update(status="succeeded")
    assert client.get(f"/jobs/{job.pk}/progress/").json()["headline"] == ""  # the outcome lines say it now
