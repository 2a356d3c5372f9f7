"""Stage parameters are declared, not passed through: a job's parameters are checked at submit against each
stage's declaration (API and form alike, a 400 naming the key), what only the control plane sets is refused, and
paths must lie under a node's data roots (the node's own check and the ranks' exchange:
tests/engine/test_stage_parameters.py)."""

import re

import pytest
from django.test import Client

from adaptation.models import AdaptationJob


@pytest.mark.parametrize("stage, parameters, key, says", [
    ("sharded_run", {"rendezvous": {"master_addr": "203.0.113.9", "master_port": 29500}}, "sharded_run.rendezvous",
     "is set by the control plane only; sharded_run takes: tp, pp, ep"),
    ("sharded_run", {"master_addr": "203.0.113.9"}, "sharded_run.master_addr",
     "sharded_run takes no such parameter; it takes: tp, pp, ep"),
    ("sharded_run", {"tp": 0}, "sharded_run.tp", "must be at least 1, not 0"),
    ("sharded_run", {"tp": "2"}, "sharded_run.tp", "must be a whole number"),
    ("sharded_run", {"weights_path": "/etc/passwd"}, "sharded_run.weights_path",
     "lies under no data root of this cluster's nodes (none configured"),
    ("sharded_run", {"weights_path": "relative/dir"}, "sharded_run.weights_path", "must be an absolute path"),
    ("op_coverage", {"backend_list": "/etc/passwd"}, "op_coverage.backend_list", "takes no such parameter"),
    ("op_coverage", {"virtual_backend_lists": [{"name": "x", "operators": []}]},
     "op_coverage.virtual_backend_lists", "is set by the control plane only"),
    ("op_coverage", {"virtual_backends": [424242]}, "op_coverage.virtual_backends",
     "no virtual backend 424242 in this team"),
    ("env_check", {"cpu_ranks": 100000}, "env_check.cpu_ranks", "must be at most 16"),
    ("sweep", {"grid": {"batch_size": [1, 2], "bogus": [1]}}, "sweep.grid", "unknown grid keys: bogus"),
    ("sweep", {"config": {"model_type": "llama"}}, "sweep.config", "is set by the control plane only"),
    # Upper bounds: a workload or a grid a node cannot hold (or that makes it a load generator) is refused here.
    ("sweep", {"grid": {"batch_size": [1, 1000000000]}}, "sweep.grid.batch_size",
     "values must be at most 4096, not 1000000000"),
    ("sweep", {"grid": {"batch_size": list(range(1, 66))}}, "sweep.grid.batch_size", "takes at most 64 values, not 65"),
    ("sweep", {"workload": {"requests": 1000000000}}, "sweep.workload.requests",
     "must be at most 100000, not 1000000000"),
    ("sweep", {"workload": {"prompt_len": {"uniform": [1, 2000000]}}}, "sweep.workload.prompt_len",
     "must be at most 1048576, not 2000000"),
    ("sweep", {"workload": {"output_len": [16, 1000000]}}, "sweep.workload.output_len", "must be at most 131072"),
    ("sweep", {"workload": {"requests": 100000, "prompt_len": 4096}}, "sweep.workload.requests",
     "100000 requests of up to 4112 tokens (prompt + output) make 411200000 tokens; at most 16777216"),
    ("sweep", {"workload": {"timeout_s": 1e9}}, "sweep.workload.timeout_s", "must be at most 86400, not 1e+09"),
    ("serve_sweep", {"grid": {"concurrency": [1, 5000]}}, "serve_sweep.grid.concurrency",
     "values must be at most 4096, not 5000"),
    # 64^6 configurations: refused from the lists' lengths, never multiplied out (which would hold the web worker).
    ("serve_sweep", {"grid": {key: list(range(1, 65)) for key in ("max_num_seqs", "block_size", "seed", "max_model_len",
                                                                  "max_num_batched_tokens", "kv_cache_space_gib")}},
     "serve_sweep.grid", "the grid has 68719476736 configurations; at most 64"),
    ("endpoint_bench", {"workload": {"concurrency": 100000}}, "endpoint_bench.workload.concurrency",
     "must be at most 4096, not 100000"),
    ("endpoint_bench", {"workload": {"warmup_requests": 5000}}, "endpoint_bench.workload.warmup_requests",
     "must be at most 4096, not 5000"),
])
def test_a_bad_parameter_is_refused_at_submit_naming_the_key(member_api, cluster, model_spec, stage, parameters,
                                                              key, says):
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": [stage],
                                              "parameters": {stage: parameters}}, format="json")
    assert response.status_code == 400
    [message] = response.json()["parameters"]
    assert message.startswith(f"{key}: ") and says in message, message
    assert not AdaptationJob.objects.exists()


def test_parameters_for_a_stage_the_job_does_not_run_are_refused(member_api, cluster):
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "stages": ["env_probe"],
                                              "parameters": {"sharded_run": {"tp": 2}}}, format="json")
    assert response.status_code == 400
    assert response.json()["parameters"][0].startswith('sharded_run: is neither "nodes" nor a stage of this job')


