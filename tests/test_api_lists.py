"""API lists filter, order and paginate; the OpenAPI schema describes every endpoint."""

from adaptation.models import AdaptationJob


def make_jobs(cluster, owner, statuses):
    return [AdaptationJob.objects.create(team=cluster.team, cluster=cluster, stages=["env_probe"], status=status,
                                         submitted_by=owner) for status in statuses]


def test_jobs_filter_by_status_and_stage(member_api, cluster, owner):
    queued, running, failed = make_jobs(cluster, owner, ["queued", "running", "failed"])
    ids = lambda query: [row["id"] for row in member_api.get(f"/api/jobs/?{query}").json()["results"]]  # noqa: E731
    assert ids("status=running&status=failed") == [failed.pk, running.pk]
    assert ids("stage=env_probe") == [failed.pk, running.pk, queued.pk]
    assert ids("stage=sharded_run") == []
    assert ids("ordering=created") == [queued.pk, running.pk, failed.pk]


def test_a_bad_filter_value_is_a_field_error(member_api, cluster):
    response = member_api.get("/api/jobs/?status=exploded")
    assert response.status_code == 400
    assert "status" in response.json()


def test_lists_paginate(member_api, cluster, owner):
    make_jobs(cluster, owner, ["queued"] * 55)
    first = member_api.get("/api/jobs/").json()
    assert (first["count"], len(first["results"])) == (55, 50)
    assert len(member_api.get(first["next"]).json()["results"]) == 5


def test_the_schema_lists_every_endpoint(member_api, db):
    response = member_api.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ["/api/clusters/", "/api/nodes/", "/api/devices/", "/api/links/", "/api/models/", "/api/jobs/",
                 "/api/jobs/{id}/cancel/", "/api/jobs/{id}/retry/", "/api/stage-runs/", "/api/status/"]:
        assert path in paths, path
