"""A row stays in its team: no API update, form or admin page moves it to another team (even for someone who
administers both), the permission checks read the stored row rather than the values a request asks for, and a
serving endpoint whose address changes loses its stored key unless a new one comes with the address."""

import pytest
from django.test import Client

from adaptation.api_urls import router
from adaptation.choices import TeamRole
from adaptation.models import Cluster, JoinToken, Membership, ServingEndpoint, VirtualBackend
from adaptation.serving.forms import ServingEndpointForm
from tests.conftest import _client, _user

SECRET = "sk-team-a-secret-7c1e"
# The API resources whose rows can be changed after they are made, each with the row's full body for a PUT.
UPDATABLE = {"clusters", "serving-endpoints"}


@pytest.fixture
def mallory(team, other_team):
    """A member (not admin) of the row's team who administers another team: the issue's attacker."""
    user = _user("mallory", team, TeamRole.MEMBER)
    Membership.objects.create(team=other_team, user=user, role=TeamRole.ADMIN)
    return user


@pytest.fixture
def double_admin(team, other_team):
    """An admin of both teams: moving a row between them is still not an operation."""
    user = _user("dora", team, TeamRole.ADMIN)
    Membership.objects.create(team=other_team, user=user, role=TeamRole.ADMIN)
    return user


@pytest.fixture
def endpoint(team, member):
    endpoint = ServingEndpoint(team=team, name="prod", base_url="http://gpu-node-3:8000", served_model="qwen3",
                               created_by=member)
    endpoint.set_api_key(SECRET)
    endpoint.save()
    return endpoint


def test_every_resource_that_takes_updates_is_covered_here():
    updatable = {prefix for prefix, viewset, _ in router.registry
                 if hasattr(viewset, "update") or hasattr(viewset, "partial_update")}
    assert updatable == UPDATABLE


def _bodies(cluster, endpoint):
    return {
        "clusters": (f"/api/clusters/{cluster.pk}/",
                     {"name": cluster.name, "description": "moved", "expected_devices_per_node": 8,
                      "interconnect": cluster.interconnect}),
        "serving-endpoints": (f"/api/serving-endpoints/{endpoint.pk}/",
                              {"name": endpoint.name, "base_url": "http://collector.beta:8000",
                               "served_model": endpoint.served_model}),
    }


@pytest.mark.parametrize("resource", sorted(UPDATABLE))
@pytest.mark.parametrize("who", ["mallory", "double_admin"])
@pytest.mark.parametrize("method", ["patch", "put"])
def test_a_team_change_is_a_400_naming_the_field_and_the_row_stays(resource, who, method, request, cluster, node,
                                                                  endpoint, team):
    api = _client(request.getfixturevalue(who))
    url, body = _bodies(cluster, endpoint)[resource]
    before = {"cluster": Cluster.objects.filter(pk=cluster.pk).values().get(),
              "endpoint": ServingEndpoint.objects.filter(pk=endpoint.pk).values().get()}
    response = getattr(api, method)(url, {**body, "team": "beta"}, format="json")
    assert response.status_code == 400, response.content
    assert "team" in response.json() and "stays in its team" in response.json()["team"][0]
    assert Cluster.objects.filter(pk=cluster.pk).values().get() == before["cluster"]
    assert ServingEndpoint.objects.filter(pk=endpoint.pk).values().get() == before["endpoint"]
    node.refresh_from_db()
    assert node.cluster.team == team
    assert ServingEndpoint.objects.get(pk=endpoint.pk).api_key() == SECRET
    # The row is where it was: its team's members read it, the other team's admin (as such) does not.
    assert _client(request.getfixturevalue("member")).get(url).status_code == 200