def test_a_path_under_a_nodes_data_root_is_accepted(member_api, cluster, model_spec, node, broker):
    node.host_facts = {"data_roots": ["/srv/checkpoints"]}
    node.save()
    response = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["sharded_run"],
                                              "parameters": {"sharded_run": {"weights_path": "/srv/checkpoints/q3"}}},
                               format="json")
    assert response.status_code == 201, response.json()
    outside = member_api.post("/api/jobs/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["sharded_run"],
                                             "parameters": {"sharded_run": {"weights_path": "/srv/other"}}},
                              format="json")
    assert outside.status_code == 400
    assert "lies under no data root of this cluster's nodes (/srv/checkpoints)" in outside.json()["parameters"][0]


def test_the_job_form_refuses_a_control_plane_parameter_and_lists_what_stages_take(member, cluster, model_spec):
    client = Client()
    client.force_login(member)
    page = client.get("/jobs/new/").content.decode()
    assert "decode_steps" in page and "weights_path" in page and "rendezvous" not in page
    response = client.post("/jobs/new/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["sharded_run"],
                                          "parameters": '{"sharded_run": {"rendezvous": {"master_addr": "x"}}}'})
    assert response.status_code == 200
    assert "sharded_run.rendezvous: is set by the control plane only" in response.content.decode()
    assert not AdaptationJob.objects.exists()


def test_the_openapi_schema_declares_each_stages_parameters(member_api):
    schema = member_api.get("/api/schema/?format=json").json()
    parameters = schema["components"]["schemas"]["Job"]["properties"]["parameters"]
    sharded = parameters["properties"]["sharded_run"]
    assert sharded["additionalProperties"] is False
    assert sharded["properties"]["tp"] == {"type": "integer", "description": "tensor-parallel ranks", "minimum": 1,
                                           "maximum": 64, "default": 1}
    assert "rendezvous" not in sharded["properties"]


def test_the_job_form_has_a_field_per_stage_parameter_with_its_default_and_range(member, cluster, model_spec,
                                                                                broker, team):
    from adaptation.models import VirtualBackend

    backend = VirtualBackend.objects.create(team=team, name="npu-x", operators=["aten::mm"])
    client = Client()
    client.force_login(member)
    page = client.get(f"/jobs/new/?model={model_spec.pk}&stages=op_coverage").content.decode()
    assert 'name="sharded_run__tp"' in page and 'placeholder="1"' in page
    assert "tensor-parallel ranks. Allowed: 1 to 64. Default: 1." in page
    assert 'name="sharded_run__rendezvous"' not in page  # set by the control plane only
    assert re.search(r'name="stages" value="op_coverage"[^>]*checked', page)  # preselected by the link
    assert not re.search(r'name="stages" value="sweep"[^>]*checked', page)
    assert f'value="{backend.pk}"' in page and "npu-x" in page  # virtual backends are a choice, not ids to type
    refused = client.post("/jobs/new/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["sharded_run"],
                                         "sharded_run__tp": "0"})
    assert refused.status_code == 200 and not AdaptationJob.objects.exists()
    body = refused.content.decode()
    field = body[body.index('name="sharded_run__tp"'):]
    assert "must be at least 1, not 0" in field[:2000]
    bad_json = client.post("/jobs/new/", {"cluster": cluster.pk, "model": model_spec.pk, "stages": ["sweep"],
                                          "sweep__grid": "{batch_size: [1]}"})
    assert "Not valid JSON" in bad_json.content.decode() and not AdaptationJob.objects.exists()
    accepted = client.post("/jobs/new/", {
        "cluster": cluster.pk, "model": model_spec.pk, "stages": ["sharded_run", "op_coverage"],
        "sharded_run__tp": "2", "sharded_run__dtype": "bf16", "sharded_run__shrink": "false",
        "op_coverage__virtual_backends": [str(backend.pk)], "op_coverage__dtypes": '["fp32"]',
        "sweep__grid": '{"batch_size": [1]}',  # a stage not chosen: its fields are ignored
        "parameters": '{"sharded_run": {"decode_steps": 4}}'})
    assert accepted.status_code == 302, accepted.content.decode()[:3000]
    job = AdaptationJob.objects.get()
    assert job.parameters == {"sharded_run": {"decode_steps": 4, "tp": 2, "dtype": "bf16", "shrink": False},
                              "op_coverage": {"virtual_backends": [backend.pk], "dtypes": ["fp32"]}}


def test_the_model_page_offers_coverage_and_sweep_jobs(member, model_spec):
    client = Client()
    client.force_login(member)
    page = client.get(f"/models/{model_spec.pk}/").content.decode()
    assert f"/jobs/new/?model={model_spec.pk}&amp;stages=op_coverage" in page and "Run op coverage" in page
    assert "stages=env_check&amp;stages=sweep" in page and "Run a sweep" in page
