"""Operator coverage on the control plane: reports and the operator library stored from real engine runs,
virtual backends, the heatmap / gap / diff pages and API, and an op_coverage job through real workers."""

import pytest
from django.test import Client

from adaptation.intake import services as intake
from adaptation.jobs import placement, reports
from adaptation.jobs import services as jobs
from adaptation.models import CoverageReport, EnvReport, ModelSpec, OperatorRecord, VirtualBackend
from tests.harness import wait_for
from tests.conftest import job_status, node_online
from workers.engine.coverage import op_coverage

from .conftest import load_config

GAPS = {"aten::_grouped_mm", "aten::topk", "aten::histc"}


def coverage_of(config, **params):
    return op_coverage({"config": config, "dtypes": ["fp32"], "compile": False, "decode_steps": 1, **params},
                       lambda *_: None)


@pytest.fixture(scope="module")
def moe_result():
    """A real op_coverage result for Qwen3-MoE, judged also against a vendor list lacking three MoE operators."""
    config = load_config("qwen3-30b-a3b.json")
    traced = [operator["name"] for operator in coverage_of(config)["reports"]["fp32"]["operators"]]
    listed = [name for name in traced if name.split(".")[0] not in GAPS]
    return coverage_of(config, virtual_backend_lists=[{"name": "vendorx", "operators": listed}])


@pytest.fixture(scope="module")
def dense_result():
    return coverage_of(load_config("qwen3-0.6b.json"))


def pass_env_check(node, owner):
    """A passing env check on record for ``node``, so the gated op_coverage stage may run there."""
    job = jobs.submit_job(team=node.cluster.team, user=owner, cluster=node.cluster, stages=["env_check"])
    run = job.stage_runs.create(kind="env_check", node=node, node_name=node.hostname)
    EnvReport.objects.create(node=node, job=job, stage_run=run, verdict="pass", report={"checks": []})


@pytest.fixture
def checked_node(node, owner):
    pass_env_check(node, owner)
    return node


def record(job_model, owner, node, stage_result, django_capture_on_commit_callbacks):
    """Run an op_coverage job for ``job_model`` through services, the node reporting ``stage_result``."""
    with django_capture_on_commit_callbacks(execute=True):
        job = jobs.submit_job(team=job_model.team, user=owner, cluster=node.cluster, model=job_model,
                                  stages=["op_coverage"])
    run = job.stage_runs.get()
    reports.record_stage_started(run.pk, sender=run.node)
    reports.record_stage_finished(run.pk, True, stage_result, "", "", sender=run.node)
    job.refresh_from_db()
    return job


@pytest.fixture
def moe_model(team, owner):
    return intake.add_from_catalog(team=team, user=owner, slug="qwen3-30b-a3b")[0]


@pytest.fixture
def dense_model(team, owner):
    return intake.add_from_catalog(team=team, user=owner, slug="qwen3-0.6b")[0]


def test_a_coverage_stage_stores_reports_per_backend_and_grows_the_operator_library(
        moe_model, dense_model, owner, checked_node, broker, moe_result, dense_result,
        django_capture_on_commit_callbacks):
    record(dense_model, owner, checked_node, dense_result, django_capture_on_commit_callbacks)
    job = record(moe_model, owner, checked_node, moe_result, django_capture_on_commit_callbacks)
    assert job.status == "succeeded"
    cpu = CoverageReport.objects.get(model=moe_model, backend="cpu")
    assert cpu.coverage == 1.0
    # The dense model came first: the MoE's routing operators are what is new to the CPU backend.
    assert "aten::topk.default" in cpu.new_operators and "aten::mm.default" not in cpu.new_operators
    library = OperatorRecord.objects.filter(team=moe_model.team, backend="cpu")
    assert library.count() == len({op["name"] for result in (moe_result, dense_result)
                                   for op in result["reports"]["fp32"]["operators"]})
    assert library.get(operator="aten::mm.default").first_model == dense_model


def test_a_virtual_backend_lacking_three_moe_operators_reports_exactly_those(moe_result):
    report = moe_result["virtual"]["vendorx"]["fp32"]
    gaps = {operator["name"].split(".")[0]: operator for operator in report["operators"]
            if operator["status"] not in ("native", "composite")}
    used = {name for name in GAPS if any(op["name"].startswith(name + ".") for op in report["operators"])}
    assert set(gaps) == used and used >= {"aten::topk"}
    assert gaps["aten::topk"]["status"] == "missing"  # no decomposition exists for topk
    for operator in gaps.values():
        assert operator["status"] in ("decomposable", "missing")
        if operator["status"] == "decomposable":
            assert operator["basic_operators"]


