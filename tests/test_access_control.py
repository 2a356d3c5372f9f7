"""Every page and endpoint: anonymous → 401/redirect, outsider → 404, team member → what members get."""

import pytest
from django.test import Client
from django.urls import reverse

from adaptation.models import (Cluster, CoverageReport, EnvReport, Link, ModelPlan, OperatorRecord,
                               ServingEndpoint, StageRun, VirtualBackend)


@pytest.fixture
def link(cluster, node):
    device = node.devices.get()
    return Link.objects.create(cluster=cluster, kind="loopback", source_device=device, target_device=device)


@pytest.fixture
def rows(job, link):
    """One of everything, in the owner's team."""
    run = job.stage_runs.get()
    report = EnvReport.objects.create(node=run.node, job=job, stage_run=run, verdict="pass", report={"checks": []})
    plan = ModelPlan.objects.create(model=job.model, request={}, result={})
    coverage = CoverageReport.objects.create(model=job.model, job=job, stage_run=run, backend="cpu", dtype="bf16",
                                             coverage=1.0, report={"operators": []})
    operator = OperatorRecord.objects.create(team=job.team, backend="cpu", operator="aten::mm.default",
                                             status="native", last_verified=run.created)
    virtual = VirtualBackend.objects.create(team=job.team, name="vendorx", operators=["aten::mm"])
    sweep = StageRun.objects.create(job=job, kind="sweep", node=run.node, node_name=run.node_name, status="succeeded",
                                    result={"trials": [], "search": {}, "roofline": {}})
    endpoint = ServingEndpoint(team=job.team, name="prod", base_url="http://gpu-node-3:8000", served_model="m")
    endpoint.set_api_key("sk-secret")
    endpoint.save()
    endpoint_report = StageRun.objects.create(
        job=job, kind="endpoint_bench", node=run.node, node_name=run.node_name, status="succeeded",
        result={"endpoint": {"base_url": endpoint.base_url, "served_model": "m", "api_key": "set"}, "trials": [],
                "workload": {}, "best": None, "seconds": 1.0})
    return {
        "cluster": job.cluster.pk, "node": run.node.pk, "device": run.node.devices.get().pk, "link": link.pk,
        "model": job.model.pk, "job": job.pk, "stage_run": run.pk, "env_report": report.pk, "plan": plan.pk,
        "coverage": coverage.pk, "operator": operator.pk, "virtual": virtual.pk, "sweep": sweep.pk,
        "endpoint": endpoint.pk, "endpoint_report": endpoint_report.pk,
    }


API_DETAIL = [
    ("/api/clusters/{cluster}/", "cluster"),
    ("/api/nodes/{node}/", "node"),
    ("/api/devices/{device}/", "device"),
    ("/api/links/{link}/", "link"),
    ("/api/models/{model}/", "model"),
    ("/api/jobs/{job}/", "job"),
    ("/api/stage-runs/{stage_run}/", "stage_run"),
    ("/api/env-reports/{env_report}/", "env_report"),
    ("/api/model-plans/{plan}/", "plan"),
    ("/api/clusters/{cluster}/topology/", "cluster"),
    ("/api/coverage-reports/{coverage}/", "coverage"),
    ("/api/operators/{operator}/", "operator"),
    ("/api/virtual-backends/{virtual}/", "virtual"),
    ("/api/sweep-reports/{sweep}/", "sweep"),
    ("/api/sweep-reports/{sweep}/csv/", "sweep"),
    ("/api/serving-endpoints/{endpoint}/", "endpoint"),
    ("/api/endpoint-reports/{endpoint_report}/", "endpoint_report"),
]
API_LISTS = ["/api/clusters/", "/api/nodes/", "/api/devices/", "/api/links/", "/api/models/", "/api/jobs/",
             "/api/stage-runs/", "/api/env-reports/",
             "/api/model-plans/", "/api/coverage-reports/", "/api/operators/", "/api/virtual-backends/",
             "/api/sweep-reports/", "/api/serving-endpoints/", "/api/endpoint-reports/"]
PAGES_DETAIL = ["/clusters/{cluster}/", "/clusters/{cluster}/topology/", "/models/{model}/", "/jobs/{job}/",
                "/jobs/{job}/progress/", "/models/{model}/coverage/", "/models/{model}/sharded-runs/",
                "/sweeps/{sweep}/", "/sweeps/{sweep}/report.html", "/sweeps/{sweep}/trials.csv",
                "/endpoints/reports/{endpoint_report}/", "/endpoints/reports/{endpoint_report}/report.json"]
PAGES = ["/", "/clusters/", "/models/", "/models/new/", "/models/catalog/", "/jobs/", "/jobs/new/", "/account/token/",
         "/coverage/", "/coverage/diff/", "/sweeps/compare/", "/endpoints/", "/reports/", "/api/docs/",
         "/api/schema/"]


