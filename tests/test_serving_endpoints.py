"""Serving endpoints someone else runs: stored with an encrypted, write-only API key, team-scoped, and benchmarked
by an ``endpoint_bench`` job whose key the control plane adds only to the dispatched stage (never the job row)."""

import json

import pytest
from django.core import serializers
from django.test import Client

from adaptation.jobs import placement
from adaptation.models import AdaptationJob, ServingEndpoint, StageRun
from adaptation.errors import SecretUnreadable

SECRET = "sk-d0-test-0123456789abcdef"


def stored_rows() -> str:
    """Every row a key could leak into, as the database holds it."""
    return serializers.serialize("json", [*ServingEndpoint.objects.all(), *AdaptationJob.objects.all(),
                                          *StageRun.objects.all()])


@pytest.fixture
def endpoint(team, member):
    endpoint = ServingEndpoint(team=team, name="prod", base_url="http://gpu-node-3:8000", served_model="qwen3",
                               created_by=member)
    endpoint.set_api_key(SECRET)
    endpoint.save()
    return endpoint


def test_the_key_is_stored_encrypted_and_unreadable_under_another_secret_key(endpoint, settings):
    assert SECRET not in stored_rows() and endpoint.api_key_encrypted
    assert ServingEndpoint.objects.get(pk=endpoint.pk).api_key() == SECRET
    settings.SECRET_KEY = "another-secret-key-" * 3
    with pytest.raises(SecretUnreadable, match="enter it again"):
        ServingEndpoint.objects.get(pk=endpoint.pk).api_key()


def test_the_api_takes_the_key_and_never_returns_it(member_api, outsider_api, team):
    created = member_api.post("/api/serving-endpoints/", {"name": "prod", "base_url": "http://10.0.0.7:8000",
                                                          "served_model": "m", "api_key": SECRET}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert "api_key" not in body and body["has_api_key"] is True and SECRET not in json.dumps(body)
    pk = body["id"]
    for response in (member_api.get(f"/api/serving-endpoints/{pk}/"), member_api.get("/api/serving-endpoints/")):
        assert response.status_code == 200 and SECRET not in response.content.decode()
    assert ServingEndpoint.objects.get(pk=pk).api_key() == SECRET
    assert outsider_api.get(f"/api/serving-endpoints/{pk}/").status_code == 404
    # Another field keeps the key; a new URL alone drops it (tests/test_team_moves.py); a new key replaces it
    patched = member_api.patch(f"/api/serving-endpoints/{pk}/", {"served_model": "m2"}, format="json")
    assert patched.status_code == 200 and ServingEndpoint.objects.get(pk=pk).api_key() == SECRET
    member_api.patch(f"/api/serving-endpoints/{pk}/", {"api_key": "sk-new"}, format="json")
    assert ServingEndpoint.objects.get(pk=pk).api_key() == "sk-new"
    assert SECRET not in stored_rows() and "sk-new" not in stored_rows()


@pytest.mark.parametrize("url, message", [
    ("http://host:8000/v1", "without /v1"),
    ("ftp://host", "http(s) base URL"),
    ("gpu-node-3:8000", "http(s) base URL"),
])
def test_a_bad_base_url_is_a_400_naming_it(member_api, url, message):
    response = member_api.post("/api/serving-endpoints/", {"name": "x", "base_url": url, "served_model": "m"},
                               format="json")
    assert response.status_code == 400 and message in response.json()["base_url"][0]


def test_a_job_names_one_of_its_teams_endpoints_and_sets_no_address_or_key(member_api, outsider_api, cluster,
                                                                         model_spec, endpoint, broker):
    def submit(api, parameters):
        return api.post("/api/jobs/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["endpoint_bench"],
                                       "parameters": {"endpoint_bench": parameters}}, format="json")

    missing = submit(member_api, {"concurrency": [1]})
    assert missing.status_code == 400 and "endpoint_bench.endpoint: required" in json.dumps(missing.json())
    unknown = submit(member_api, {"endpoint": endpoint.pk + 100})
    assert unknown.status_code == 400 and f"no serving endpoint {endpoint.pk + 100}" in json.dumps(unknown.json())
    for key in ("api_key", "base_url"):
        refused = submit(member_api, {"endpoint": endpoint.pk, key: "http://evil:1"})
        assert refused.status_code == 400 and "set by the control plane only" in json.dumps(refused.json())
    accepted = submit(member_api, {"endpoint": endpoint.pk, "concurrency": [1, 2]})
    assert accepted.status_code == 201, accepted.json()
    job = AdaptationJob.objects.get(pk=accepted.json()["id"])
    assert job.parameters == {"endpoint_bench": {"endpoint": endpoint.pk, "concurrency": [1, 2]}}
    # What a node gets: the address and the key, added at dispatch
    params = placement.stage_parameters(job, "endpoint_bench", [])
    assert params["base_url"] == "http://gpu-node-3:8000" and params["api_key"] == SECRET
    assert params["served_model"] == "qwen3" and params["config"] == model_spec.config
    assert SECRET not in stored_rows()


def test_the_endpoints_page_lists_adds_and_benchmarks_without_showing_the_key(member, cluster, model_spec, broker,
                                                                            endpoint, node):
    client = Client()
    client.force_login(member)
    page = client.get("/endpoints/").content.decode()
    assert "gpu-node-3:8000" in page and SECRET not in page and "Benchmark" in page
    response = client.post("/endpoints/", {"team": endpoint.team.pk, "name": "staging",
                                           "base_url": "http://staging:8000", "served_model": "m",
                                           "api_key": "sk-staging"})
    assert response.status_code == 302
    assert ServingEndpoint.objects.get(name="staging").api_key() == "sk-staging"
    assert "sk-staging" not in client.get("/endpoints/").content.decode()
    prefix = f"e{endpoint.pk}"
    response = client.post(f"/endpoints/{endpoint.pk}/bench/", {
        f"{prefix}-model": model_spec.pk, f"{prefix}-cluster": cluster.pk, f"{prefix}-concurrency": "1, 8",
        f"{prefix}-requests": 16, f"{prefix}-prompt_len": 64, f"{prefix}-output_len": 32})
    job = AdaptationJob.objects.get(stages=["endpoint_bench"])
    assert response.status_code == 302 and response.url == f"/jobs/{job.pk}/"
    assert job.parameters["endpoint_bench"] == {"endpoint": endpoint.pk, "concurrency": [1, 8],
                                                "workload": {"requests": 16, "prompt_len": 64, "output_len": 32}}
    bad = client.post(f"/endpoints/{endpoint.pk}/bench/", {f"{prefix}-model": model_spec.pk,
                                                           f"{prefix}-cluster": cluster.pk,
                                                           f"{prefix}-concurrency": "many"}, follow=True)
    assert "Not submitted" in bad.content.decode() and AdaptationJob.objects.count() == 1


def test_only_the_creator_or_a_team_admin_deletes_an_endpoint(endpoint, owner_api, team):
    from django.contrib.auth import get_user_model

    from adaptation.models import Membership

    other = get_user_model().objects.create_user("other-member", password="x")
    Membership.objects.create(team=team, user=other, role="member")
    client = Client()
    client.force_login(other)
    client.post(f"/endpoints/{endpoint.pk}/delete/")
    assert ServingEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert owner_api.delete(f"/api/serving-endpoints/{endpoint.pk}/").status_code == 204
    assert not ServingEndpoint.objects.filter(pk=endpoint.pk).exists()