def test_the_pages_show_the_heatmap_the_gaps_and_the_diff(moe_model, dense_model, owner, member, outsider, checked_node,
                                                         broker, moe_result, dense_result,
                                                         django_capture_on_commit_callbacks):
    record(dense_model, owner, checked_node, dense_result, django_capture_on_commit_callbacks)
    record(moe_model, owner, checked_node, moe_result, django_capture_on_commit_callbacks)
    client = Client()
    client.force_login(member)
    overview = client.get("/coverage/").content.decode()
    assert "virtual:vendorx" in overview and "Qwen3-30B-A3B" in overview
    gaps = client.get(f"/models/{moe_model.pk}/coverage/").content.decode()
    assert "aten::topk.default" in gaps and "write a kernel" in gaps
    diff = client.get("/coverage/diff/", {"a": moe_model.pk, "b": dense_model.pk, "backend": "cpu"}).content.decode()
    assert "aten::topk.default" in diff and "aten::mm.default" not in diff
    stranger = Client()
    stranger.force_login(outsider)
    assert stranger.get(f"/models/{moe_model.pk}/coverage/").status_code == 404
    assert "Qwen3" not in stranger.get("/coverage/").content.decode()


def test_the_api_serves_reports_library_diff_and_virtual_backends(moe_model, dense_model, owner, checked_node, broker,
                                                                  member_api, outsider_api, moe_result, dense_result,
                                                                  django_capture_on_commit_callbacks):
    record(dense_model, owner, checked_node, dense_result, django_capture_on_commit_callbacks)
    record(moe_model, owner, checked_node, moe_result, django_capture_on_commit_callbacks)
    reports = member_api.get("/api/coverage-reports/", {"model": moe_model.pk}).json()["results"]
    assert {(row["backend"], row["coverage"] == 1.0) for row in reports} == {("cpu", True), ("virtual:vendorx", False)}
    assert member_api.get("/api/operators/", {"backend": "cpu", "operator": "aten::topk.default"}).json()["count"] == 1
    diff = member_api.get("/api/coverage-diff/", {"a": moe_model.pk, "b": dense_model.pk}).json()
    assert "aten::topk.default" in {row["name"] for row in diff["operators"]}
    assert outsider_api.get("/api/coverage-diff/", {"a": moe_model.pk, "b": dense_model.pk}).status_code == 400
    created = member_api.post("/api/virtual-backends/", {"name": "npu-x", "operators": ["aten::mm"]}, format="json")
    assert created.status_code == 201
    assert outsider_api.get(f"/api/virtual-backends/{created.json()['id']}/").status_code == 404


def test_a_list_that_holds_no_aten_operator_names_is_refused_naming_what_it_holds(member, member_api, cluster):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = Client()
    client.force_login(member)
    junk = SimpleUploadedFile("notes.csv", b"Quarterly plan\nship it by Friday!\naten::mm\n", content_type="text/csv")
    page = client.post("/coverage/", {"team": cluster.team.pk, "name": "junk", "operator_file": junk})
    assert page.status_code == 200 and not VirtualBackend.objects.filter(name="junk").exists()
    assert "2 of 3 entries are not operator names in ATen&#x27;s form" in page.content.decode()
    refused = member_api.post("/api/virtual-backends/", {"name": "npu-y", "operators": ["aten::mm", "hello world"]},
                              format="json")
    assert refused.status_code == 400 and "hello world" in str(refused.json()["operators"])
    # Bare names and overloads are ATen's form: they are kept, a bare name in the aten namespace.
    kept = member_api.post("/api/virtual-backends/", {"name": "npu-z", "operators": ["mm", "aten::add.Tensor"]},
                           format="json")
    assert kept.status_code == 201 and kept.json()["operators"] == ["aten::mm", "aten::add.Tensor"]


def test_a_virtual_backend_is_uploaded_as_a_csv_and_sent_to_the_node(member, cluster, node, owner, broker,
                                                                      django_capture_on_commit_callbacks):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = Client()
    client.force_login(member)
    csv = SimpleUploadedFile("vendorx.csv", b"aten::mm\naten::embedding\n", content_type="text/csv")
    client.post("/coverage/", {"team": cluster.team.pk, "name": "vendorx", "operator_file": csv})
    backend = VirtualBackend.objects.get(name="vendorx")
    assert backend.operators == ["aten::mm", "aten::embedding"]
    spec = intake.add_from_catalog(team=cluster.team, user=owner, slug="qwen3-0.6b")[0]
    job = jobs.submit_job(team=cluster.team, user=owner, cluster=cluster, model=spec, stages=["op_coverage"],
                              parameters={"op_coverage": {"virtual_backends": [backend.pk]}})
    params = placement.stage_parameters(job, "op_coverage", [])
    assert params["virtual_backend_lists"] == [{"name": "vendorx", "operators": ["aten::mm", "aten::embedding"]}]
    assert "virtual_backends" not in params


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_an_op_coverage_job_runs_on_a_real_node_worker(stack, cluster, member_api, owner):
    stack.start_node("alpha/h100-pod", "coverage-node")
    node = wait_for(node_online("coverage-node"), 60, "node registration")
    pass_env_check(node, owner)
    spec = ModelSpec.objects.create(team=cluster.team, name="mixtral", config=load_config("mixtral-8x7b-v0.1.json"))
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": spec.pk, "stages": ["op_coverage"],
                                              "parameters": {"op_coverage": {"dtypes": ["fp32"], "compile": False}}},
                               format="json")
    assert response.status_code == 201, response.json()
    done = wait_for(job_status(response.json()["id"], "succeeded", "failed"), 120, "the coverage job")
    assert done.status == "succeeded", done.error
    report = CoverageReport.objects.get(job=done)
    assert (report.backend, report.dtype, report.coverage) == ("cpu", "fp32", 1.0)