@pytest.mark.parametrize("url", API_LISTS + [detail for detail, _ in API_DETAIL])
def test_the_api_answers_401_to_anonymous_requests(url, rows, anon_api):
    response = anon_api.get(url.format(**rows))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize("url", [detail for detail, _ in API_DETAIL])
def test_another_teams_rows_are_404_in_the_api(url, rows, outsider_api):
    assert outsider_api.get(url.format(**rows)).status_code == 404


@pytest.mark.parametrize("url", API_LISTS)
def test_another_teams_rows_are_absent_from_api_lists(url, rows, outsider_api, member_api):
    assert outsider_api.get(url).json()["count"] == 0
    assert member_api.get(url).json()["count"] >= 1


@pytest.mark.parametrize("url", [detail for detail, _ in API_DETAIL])
def test_a_member_reads_the_teams_rows(url, rows, member_api):
    assert member_api.get(url.format(**rows)).status_code == 200


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_job_actions_are_404_for_an_outsider_and_401_for_anonymous(action, rows, outsider_api, anon_api):
    url = f"/api/jobs/{rows['job']}/{action}/"
    assert outsider_api.post(url).status_code == 404
    assert anon_api.post(url).status_code == 401


def test_an_outsider_cannot_submit_a_job_to_another_teams_cluster(rows, outsider_api):
    response = outsider_api.post("/api/jobs/", {"cluster": rows["cluster"], "stages": ["env_probe"]}, format="json")
    assert response.status_code == 400
    assert "does not exist" in response.json()["cluster"][0]


def test_only_team_admins_change_clusters(rows, owner_api, member_api, outsider_api):
    url = f"/api/clusters/{rows['cluster']}/"
    assert member_api.patch(url, {"description": "x"}, format="json").status_code == 403
    assert outsider_api.patch(url, {"description": "x"}, format="json").status_code == 404
    assert owner_api.patch(url, {"description": "x"}, format="json").status_code == 200
    created = member_api.post("/api/clusters/", {"name": "new", "team": "alpha"}, format="json")
    assert created.status_code == 403
    assert not Cluster.objects.filter(name="new").exists()
    created = owner_api.post("/api/clusters/", {"name": "new"}, format="json")
    assert created.status_code == 201, created.json()


def test_health_is_open_to_anonymous_and_tells_them_only_up_or_down(anon_api, member_api, node, db):
    response = anon_api.get("/api/status/")
    assert response.status_code in (200, 503)
    assert set(response.json()) == {"status"}
    # A signed-in user sees the workers, counting only their own teams' nodes.
    signed_in = member_api.get("/api/status/").json()
    assert set(signed_in) == {"status", "database", "broker", "workers"}
    assert signed_in["workers"]["node"] == 1


@pytest.mark.parametrize("url", PAGES + PAGES_DETAIL + ["/clusters/new/"])
def test_pages_send_anonymous_visitors_to_the_login_page(url, rows):
    response = Client().get(url.format(**rows))
    if url.startswith("/api/"):
        assert response.status_code == 401
    else:
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("url", PAGES_DETAIL)
def test_another_teams_pages_are_404(url, rows, outsider):
    client = Client()
    client.force_login(outsider)
    assert client.get(url.format(**rows)).status_code == 404


@pytest.mark.parametrize("url", PAGES + PAGES_DETAIL)
def test_a_member_sees_every_page(url, rows, member):
    client = Client()
    client.force_login(member)
    assert client.get(url.format(**rows)).status_code == 200


@pytest.mark.parametrize("url", ["/jobs/{job}/cancel/", "/jobs/{job}/retry/", "/clusters/{cluster}/env-check/",
                                 "/models/{model}/adapt/"])
def test_page_actions_are_404_for_an_outsider(url, rows, outsider):
    client = Client()
    client.force_login(outsider)
    assert client.post(url.format(**rows)).status_code == 404


def test_pages_do_not_leak_another_teams_rows_into_lists(rows, outsider):
    client = Client()
    client.force_login(outsider)
    for url in ["/", "/clusters/", "/models/", "/jobs/"]:
        body = client.get(url).content.decode()
        assert "h100-pod" not in body and "qwen3-0.6b" not in body, url


def test_a_member_cannot_open_the_new_cluster_form(member):
    client = Client()
    client.force_login(member)
    assert client.get("/clusters/new/").status_code == 403


def test_forms_need_a_csrf_token(member, rows):
    client = Client(enforce_csrf_checks=True)
    client.force_login(member)
    assert client.post(f"/jobs/{rows['job']}/cancel/").status_code == 403