def test_naming_the_rows_own_team_is_no_change(double_admin, cluster, endpoint):
    api = _client(double_admin)
    for url, body in _bodies(cluster, endpoint).values():
        response = api.put(url, {**body, "team": "alpha"}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["team"] == "alpha"


def test_the_permission_check_reads_the_stored_row_not_the_request(mallory, cluster, endpoint):
    """Without a team in the request, mallory is what she is in the row's team: a member, neither the endpoint's
    creator nor an admin, so she changes neither row."""
    api = _client(mallory)
    assert api.patch(f"/api/clusters/{cluster.pk}/", {"description": "x"}, format="json").status_code == 403
    refused = api.patch(f"/api/serving-endpoints/{endpoint.pk}/", {"base_url": "http://collector.beta:8000"},
                        format="json")
    assert refused.status_code == 403
    endpoint.refresh_from_db()
    assert endpoint.base_url == "http://gpu-node-3:8000" and endpoint.api_key() == SECRET


@pytest.mark.parametrize("url", ["/api/models/{model}/", "/api/jobs/{job}/", "/api/virtual-backends/{virtual}/",
                                 "/api/join-tokens/{token}/"])
@pytest.mark.parametrize("method", ["patch", "put"])
def test_rows_made_for_a_team_and_never_changed_answer_405(url, method, double_admin, job, team):
    from adaptation.clusters import trust

    virtual = VirtualBackend.objects.create(team=team, name="vendorx", operators=["aten::mm"])
    token, _ = trust.create_join_token(job.cluster, double_admin)
    url = url.format(model=job.model.pk, job=job.pk, virtual=virtual.pk, token=token.pk)
    response = getattr(_client(double_admin), method)(url, {"team": "beta", "cluster": None}, format="json")
    assert response.status_code == 405
    job.refresh_from_db()
    virtual.refresh_from_db()
    assert job.team == job.model.team == virtual.team == team
    assert JoinToken.objects.get(pk=token.pk).cluster.team == team


def test_a_new_base_url_alone_drops_the_stored_key(endpoint, member_api):
    url = f"/api/serving-endpoints/{endpoint.pk}/"
    response = member_api.patch(url, {"base_url": "http://gpu-node-4:8000"}, format="json")
    assert response.status_code == 200 and response.json()["has_api_key"] is False
    endpoint.refresh_from_db()
    assert endpoint.api_key() is None and endpoint.base_url == "http://gpu-node-4:8000"


def test_a_key_given_with_the_new_base_url_is_kept(endpoint, member_api):
    url = f"/api/serving-endpoints/{endpoint.pk}/"
    response = member_api.put(url, {"name": "prod", "base_url": "http://gpu-node-4:8000", "served_model": "qwen3",
                                    "api_key": "sk-for-node-4"}, format="json")
    assert response.status_code == 200 and response.json()["has_api_key"] is True
    assert ServingEndpoint.objects.get(pk=endpoint.pk).api_key() == "sk-for-node-4"
    # The same address again is no change of address: the key stays
    member_api.put(url, {"name": "prod", "base_url": "http://gpu-node-4:8000", "served_model": "qwen3"},
                   format="json")
    assert ServingEndpoint.objects.get(pk=endpoint.pk).api_key() == "sk-for-node-4"


def test_an_invalid_update_changes_nothing(endpoint, member_api):
    response = member_api.patch(f"/api/serving-endpoints/{endpoint.pk}/", {"base_url": "ftp://elsewhere"},
                                format="json")
    assert response.status_code == 400 and "base_url" in response.json()
    endpoint.refresh_from_db()
    assert endpoint.base_url == "http://gpu-node-3:8000" and endpoint.api_key() == SECRET


def test_a_form_over_an_existing_row_keeps_its_team(endpoint, mallory):
    form = ServingEndpointForm({"team": mallory.teams.get(slug="beta").pk, "name": "prod",
                                "base_url": endpoint.base_url, "served_model": "qwen3", "api_key": SECRET},
                               instance=endpoint, user=mallory)
    assert form.fields["team"].disabled
    assert form.is_valid(), form.errors
    assert form.save().team.slug == "alpha"
    assert ServingEndpoint.objects.get(pk=endpoint.pk).team.slug == "alpha"


@pytest.fixture
def superuser_client(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password="x" * 16))
    return client


def test_the_admin_shows_the_team_but_does_not_move_the_row(superuser_client, endpoint, cluster, other_team):
    page = superuser_client.get(f"/admin/adaptation/servingendpoint/{endpoint.pk}/change/").content.decode()
    assert 'name="team"' not in page and 'name="base_url"' in page
    response = superuser_client.post(f"/admin/adaptation/servingendpoint/{endpoint.pk}/change/", {
        "team": other_team.pk, "name": "prod", "base_url": "http://gpu-node-4:8000", "served_model": "qwen3",
        "created_by": ""})
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.team.slug == "alpha" and endpoint.base_url == "http://gpu-node-4:8000"
    assert not endpoint.has_api_key  # the address changed in the admin: the key went with the old one
    for model, pk in (("cluster", cluster.pk),):
        assert 'name="team"' not in superuser_client.get(f"/admin/adaptation/{model}/{pk}/change/").content.decode()


def test_the_admin_never_shows_a_join_tokens_stored_verifier(superuser_client, cluster, owner):
    from adaptation.clusters import trust

    token, whole = trust.create_join_token(cluster, owner)
    verify_key, broker_hash = JoinToken.objects.filter(pk=token.pk).values_list(
        "verify_key", "broker_password_sha256").get()
    assert verify_key and broker_hash
    for url in ("/admin/adaptation/jointoken/", f"/admin/adaptation/jointoken/{token.pk}/change/"):
        page = superuser_client.get(url).content.decode()
        assert token.token_id in page
        assert verify_key not in page and broker_hash not in page and whole not in page
