"""A node benchmarks only the endpoints its operator allows, through real workers: a loopback endpoint is reached by
the node that lists it and refused by the one that does not (before any request), the node's own broker is refused
even where loopback is listed, and an endpoint's error reply reaches no job, result or log: only its status and
size do. The control plane refuses metadata hosts when an endpoint is saved."""

from urllib.parse import urlsplit

import pytest

from adaptation.models import AdaptationJob
from tests.conftest import job_status, node_online
from tests.engine.fake_endpoint import FakeEndpoint
from tests.harness import wait_for
from tests.test_serving_endpoints import stored_rows

SECRET = "internal-admin-page-3c91"
WORKLOAD = {"requests": 2, "prompt_len": 4, "output_len": 2, "warmup_requests": 0}


@pytest.mark.parametrize("url, message", [
    ("http://169.254.169.254/", "is a cloud metadata service"),
    ("http://metadata.google.internal", "is a cloud metadata service"),
    ("http://0xa9fea9fe:80", "is a cloud metadata service"),
    ("http://[fd00:ec2::254]/", "is a cloud metadata service"),
    ("http://u:p@gpu-node-3:8000", "without credentials"),
])
def test_an_endpoint_at_a_metadata_host_or_with_credentials_is_not_saved(member_api, url, message):
    response = member_api.post("/api/serving-endpoints/", {"name": "x", "base_url": url, "served_model": "m"},
                               format="json")
    assert response.status_code == 400 and message in response.json()["base_url"][0], response.json()


@pytest.mark.workers
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_a_node_reaches_only_what_its_operator_allows_and_no_reply_reaches_the_job(stack, team, member_api,
                                                                                 model_spec):
    listed = team.clusters.create(name="listed", expected_devices_per_node=1)
    unlisted = team.clusters.create(name="unlisted", expected_devices_per_node=1)
    stack.start_node("alpha/listed", "listing-node", extra=("--endpoint-allow", "127.0.0.1"))
    stack.start_node("alpha/unlisted", "plain-node")
    wait_for(node_online("listing-node"), 60, "the listing node's registration")
    wait_for(node_online("plain-node"), 60, "the plain node's registration")
    broker_port = urlsplit(stack.node_broker_url).port or 6379

    def submit(name: str, base_url: str, cluster) -> int:
        created = member_api.post("/api/serving-endpoints/", {"name": name, "base_url": base_url,
                                                              "served_model": "m", "api_key": "sk-x"},
                                  format="json")
        assert created.status_code == 201, created.json()
        response = member_api.post("/api/jobs/", {
            "cluster": cluster.pk, "model": model_spec.pk, "stages": ["endpoint_bench"],
            "parameters": {"endpoint_bench": {"endpoint": created.json()["id"], "concurrency": [1],
                                              "workload": WORKLOAD}}}, format="json")
        assert response.status_code == 201, response.json()
        return response.json()["id"]

    body = f"<html>{SECRET}</html>".encode()
    with FakeEndpoint() as served, FakeEndpoint(reply="error", status=401, body=body) as failing, \
            FakeEndpoint() as elsewhere:
        jobs = {"served": submit("served", served.base_url, listed),
                "failing": submit("failing", failing.base_url, listed),
                "broker": submit("broker", f"http://127.0.0.1:{broker_port}", listed),
                "unlisted": submit("unlisted", elsewhere.base_url, unlisted)}
        done = {name: wait_for(job_status(pk, "succeeded", "failed"), 90, f"the {name} benchmark")
                for name, pk in jobs.items()}
    assert done["served"].status == "succeeded", done["served"].error
    assert len(served.requests) == WORKLOAD["requests"]
    assert done["failing"].status == "failed"
    assert f"HTTP 401 ({len(body)} bytes of body, not shown)" in done["failing"].error, done["failing"].error
    assert done["broker"].status == "failed" and "this node's broker: refused" in done["broker"].error
    assert done["unlisted"].status == "failed" and "loopback address: refused" in done["unlisted"].error
    assert elsewhere.requests == []
    jobs_as_shown = [member_api.get(f"/api/jobs/{pk}/").content.decode() for pk in jobs.values()]
    assert SECRET not in stored_rows() and SECRET not in stack.logs() and not any(SECRET in job for job in
                                                                                  jobs_as_shown)
    assert AdaptationJob.objects.count() == 4
