"""The stage registry (workers/engine/stages.py): each capability's kinds in pipeline order, a kind added by a module
named in $D0_STAGE_MODULES or by ``register`` without editing d0, and the verbs of ``python -m workers.engine``
importable one by one."""

import json
import os
import subprocess
import sys

import pytest

from workers.engine import stages
from workers.engine.__main__ import VERB_MODULES, load_verb
from workers.engine.parameters import ParameterError
from workers.engine.stage_spec import StageSpec

from . import echo_stage
from .conftest import ROOT

PIPELINE = ["env_probe", "env_check", "op_coverage", "sharded_run", "sweep", "serve_sweep", "endpoint_bench"]


@pytest.fixture
def registry(monkeypatch):
    """The registry as d0 ships it, restored after the test."""
    monkeypatch.setattr(stages, "STAGES", dict(stages.STAGES))
    return stages.STAGES


def test_the_shipped_kinds_are_every_capabilitys_in_pipeline_order():
    assert list(stages.STAGES)[:len(PIPELINE)] == PIPELINE
    assert all(kind == spec.kind for kind, spec in stages.STAGES.items())


def test_a_kind_registered_at_run_time_is_checked_run_and_described_like_the_shipped_ones(registry):
    [spec] = echo_stage.STAGES
    assert stages.register(spec) is spec
    assert list(registry)[-1] == "echo"
    reports = []
    assert stages.run_stage("echo", {"message": "hi"}, lambda fraction, message: reports.append(fraction)) == {
        "echo": "hi"}
    assert reports == [0.5]
    with pytest.raises(ParameterError, match="echo takes no such parameter"):
        stages.run_stage("echo", {"volume": 11}, lambda *_: None)
    assert stages.check_job_parameters(["echo"], {"echo": {"message": "x"}}) == {"echo": {"message": "x"}}
    assert [parameter["name"] for parameter in stages.describe_parameters()["echo"]] == ["message"]
    assert "echo" in stages.parameters_json_schema()["properties"]


def test_the_same_kind_declared_again_is_kept_and_a_different_one_refused(registry):
    [spec] = echo_stage.STAGES
    stages.register(spec)
    assert stages.register(StageSpec("echo", echo_stage.echo, gated=False, placement="one", preload=("json",),
                                     parameters=spec.parameters)) is spec
    with pytest.raises(ValueError, match="'echo' is declared twice, differently"):
        stages.register(StageSpec("echo", echo_stage.echo, gated=True, parameters=spec.parameters))
    with pytest.raises(ValueError, match="'sweep' is declared twice"):
        stages.register(StageSpec("sweep", echo_stage.echo, gated=False))
    assert stages.STAGES["echo"] is spec


def test_a_spec_with_an_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="placement is every, one or group, not 'all'"):
        StageSpec("echo", echo_stage.echo, gated=False, placement="all")


# What a process sees with ``$D0_STAGE_MODULES`` set: the registry's kinds, what the node imports before it forks.
REGISTRY = ("import json, sys; from workers.engine import stages; "
            "print(json.dumps({'kinds': list(stages.STAGES), "
            "'preload': [name for spec in stages.STAGES.values() for name in spec.preload], "
            "'run': stages.run_stage('echo', {}, lambda *_: None), 'torch': 'torch' in sys.modules}))")


def test_a_module_named_in_the_environment_adds_its_kinds_after_the_shipped_ones_without_torch():
    result = subprocess.run([sys.executable, "-c", REGISTRY], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "D0_STAGE_MODULES": " tests.engine.echo_stage ,"}, check=True)
    seen = json.loads(result.stdout)
    assert seen["kinds"] == [*PIPELINE, "echo"]
    assert seen["run"] == {"echo": "hello"} and seen["preload"][-1] == "json" and not seen["torch"]


def test_a_module_named_in_the_environment_without_stages_is_refused_by_name():
    result = subprocess.run([sys.executable, "-c", "import workers.engine.stages"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "D0_STAGE_MODULES": "tests.engine.conftest"})
    assert result.returncode != 0
    assert "tests.engine.conftest declares no STAGES" in result.stderr


def test_every_capabilitys_verbs_load_with_what_a_verb_needs():
    assert list(VERB_MODULES) == ["probe", "envcheck", "analyze", "coverage", "shard", "sweep", "serve",
                                  "bench-endpoint", "ledger", "demo-model"]
    # Every verb is a capability's, but for the analysis and the one model path's demo model maker.
    assert {module.partition(".")[0] for module, _ in VERB_MODULES.values()} == {"analysis", "models",
                                                                                 *stages.CAPABILITIES}
    for name in VERB_MODULES:
        verb = load_verb(name)
        assert callable(verb.add_parser) and callable(verb.run), name
