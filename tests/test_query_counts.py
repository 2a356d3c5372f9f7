"""List pages and list endpoints run a fixed number of queries, whatever the number of rows."""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from adaptation.models import (AdaptationJob, Cluster, CoverageReport, Device, EnvReport, Link, ModelPlan, ModelSpec,
                               Node, OperatorRecord, StageRun, VirtualBackend)


def add_rows(team, user, count):
    """``count`` of every kind of row, each pointing at distinct parents so N+1 patterns would show."""
    for i in range(count):
        cluster = Cluster.objects.create(team=team, name=f"c{i}-{Cluster.objects.count()}")
        node = Node.objects.create(cluster=cluster, hostname=f"n{i}", queue_name=f"q-{cluster.name}",
                                   last_heartbeat=timezone.now())
        device = Device.objects.create(node=node, index=0, kind="cpu", name="cpu")
        Device.objects.create(node=node, index=1, kind="cpu", name="cpu")
        Link.objects.create(cluster=cluster, kind="loopback", source_device=device, target_device=device)
        spec = ModelSpec.objects.create(team=team, name=f"m-{cluster.name}", config={"model_type": "llama"},
                                        created_by=user)
        job = AdaptationJob.objects.create(team=team, cluster=cluster, model=spec, stages=["env_probe"],
                                           submitted_by=user)
        run = StageRun.objects.create(job=job, kind="env_probe", node=node, node_name=node.hostname)
        EnvReport.objects.create(node=node, job=job, stage_run=run, verdict="pass", report={"checks": []})
        ModelPlan.objects.create(model=spec, request={}, result={}, created_by=user)
        CoverageReport.objects.create(model=spec, job=job, stage_run=run, node=node, backend=f"b{node.pk}",
                                      dtype="bf16", coverage=1.0, report={"operators": [], "summary": {"gaps": []}})
        OperatorRecord.objects.create(team=team, backend=f"b{node.pk}", operator="aten::mm.default", status="native",
                                      last_verified=run.created, first_model=spec)
        VirtualBackend.objects.create(team=team, name=f"v{node.pk}", operators=["aten::mm"], created_by=user)
        StageRun.objects.create(job=job, kind="sweep", node=node, node_name=node.hostname, status="succeeded",
                                result={"trials": []})


def queries_for(fetch) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = fetch()
    assert response.status_code == 200
    return len(captured)


API_LISTS = {
    # Each: the token with its user (DRF's TokenAuthentication), the user's team ids (read once per request),
    # COUNT(*) for the paginator, then one SELECT of the page (scoped by team_id IN those ids, related rows joined
    # in, cluster node counts as annotations).
    "/api/clusters/": 4,
    "/api/nodes/": 4,
    "/api/devices/": 4,
    "/api/links/": 4,
    "/api/models/": 4,
    "/api/jobs/": 4,
    "/api/stage-runs/": 4,
    "/api/env-reports/": 4,
    "/api/model-plans/": 4,
    "/api/coverage-reports/": 4,
    "/api/operators/": 4,
    "/api/virtual-backends/": 4,
    "/api/sweep-reports/": 4,
}

PAGES = {
    # Every page starts with 3: the session row, the user row and the user's team ids (read once per request).
    # Dashboard: clusters with annotated node counts, running jobs, recent jobs.
    "/": 3 + 3,
    # Clusters: the annotated cluster list.
    "/clusters/": 3 + 1,
    # Models: paginator COUNT(*) and the page.
    "/models/": 3 + 2,
    # Jobs: the filter form's cluster and model choices, paginator COUNT(*) and the page.
    "/jobs/": 3 + 4,
    # Coverage: the heatmap's newest reports, the library summary, the virtual backends, the upload form's
    # team field (its count, the one team as default, its options) and the shipped backends form's teams.
    "/coverage/": 3 + 7,
}


@pytest.mark.parametrize("url, expected", API_LISTS.items())
def test_list_endpoints_run_a_fixed_number_of_queries(url, expected, owner, team, owner_api):
    add_rows(team, owner, 1)
    assert queries_for(lambda: owner_api.get(url)) == expected
    add_rows(team, owner, 6)
    assert queries_for(lambda: owner_api.get(url)) == expected


def test_a_token_request_reads_its_user_with_the_token_and_their_team_ids_once(owner, team):
    """The token with its user (one query, DRF's select_related), the user's team ids, COUNT(*) for the
    paginator, the page."""
    client = APIClient(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=owner).key}")
    add_rows(team, owner, 2)
    assert queries_for(lambda: client.get("/api/jobs/")) == 4


@pytest.mark.parametrize("url, expected", PAGES.items())
def test_list_pages_run_a_fixed_number_of_queries(url, expected, owner, team):
    client = Client()
    client.force_login(owner)
    add_rows(team, owner, 1)
    assert queries_for(lambda: client.get(url)) == expected
    add_rows(team, owner, 6)
    assert queries_for(lambda: client.get(url)) == expected


def add_nodes(cluster, count):
    """``count`` nodes of two H200s joined by NVLink."""
    for _ in range(count):
        node = Node.objects.create(cluster=cluster, hostname=f"n{Node.objects.count()}",
                                   queue_name=f"q{Node.objects.count()}")
        a = Device.objects.create(node=node, index=0, kind="cuda", name="NVIDIA H200")
        b = Device.objects.create(node=node, index=1, kind="cuda", name="NVIDIA H200")
        Link.objects.create(cluster=cluster, kind="nvlink", source_device=a, target_device=b)


def test_the_cluster_page_runs_a_fixed_number_of_queries_whatever_its_node_count(owner, team):
    client = Client()
    client.force_login(owner)
    cluster = Cluster.objects.create(team=team, name="big")
    # Session, user, the user's team ids, cluster, admin check, nodes, their devices (one prefetch), the cluster's
    # recent jobs, its join tokens (the owner is an admin), its rejected node messages, its serve sweeps' results
    # (the prediction ledger).
    add_nodes(cluster, 1)
    assert queries_for(lambda: client.get(f"/clusters/{cluster.pk}/")) == 11
    add_nodes(cluster, 8)
    assert queries_for(lambda: client.get(f"/clusters/{cluster.pk}/")) == 11


def test_the_topology_page_and_endpoint_run_a_fixed_number_of_queries(owner, owner_api, team):
    client = Client()
    client.force_login(owner)
    cluster = Cluster.objects.create(team=team, name="topo")
    # Endpoint: the token with its user, the user's team ids, cluster, nodes, their devices (prefetch), latest
    # reports (DISTINCT ON), links with ends joined. The page reads its session and user instead of the token, and
    # adds the check history.
    for count in (1, 5):
        add_nodes(cluster, count)
        assert queries_for(lambda: owner_api.get(f"/api/clusters/{cluster.pk}/topology/")) == 7
        assert queries_for(lambda: client.get(f"/clusters/{cluster.pk}/topology/")) == 9
