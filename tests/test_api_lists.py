"""API lists filter, order and paginate (deep pages too); they scope by the user's team ids without DISTINCT and
without loading the models' configs; the OpenAPI schema describes every endpoint."""

from datetime import timedelta

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from adaptation.models import AdaptationJob, Membership, ModelSpec


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


def test_the_list_writes_each_job_as_the_job_serializer_does(member_api, cluster, owner, model_spec, settings):
    """The list reads only the columns it shows of a page's jobs and their related rows; each row must be what
    JobSerializer writes of the whole job: a model or none, a submitter or none, dates set or not, a retry, in
    another time zone than UTC."""
    from adaptation.jobs.api import JobSerializer

    settings.TIME_ZONE = "Europe/Paris"
    first, second, third = make_jobs(cluster, owner, ["succeeded", "running", "queued"])
    AdaptationJob.objects.filter(pk=first.pk).update(model=model_spec, started=timezone.now(),
                                                     finished=timezone.now(), error="a <b>reason</b>",
                                                     parameters={"env_check": {"quick": True}}, progress=1.0)
    AdaptationJob.objects.filter(pk=second.pk).update(submitted_by=None, retry_of=first, started=timezone.now())
    listed = member_api.get("/api/jobs/").json()["results"]
    expected = [JobSerializer(AdaptationJob.objects.get(pk=job.pk)).data for job in (third, second, first)]
    assert listed == expected
    assert listed[2]["model_name"] == model_spec.name and listed[1]["submitted_by"] is None
    assert listed[2]["finished"].endswith("+01:00")


def test_a_bad_filter_value_is_a_field_error(member_api, cluster):
    response = member_api.get("/api/jobs/?status=exploded")
    assert response.status_code == 400
    assert "status" in response.json()


def test_lists_paginate(member_api, cluster, owner):
    make_jobs(cluster, owner, ["queued"] * 55)
    first = member_api.get("/api/jobs/").json()
    assert (first["count"], len(first["results"])) == (55, 50)
    assert len(member_api.get(first["next"]).json()["results"]) == 5


def test_deep_pages_hold_every_row_once_in_the_list_order(member_api, member, cluster, owner, settings):
    jobs = make_jobs(cluster, owner, ["succeeded", "failed", "running"] * 40)
    for i, job in enumerate(jobs):  # finished in another order than created, some not at all
        job.finished = None if job.status == "running" else timezone.now() - timedelta(minutes=(i * 7) % 120)
        job.save(update_fields=["finished"])

    def every_page(url):
        rows = []
        while url:
            page = member_api.get(url).json()
            rows += [row["id"] for row in page["results"]]
            url = page["next"]
        return rows

    by_created = [job.pk for job in sorted(jobs, key=lambda job: job.created, reverse=True)]
    assert every_page("/api/jobs/") == by_created
    # PostgreSQL puts NULLs first in a descending order; ties (none here but the NULLs) in any order.
    by_finished = every_page("/api/jobs/?ordering=-finished")
    assert sorted(by_finished) == sorted(by_created)
    finished = AdaptationJob.objects.order_by("-finished").values_list("finished", flat=True)
    assert [AdaptationJob.objects.get(pk=pk).finished for pk in by_finished] == list(finished)
    settings.D0_PAGE_SIZE = 25
    client = Client()
    client.force_login(member)
    last = client.get("/jobs/?page=5")
    assert [job.pk for job in last.context["page"]] == by_created[100:]
    assert len(client.get("/jobs/?page=2&status=failed").context["page"]) == 15


def test_job_lists_scope_by_team_ids_without_distinct_or_model_configs(member_api, member, cluster, owner,
                                                                       model_spec):
    make_jobs(cluster, owner, ["failed", "running"])
    client = Client()
    client.force_login(member)
    for fetch in (lambda: client.get("/jobs/?status=failed&status=running"),
                  lambda: member_api.get("/api/jobs/?status=failed&ordering=-finished")):
        with CaptureQueriesContext(connection) as captured:
            assert fetch().status_code == 200
        statements = [query["sql"] for query in captured.captured_queries]
        assert not [sql for sql in statements if "DISTINCT" in sql]
        # The memberships are read once per request; no list joins them.
        assert len([sql for sql in statements if "adaptation_membership" in sql]) == 1
        assert not [sql for sql in statements if '"adaptation_modelspec"."config"' in sql]
    # The filter form still lists the team's models, by name.
    assert f'<option value="{model_spec.pk}">{model_spec.name}</option>' in client.get("/jobs/").content.decode()


def test_a_member_removed_from_the_team_loses_its_rows_at_the_next_request(member_api, member, cluster, owner):
    job, = make_jobs(cluster, owner, ["queued"])
    assert member_api.get(f"/api/jobs/{job.pk}/").status_code == 200
    Membership.objects.filter(user=member).delete()
    assert member_api.get(f"/api/jobs/{job.pk}/").status_code == 404  # its team ids read afresh
    assert ModelSpec.objects.for_user(member).count() == 0


def test_the_schema_lists_every_endpoint(member_api, db):
    response = member_api.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ["/api/clusters/", "/api/nodes/", "/api/devices/", "/api/links/", "/api/models/", "/api/jobs/",
                 "/api/jobs/{id}/cancel/", "/api/jobs/{id}/retry/", "/api/stage-runs/", "/api/status/"]:
        assert path in paths, path
