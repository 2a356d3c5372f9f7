"""The local node's engine under `make run`: the preparation script in the background, its status file, and what the
cluster page says meanwhile ("preparing vLLM", or why it failed and where its log is)."""

import os
import stat
import subprocess
import sys

import pytest
from django.test import Client

from adaptation.clusters import local_engine


def script(folder, body: str) -> str:
    path = folder / "prepare.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_preparation_that_prints_an_interpreter_is_ready_with_it(tmp_path):
    preparation = local_engine.Preparation(tmp_path, script(tmp_path, f"echo installing\necho {sys.executable}\n"),
                                           "demo/local")
    assert local_engine.read_status(tmp_path, "demo/local")["state"] == "preparing"
    assert preparation.wait(30) and preparation.python == sys.executable and preparation.reason is None
    assert (tmp_path / local_engine.LOG_FILE).read_text() == f"installing\n{sys.executable}\n"


def test_a_failed_preparation_says_why_and_where_its_log_is(tmp_path):
    preparation = local_engine.Preparation(tmp_path, script(tmp_path, "echo 'python3.11: not found' >&2\nexit 127\n"),
                                           "demo/local")
    assert preparation.wait(30) and preparation.python is None
    assert preparation.reason == "prepare.sh exited with code 127: python3.11: not found"
    status = local_engine.read_status(tmp_path, "demo/local")
    assert status["state"] == "failed" and status["reason"] == preparation.reason
    assert status["log"] == str(tmp_path / local_engine.LOG_FILE)


def test_a_status_speaks_only_for_its_cluster_and_while_its_up_runs(tmp_path):
    local_engine.write_status(tmp_path, cluster="demo/local", state="preparing")
    assert local_engine.read_status(tmp_path, "demo/local")["pid"] == os.getpid()
    assert local_engine.read_status(tmp_path, "alpha/pair") is None
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    status = local_engine.status_path(tmp_path)
    status.write_text(status.read_text().replace(str(os.getpid()), gone.stdout.strip()))
    assert local_engine.read_status(tmp_path, "demo/local") is None  # an `up` killed outright says nothing


@pytest.mark.django_db
@pytest.mark.parametrize("state,shown", [
    ("preparing", "Preparing vLLM (its CPU build) for the local node in the background"),
    ("restarting", "vLLM is ready (<code>/x/.venv-vllm/bin/python</code>): the local node starts again"),
    ("failed", "vLLM could not be prepared for the local node: prepare.sh exited with code 1: no network"),
])
def test_the_cluster_page_says_where_the_local_engine_stands(settings, tmp_path, member, cluster, state, shown):
    settings.VAR_DIR = tmp_path
    client = Client()
    client.force_login(member)
    assert 'id="local-engine"' not in client.get(f"/clusters/{cluster.pk}/").content.decode()
    local_engine.write_status(tmp_path, cluster=cluster.join_name, state=state, python="/x/.venv-vllm/bin/python",
                              log=str(tmp_path / "vllm-env.log"), reason="prepare.sh exited with code 1: no network")
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert shown in page
    assert (str(tmp_path / "vllm-env.log") in page) == (state != "restarting")
