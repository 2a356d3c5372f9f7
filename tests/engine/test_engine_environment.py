"""Engines start with a clean environment: what engines need and what the operator declared (D0_ENGINE_ENV), never
the node worker's join token, broker URL or other variables of d0's."""

import json
import sys

import pytest

from tests.harness import wait_for
from workers.engine.serving.engines import Engine
from workers.engine.serving.server import EngineServer, declared_engine_env

# What a node worker's environment holds besides what engines need.
NODE_SECRETS = {"D0_JOIN_TOKEN": "abc123.secret-part", "D0_BROKER_URL": "redis://node:password@broker:6379/0",
                "REDIS_URL": "redis://node:password@broker:6379/0", "DATABASE_URL": "postgres://d0:pw@db/d0",
                "CELERY_BROKER_URL": "redis://node:password@broker:6379/0", "D0_SECRET_KEY": "k" * 50,
                "SOME_TOOL_TOKEN": "undeclared"}
ENGINE_NEEDS = {"VLLM_LOGGING_LEVEL": "DEBUG", "HF_HOME": "/models/hf", "CUDA_VISIBLE_DEVICES": "0,1",
                "LANG": "C.UTF-8", "SITE_LICENSE_FILE": "/etc/license"}


@pytest.fixture
def node_environment(monkeypatch):
    for name, value in {**NODE_SECRETS, **ENGINE_NEEDS}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("D0_ENGINE_ENV", "SITE_LICENSE_FILE")


def test_an_engine_process_sees_what_it_needs_and_none_of_the_nodes_secrets(node_environment, tmp_path):
    seen = tmp_path / "environment.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    server = EngineServer([sys.executable, "-c", script], env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                          log_path=tmp_path / "engine.log", port=1)
    with server:
        environment = wait_for(lambda: seen.exists() and server.process.poll() is not None
                               and json.loads(seen.read_text()), 20, "the stub engine's environment")
    assert not set(NODE_SECRETS) & set(environment)
    assert not any(value in json.dumps(environment) for value in NODE_SECRETS.values())
    assert {name: environment[name] for name in ENGINE_NEEDS} == ENGINE_NEEDS
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == "1" and environment["D0_ENGINE_RUN"] == server.run_id
    assert "PATH" in environment and "PYTHONPATH" not in environment


def test_the_engine_probe_runs_with_the_same_clean_environment(node_environment, tmp_path):
    """The probe runs the engine's own interpreter too: a stub one that reports what it was given."""
    seen = tmp_path / "environment.json"
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\nenv > {seen}\nexec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    Engine("vllm", str(stub)).probe()
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines() if "=" in line}
    assert not set(NODE_SECRETS) & names and "SITE_LICENSE_FILE" in names


@pytest.mark.parametrize("declared, message", [
    ("D0_JOIN_TOKEN", "never get"), ("REDIS_URL", "never get"), ("CELERY_BROKER_URL", "never get"),
    ("PYTHONPATH", "never get"), ("bad-name", "not a variable name"), ("X;rm", "not a variable name"),
])
def test_an_operator_cannot_declare_what_engines_never_get(declared, message):
    with pytest.raises(ValueError, match=message):
        declared_engine_env(f"SITE_LICENSE_FILE {declared}")


def test_declared_names_are_space_or_comma_separated():
    assert declared_engine_env("A_B, C  D,E") == ["A_B", "C", "D", "E"]