def test_sign_ins_read_the_users_teams_afresh_on_every_request(rows, member, db):
    """A session and a token read the user, and so their team ids, afresh on every request: a membership removed
    counts at the next request, a deactivated user is signed out of both, and a user of no team still signs in and
    sees nothing."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from adaptation.models import Membership

    page = Client()
    page.force_login(member)
    api = APIClient(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=member).key}")
    assert page.get("/jobs/").status_code == 200 and api.get("/api/clusters/").json()["count"] == 1

    Membership.objects.filter(user=member).delete()
    assert page.get("/").status_code == 200  # signed in still, of no team
    assert api.get("/api/clusters/").json()["count"] == 0
    assert page.get(f"/clusters/{rows['cluster']}/").status_code == 404

    get_user_model().objects.filter(pk=member.pk).update(is_active=False)
    assert page.get("/").status_code == 302
    assert api.get("/api/clusters/").status_code == 401
    Membership.objects.create(team=Cluster.objects.get(pk=rows["cluster"]).team, user=member)
    assert page.get("/").status_code == 302
    assert api.get("/api/clusters/").status_code == 401


def test_a_session_ends_with_its_sign_out_and_its_expiry(member):
    """Django's database sessions: a session signed out, or past its expiry, is no session; a signed-in one lasts
    across requests."""
    from datetime import timedelta

    from django.contrib.sessions.models import Session
    from django.utils import timezone

    client = Client()
    assert client.post("/login/", {"username": member.username, "password": "a-long-test-password"}
                       ).status_code == 302
    assert client.get("/jobs/").status_code == 200 and client.get("/").status_code == 200
    stolen = client.cookies["sessionid"].value
    client.post("/logout/")
    assert client.get("/jobs/").status_code == 302
    replayed = Client()
    replayed.cookies["sessionid"] = stolen
    assert replayed.get("/jobs/").status_code == 302

    assert client.post("/login/", {"username": member.username, "password": "a-long-test-password"}
                       ).status_code == 302
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    assert client.get("/jobs/").status_code == 302


def test_a_session_naming_a_user_id_past_the_databases_integers_is_signed_out_not_an_error(db):
    """A session whose user id is past the database's integers (SQLite raises OverflowError binding it) is no
    sign-in: the login page, as Django's own backend answers, never a 500. (Session data is signed: only d0 writes
    it; this is the backend's contract, not an attack path.)"""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session.update({SESSION_KEY: str(10**30), BACKEND_SESSION_KEY: settings.AUTHENTICATION_BACKENDS[-1],
                    HASH_SESSION_KEY: "0" * 64})
    session.create()
    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    assert client.get("/jobs/").status_code == 302


def test_memberships_changed_through_the_many_to_many_count_at_the_next_request(rows, member, db):
    """``team.members.add/remove`` and ``user.teams.clear`` send no save signal: what they change counts at the next
    request all the same, for a session and a token, since each request reads its user's team ids afresh."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from adaptation.models import Team

    team = Cluster.objects.get(pk=rows["cluster"]).team
    other = Team.objects.create(name="another-team", slug="another-team")
    theirs = Cluster.objects.create(team=other, name="theirs")
    page = Client()
    page.force_login(member)
    api = APIClient(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=member).key}")

    def visible() -> set[int]:
        listed = {row["id"] for row in api.get("/api/clusters/").json()["results"]}
        shown = {pk for pk in (rows["cluster"], theirs.pk) if page.get(f"/clusters/{pk}/").status_code == 200}
        assert listed == shown
        return listed

    assert visible() == {rows["cluster"]}
    other.members.add(member)
    assert visible() == {rows["cluster"], theirs.pk}
    team.members.remove(member)
    assert visible() == {theirs.pk}
    member.teams.clear()
    assert visible() == set()


def test_every_filter_naming_a_row_offers_only_the_users_teams_rows(rows, outsider):
    """Every API filter that names a row (``?cluster=``, ``?job=``…), declared or made from a viewset's field list,
    offers the requesting user's teams' rows only: the outsider is offered none of the owner's team's."""
    from django.test import RequestFactory
    from django_filters.filters import QuerySetRequestMixin

    from adaptation.api_urls import router

    request = RequestFactory().get("/")
    request.user = outsider
    offered = {}
    for prefix, viewset, _basename in router.registry:
        view = viewset(request=request, action="list", format_kwarg=None)
        for backend in view.filter_backends:
            filterset_class = (backend().get_filterset_class(view, viewset.queryset)
                               if hasattr(backend, "get_filterset_class") else None)
            if filterset_class is not None:
                for name, row_filter in filterset_class(request=request, queryset=viewset.queryset).filters.items():
                    if isinstance(row_filter, QuerySetRequestMixin):
                        offered[f"/api/{prefix}/?{name}="] = row_filter.get_queryset(request).count()
    assert len(offered) >= 10 and "/api/jobs/?model=" in offered and "/api/coverage-reports/?job=" in offered
    assert offered == dict.fromkeys(offered, 0)
