"""Stage parameters are declared, not passed through: a job's parameters are checked at submit against each
stage's declaration (API and form alike, a 400 naming the key), what only the control plane sets is refused, paths
must lie under a node's data roots, the node checks again, and ranks exchange tensors, never pickles."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import Client

from adaptation.models import AdaptationJob
from tests.conftest import load_config
from workers.engine import stages
from workers.engine.parameters import ParameterError
from workers.engine.sharding import ShardedRunError, run_sharded
from workers.engine.sharding.launcher import free_port

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_node_checks_again_and_refuses_paths_outside_its_data_roots(tmp_path):
    progress = lambda *_: None  # noqa: E731
    with pytest.raises(ParameterError, match="weights_path: this node takes no path parameters"):
        stages.run_stage("sharded_run", {"weights_path": str(tmp_path)}, progress)
    with pytest.raises(ParameterError, match="weights_path: must lie under this node's data roots"):
        stages.run_stage("sharded_run", {"weights_path": "/etc"}, progress, data_roots=(str(tmp_path),))
    with pytest.raises(ParameterError, match="backend_list: op_coverage takes no such parameter"):
        stages.run_stage("op_coverage", {"backend_list": "/etc/passwd"}, progress)
    with pytest.raises(ParameterError, match="cpu_ranks: must be at most 16"):
        stages.run_stage("env_check", {"cpu_ranks": 10**6}, progress)
    # A link inside a root that points out of it is outside.
    (tmp_path / "escape").symlink_to("/etc")
    with pytest.raises(ParameterError, match="must lie under"):
        stages.run_stage("sharded_run", {"weights_path": str(tmp_path / "escape")}, progress,
                         data_roots=(str(tmp_path),))


def test_no_collective_in_the_engine_exchanges_pickled_objects():
    engine = ROOT / "workers" / "engine"
    calls = [f"{path.relative_to(ROOT)}:{number}" for path in engine.rglob("*.py")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\.(all_gather_object|broadcast_object_list|gather_object|scatter_object_list|"
                          r"send_object_list|recv_object_list)\(", line)]
    assert calls == []


ROGUE_RANK_0 = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist

    class Payload:
        def __reduce__(self):  # runs in whoever unpickles it; the mark is made only in d0's rank 1
            return (os.system, (f'[ "$RANK" = 1 ] && touch {sys.argv[1]}',))

    dist.init_process_group("gloo", rank=0, world_size=2)
    dist.new_group([0, 1])
    try:
        dist.all_gather_object([None, None], Payload())
    except Exception:
        pass  # rank 1's answer is JSON, which this rank cannot unpickle; what matters is what rank 1 did
""")


def test_a_rogue_rank_0_cannot_run_code_in_a_rank_that_joins_it(tmp_path):
    """A rank pointed at a rank 0 of the attacker's (the rendezvous is now set by the control plane only; this is
    the layer under that): the rogue sends a pickle that would create a file when unpickled; the rank reads JSON
    only, so it fails the run and nothing runs."""
    marker = tmp_path / "pwned"
    port = free_port()
    rogue = subprocess.Popen([sys.executable, "-c", ROGUE_RANK_0, str(marker)], cwd=ROOT,
                             env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with pytest.raises(ShardedRunError, match="rank 1"):
            run_sharded(load_config("llama-3.1-8b.json"), tp=2, device="cpu", timeout_s=120,
                        rendezvous={"master_addr": "127.0.0.1", "master_port": port, "world_size": 2, "node_rank": 1,
                                    "nproc_per_node": 1})
    finally:
        rogue.kill()
        rogue.wait(timeout=30)
    assert not marker.exists(), "the rank unpickled what the rogue rank 0 sent"


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


def test_the_proxy_backends_a_sweep_accepts_are_the_ones_it_has():
    # The names are declared without torch (the web tier checks them); the backends themselves import it.
    from workers.engine.sweep import PROXY_BACKENDS
    from workers.engine.sweep.backends import BACKENDS

    assert tuple(BACKENDS) == PROXY_BACKENDS
