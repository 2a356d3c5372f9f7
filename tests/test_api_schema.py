"""The API answers as its OpenAPI schema says: schemathesis generates requests from d0's own schema (drf-spectacular,
made in-process as ``/api/schema/`` serves it) for every operation and sends them to the Django app in-process
(WSGI, no network), signed in with a token as an admin of the fixtures' team. Every response must be no 5xx, have a
documented status code and content type, and match the documented body.

Bounded and reproducible: a fixed seed, derandomized generation, a few examples per operation, and each example runs
in a savepoint that is rolled back, so every example sees the fixtures' rows as they were made."""

from urllib.parse import urlencode

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.config import SchemathesisConfig

from adaptation.clusters import trust
from adaptation.models import EnvReport, ServingEndpoint, VirtualBackend

EXAMPLES_PER_OPERATION = 6

schema = schemathesis.openapi.from_dict(
    SchemaGenerator().get_schema(request=None, public=True),
    config=SchemathesisConfig.from_dict({
        "seed": 15,
        "generation": {"max-examples": EXAMPLES_PER_OPERATION, "deterministic": True, "database": "none"},
        # The coverage phase sends every boundary and negative value of every parameter: hundreds of requests per
        # operation, past this test's time budget. The examples and fuzzing phases stay.
        "phases": {"coverage": {"enabled": False}},
        # A request the schema allows may still be refused, rightly, with a 400 naming the field: ids must name rows
        # of the caller's teams (a cluster, a model, a job), text may not hold NUL (PostgreSQL refuses it), names
        # are unique per team, a config.json must analyse, the token endpoint needs a real password. A JSON schema
        # cannot say any of these, so 400 counts as an answer to valid data; a 5xx, 405, 415 or 422 still fails.
        "checks": {"positive_data_acceptance": {
            "expected-statuses": ["2xx", "3xx", "400", "401", "403", "404", "409", "429"]}},
    }),
)
schema.app = WSGIHandler()

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.positive_data_acceptance,
    schemathesis.checks.missing_required_header,
    schemathesis.checks.unsupported_method,
    schemathesis.checks.allow_header_conformance,
    schemathesis.checks.ignored_auth,
]


# Fields and filters that name a row, and which of the fixtures' rows they get.
ROW_FIELDS = {"cluster": "clusters", "model": "models", "job": "jobs", "node": "nodes", "a": "models", "b": "models"}


@pytest.fixture(autouse=True)
def _keep_the_test_transaction():
    """Django closes the database connection around each request; here that would end the test's transaction (and
    its fixtures' rows). Django's own test client turns it off the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def rows(owner, cluster, node, model_spec, job):
    """A real row for each resource with an ``{id}`` path, keyed by the path's first part."""
    stage_run = job.stage_runs.get()
    token, _ = trust.create_join_token(cluster, owner)
    return {
        "clusters": cluster.pk,
        "nodes": node.pk,
        "devices": node.devices.get().pk,
        "models": model_spec.pk,
        "jobs": job.pk,
        "stage-runs": stage_run.pk,
        "join-tokens": token.pk,
        "env-reports": EnvReport.objects.create(node=node, job=job, stage_run=stage_run, verdict="pass",
                                                report={"checks": []}).pk,
        "virtual-backends": VirtualBackend.objects.create(team=cluster.team, name="npu", operators=["aten::mm"],
                                                          created_by=owner).pk,
        "serving-endpoints": ServingEndpoint.objects.create(team=cluster.team, name="vllm-a",
                                                            base_url="http://127.0.0.1:8000", served_model="qwen",
                                                            created_by=owner).pk,
    }


@pytest.fixture
def token(owner):
    return Token.objects.create(user=owner).key


@schema.parametrize()
# The fixtures' rows are made once per operation and shared by its examples; each example is rolled back below.
# No deadline: Hypothesis fails an example that takes over 200 ms twice as "unreliable timings", and on a loaded CI
# machine a config upload (its analysis in the analysis process) does; this test checks answers, not speed.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_the_api_answers_as_its_schema_says(case, rows, token):
    # Integer ids (in the path, a filter or a body) address the fixtures' rows, so operations run on real data;
    # the rest (negative examples: strings, floats) and the resources without a row here stay mostly 404s and 400s.
    resource = case.operation.path.split("/")[2]
    if resource in rows and isinstance((case.path_parameters or {}).get("id"), int):
        case.path_parameters["id"] = rows[resource]
    for values in (case.query, case.body):
        for name, row_resource in ROW_FIELDS.items():
            if isinstance(values, dict) and isinstance(values.get(name), int):
                values[name] = rows[row_resource]
    with transaction.atomic():
        case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)
        transaction.set_rollback(True)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data"])
@pytest.mark.parametrize("field", ["team", "name"])
def test_a_nul_in_a_form_field_is_a_400_not_a_500(owner_api, cluster, field, content_type):
    # Found by the run above: the JSON parser refused NUL, the form parsers passed it on to PostgreSQL.
    endpoint = ServingEndpoint.objects.create(team=cluster.team, name="vllm-a", base_url="http://127.0.0.1:8000",
                                              served_model="qwen")
    data = {"name": "vllm-b", "team": "alpha", field: "al\x00pha"}
    body, content_type = (owner_api._encode_data(data, format="multipart") if content_type.startswith("multipart")
                          else (urlencode(data), content_type))
    response = owner_api.generic("PATCH", f"/api/serving-endpoints/{endpoint.pk}/", body, content_type=content_type)
    assert response.status_code == 400 and "NUL" in response.json()["detail"]
    endpoint.refresh_from_db()
    assert endpoint.name == "vllm-a"


def test_a_form_with_too_many_fields_is_a_json_400(owner_api, settings):
    # Found by a longer run: Django refused it with its HTML error page, which no API client can read.
    body = urlencode([("stages", "env_probe")] * (settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    response = owner_api.generic("POST", "/api/jobs/", body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]


def test_a_multipart_body_without_a_named_field_is_a_400(owner_api, cluster):
    # Found by the run above: a JSON array sent as multipart parses to an empty form, and the PATCH "succeeded".
    endpoint = ServingEndpoint.objects.create(team=cluster.team, name="vllm-a", base_url="http://127.0.0.1:8000",
                                              served_model="qwen")
    url = f"/api/serving-endpoints/{endpoint.pk}/"
    content_type = "multipart/form-data; boundary=b0"
    response = owner_api.generic("PATCH", url, b"--b0\r\n[]--b0--\r\n", content_type=content_type)
    assert response.status_code == 400 and "named form field" in response.json()["detail"]
    # An empty form (the closing line alone) is still an empty PATCH, and a named field still updates.
    assert owner_api.generic("PATCH", url, b"--b0--\r\n", content_type=content_type).status_code == 200
    named = b'--b0\r\nContent-Disposition: form-data; name="name"\r\n\r\nvllm-b\r\n--b0--\r\n'
    assert owner_api.generic("PATCH", url, named, content_type=content_type).status_code == 200
    endpoint.refresh_from_db()
    assert endpoint.name == "vllm-b"
