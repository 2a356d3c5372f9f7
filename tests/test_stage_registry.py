"""A stage kind defined only in test modules (``tests/stage_example.py`` for the engine, ``stage_example_handlers``
for the control plane), registered the way a deployment adds its own, runs end to end: submitted through the API,
run by a real node worker, reported to a real control worker, shown on the job page and in the API."""

import importlib
import os
import sys

import pytest
from django.db import connection
from django.test import Client

from adaptation import stages as handlers
from adaptation.choices import TERMINAL_STATUSES
from tests.conftest import database_url, failed, job_status, node_online
from tests.harness import WorkerStack, wait_for
from workers.engine import stages as engine

MODULE, HANDLERS = "tests.stage_example", "tests.stage_example_handlers"


@pytest.fixture
def registered():
    """The kind registered in this process (the workers load it from their environment), and gone afterwards."""
    example = importlib.import_module(MODULE)
    [spec] = example.STAGES
    engine.register(spec)
    sys.modules.pop(HANDLERS, None)
    importlib.import_module(HANDLERS)
    try:
        yield spec
    finally:
        handlers._handlers.pop(spec.kind, None)
        engine.STAGES.pop(spec.kind, None)


def test_a_kind_is_refused_until_it_is_registered(member_api, cluster, node):
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["number_sum"]}, format="json")
    assert response.status_code == 400 and "number_sum" in str(response.json()["stages"])


def test_a_registered_kind_gets_its_handlers_parameters_outcome_and_page(registered, cluster, node):
    from adaptation.jobs.placement import stage_assignments
    from adaptation.models import AdaptationJob

    job = AdaptationJob(team=cluster.team, cluster=cluster, stages=[registered.kind],
                        parameters={registered.kind: {"numbers": [1, 2]}})
    [(chosen, params)] = stage_assignments(job, registered.kind, [node])
    assert chosen == node and params == {"numbers": [1, 2], "offset": 8}
    outcome = handlers.handler(registered.kind).outcome({"count": 2, "total": 11})
    assert outcome.summary == "2 numbers add up to 11"


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_stage_kind_defined_in_a_test_module_runs_from_submit_to_the_job_page(registered, tmp_path, monkeypatch,
                                                                               request, cluster, member, member_api):
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.skip("needs DATABASE_URL (PostgreSQL) and REDIS_URL, as scripts/test.sh sets")
    stack = WorkerStack(tmp_path, database_url(), os.environ["REDIS_URL"], D0_NODE_TIMEOUT=4,
                        D0_LIVENESS_INTERVAL=1, D0_STAGE_MODULES=MODULE, D0_STAGE_HANDLERS=HANDLERS)
    monkeypatch.setenv("D0_CONTROL_QUEUE", stack.control_queue)
    stack.start_control()
    try:
        stack.start_node("alpha/h100-pod", "sum-node")
        wait_for(node_online("sum-node"), 90, "node registration")
        response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": [registered.kind],
                                                  "parameters": {registered.kind: {"numbers": [1, 2, 3]}}},
                                   format="json")
        assert response.status_code == 201, response.json()
        job = wait_for(job_status(response.json()["id"], *TERMINAL_STATUSES), 90, "the job to end")
        assert job.status == "succeeded", job.error

        detail = member_api.get(f"/api/jobs/{job.pk}/").json()
        [run] = detail["stage_runs"]
        # The node added the job's numbers and the offset the control plane set (the cluster's 8 devices).
        assert (run["kind"], run["status"], run["result"]) == (registered.kind, "succeeded", {"total": 14, "count": 3})
        assert "kept: total 14" in detail["log"]  # the handler's store ran in the control worker

        client = Client()
        client.force_login(member)
        page = client.get(f"/jobs/{job.pk}/").content.decode()
        assert "3 numbers add up to 14" in page and "the offset came from the control plane" in page
        assert f'"page": "/clusters/{cluster.pk}/"' in page  # the stage run's link (drawn by job_detail.js)
    finally:
        if failed(request):
            print(stack.logs())
        stack.stop_all()
