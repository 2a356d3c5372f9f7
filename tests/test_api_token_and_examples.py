"""The API docs page's "Try it out" works as sent (issue 31, item 4): the token endpoint takes the form and multipart
bodies the page sends from a signed-in session (no CSRF refusal), its schema asks only for what it reads, and the
job-submit example, posted as it stands, submits a job."""

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from adaptation.models import AdaptationJob
from adaptation.jobs.api import JOB_EXAMPLE_NAME

PASSWORD = "a-long-test-password"  # the fixtures' users'


def docs_page_session(user) -> Client:
    """A browser signed in to the docs page: its session cookie goes with every request, CSRF checks on."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize("body", ["form", "multipart"])
def test_the_token_endpoint_takes_the_docs_pages_form_bodies_from_a_signed_in_session(member, body):
    client = docs_page_session(member)
    if body == "form":
        response = client.post("/api/token/", f"username=bob&password={PASSWORD}",
                               content_type="application/x-www-form-urlencoded")
    else:
        response = client.post("/api/token/", {"username": "bob", "password": PASSWORD})  # multipart
    assert response.status_code == 200, response.content
    token = response.json()["token"]
    assert APIClient().get("/api/jobs/", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_a_wrong_password_is_a_400_saying_so_not_a_csrf_refusal(member):
    response = docs_page_session(member).post("/api/token/", "username=bob&password=wrong",
                                              content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["Unable to log in with provided credentials."]}


def schema_for(user) -> dict:
    client = Client()
    client.force_login(user)
    return json.loads(client.get("/api/schema/?format=json").content)


def test_the_token_schema_declares_the_form_bodies_and_asks_only_for_username_and_password(member):
    schema = schema_for(member)
    operation = schema["paths"]["/api/token/"]["post"]
    content = operation["requestBody"]["content"]
    assert list(content)[:2] == ["application/x-www-form-urlencoded", "multipart/form-data"]  # the page's default
    request = schema["components"]["schemas"][content["application/x-www-form-urlencoded"]["schema"]["$ref"]
                                              .rsplit("/", 1)[1]]
    assert sorted(request["required"]) == ["password", "username"] and "token" not in request["properties"]
    assert "security" not in operation  # credentials in the body, no session or token needed


def test_the_job_submit_example_posted_as_it_stands_submits_a_job(outsider, other_team, cluster, model_spec, broker):
    """The caller (another team's admin) has rows made after the fixtures', so their ids are not the static 1 and 1:
    the example names the caller's own."""
    from django.utils import timezone

    from adaptation.models import Cluster, ModelSpec, Node
    from tests.conftest import load_config

    own_cluster = Cluster.objects.create(team=other_team, name="mi300-pod")
    Node.objects.create(cluster=own_cluster, hostname="mi-01", queue_name="d0.node.beta.mi300-pod.mi-01",
                        last_heartbeat=timezone.now())
    own_model = ModelSpec.objects.create(team=other_team, name="qwen3", config=load_config("qwen3-0.6b.json"))
    example = schema_for(outsider)["paths"]["/api/jobs/"]["post"]["requestBody"]["content"]["application/json"][
        "examples"][JOB_EXAMPLE_NAME]["value"]
    assert (example["cluster"], example["model"]) == (own_cluster.pk, own_model.pk) != (1, 1)
    api = APIClient()
    api.force_authenticate(outsider)
    response = api.post("/api/jobs/", example, format="json")
    assert response.status_code == 201, response.content
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    assert (job.cluster, job.model, job.stages) == (own_cluster, own_model, ["env_check", "op_coverage"])
    assert job.parameters == example["parameters"]
    assert job.status in ("queued", "running"), job.error  # dispatched to the online node, not refused


def test_served_to_no_one_the_example_keeps_its_placeholder_ids():
    from drf_spectacular.generators import SchemaGenerator

    from adaptation.jobs.api import JOB_EXAMPLE

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["paths"]["/api/jobs/"]["post"]["requestBody"]["content"]["application/json"]["examples"][
        JOB_EXAMPLE_NAME]["value"] == JOB_EXAMPLE
