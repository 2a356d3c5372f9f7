"""A node checks a stage's parameters again before it runs anything (paths only under its data roots), the proxy
backends a sweep accepts are the ones it has, and ranks exchange tensors, never pickles (the control plane's side
of the parameters: tests/test_stage_parameters.py)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from workers.engine import stages
from workers.engine.parameters import ParameterError
from workers.engine.sharding import ShardedRunError, run_sharded
from workers.engine.sharding.launcher import free_port

from .conftest import ROOT, load_config


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


@pytest.mark.slow
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


def test_the_proxy_backends_a_sweep_accepts_are_the_ones_it_has():
    # The names are declared without torch (the web tier checks them); the backends themselves import it.
    from workers.engine.sweep import PROXY_BACKENDS
    from workers.engine.sweep.backends import BACKENDS

    assert tuple(BACKENDS) == PROXY_BACKENDS
