"""A serve sweep whose engine deployment spans several nodes: one engine launch per node, started, watched and
stopped together.

The control plane places the stage on a group of nodes (as it places a sharded run's ranks) and sends each its
``rendezvous``: node rank 0's address and a port, this node's rank and every node's hostname. Node rank 0 (the
leader) runs the sweep: it serves the API and decides each engine start; the other nodes (followers) start their
engine headless for each start the leader announces, and stop it when told. vLLM's own multi-node mechanism joins
the engines (``launchers.node_arguments``); d0's nodes coordinate through torch.distributed's ``TCPStore`` at the
rendezvous address, the store torchrun and vLLM use themselves, not a transport of d0's own.

The store holds only small JSON facts: who joined, which engine start is on (its settings and the engine's
rendezvous port), which node's engine failed and why, which stopped. A follower takes a start's settings only
after ``check_settings`` and only with the layout its own (signed) parameters name, so whoever reaches the store can
at worst start the engine the job asked for, with other tuning values. Every wait has a deadline: a node that never
joins, an engine that dies on any node, a leader that goes away, each ends the stage with the node named and the
engine's own line, and no engine is left running on any node.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from .launchers import NodeRole, check_settings, layout_of, ranks_of
from .server import EngineFailed, EngineServer

POLL_S = 0.5
STOP_WAIT_S = 30.0
SETTLE_S = 5.0


class DeploymentFailed(RuntimeError):
    """The deployment as a whole cannot go on (a node never joined, the leader went away)."""


@dataclass(frozen=True)
class Rendezvous:
    """This node's place in the deployment, as the control plane sent it."""

    master_addr: str
    master_port: int
    node_rank: int
    hostnames: tuple[str, ...]

    @classmethod
    def from_params(cls, rendezvous: dict | None) -> Rendezvous | None:
        """None for a single node (no rendezvous, or a group of one)."""
        if not rendezvous:
            return None
        hostnames = tuple(str(name) for name in rendezvous.get("hostnames") or ())
        if len(hostnames) < 2:
            return None
        rank = int(rendezvous["node_rank"])
        if not 0 <= rank < len(hostnames):
            raise ValueError(f"node rank {rank} is outside a deployment of {len(hostnames)} nodes")
        return cls(str(rendezvous["master_addr"]), int(rendezvous["master_port"]), rank, hostnames)

    @property
    def nodes(self) -> int:
        return len(self.hostnames)

    def name(self, rank: int) -> str:
        return f"node rank {rank} ({self.hostnames[rank]})"


def spans_nodes(settings: dict) -> bool:
    """Whether an engine start with these settings is the deployment's (every node) or rank 0's alone: a start with
    one rank (the correctness check's TP=1 engine) runs on the leader only."""
    replica, dp = ranks_of(settings)
    return replica * dp > 1


class _Store:
    """The deployment's TCPStore, its calls serialized (the leader's watcher thread shares it) and JSON values."""

    def __init__(self, rendezvous: Rendezvous, timeout_s: float):
        from torch.distributed import TCPStore

        self.lock = threading.Lock()
        leader = rendezvous.node_rank == 0
        self.store = TCPStore(rendezvous.master_addr if not leader else "0.0.0.0", rendezvous.master_port, None,
                              leader, timedelta(seconds=timeout_s), wait_for_workers=False)

    def set(self, key: str, value) -> None:
        with self.lock:
            self.store.set(key, json.dumps(value))

    def get(self, key: str):
        """The key's value, or None when it is not set (never blocks)."""
        with self.lock:
            if not self.store.check([key]):
                return None
            return json.loads(self.store.get(key))


class Leader:
    """Node rank 0's side: waits for every node to join, announces each engine start, watches the followers'
    engines and stops them with its own."""

    def __init__(self, rendezvous: Rendezvous, join_timeout_s: float):
        self.rendezvous, self.join_timeout_s = rendezvous, join_timeout_s
        self.store = _Store(rendezvous, join_timeout_s)
        self.starts = 0

    def wait_for_nodes(self) -> float:
        """Seconds until every follower joined; DeploymentFailed naming the nodes that did not in time."""
        started = time.perf_counter()
        deadline = started + self.join_timeout_s
        while True:
            missing = [rank for rank in range(1, self.rendezvous.nodes) if self.store.get(f"joined/{rank}") is None]
            if not missing:
                return time.perf_counter() - started
            if time.perf_counter() > deadline:
                names = ", ".join(self.rendezvous.name(rank) for rank in missing)
                raise DeploymentFailed(
                    f"{names} never joined the deployment within {self.join_timeout_s:.0f} s (its stage did not "
                    f"start, or it cannot reach {self.rendezvous.master_addr}:{self.rendezvous.master_port})")
            time.sleep(POLL_S)

    def role(self, engine_port: int, host_ip: str | None) -> NodeRole:
        return NodeRole(self.rendezvous.nodes, 0, self.rendezvous.master_addr, engine_port, host_ip)

    def announce(self, settings: dict, engine_port: int) -> int:
        self.starts += 1
        self.store.set(f"start/{self.starts}", {"settings": settings, "engine_port": engine_port})
        return self.starts

    def peer_failure(self, start: int) -> EngineFailed | None:
        for rank in range(1, self.rendezvous.nodes):
            failed = self.store.get(f"failed/{start}/{rank}")
            if failed:
                return EngineFailed(str(failed.get("cause") or "exited"),
                                    f"{self.rendezvous.name(rank)}: {failed.get('reason') or 'its engine stopped'}")
        return None

    def not_started(self, start: int) -> list[str]:
        return [self.rendezvous.name(rank) for rank in range(1, self.rendezvous.nodes)
                if self.store.get(f"up/{start}/{rank}") is None]

    def request_stop(self, start: int) -> None:
        self.store.set(f"stop/{start}", True)

    def wait_stopped(self, start: int) -> list[str]:
        """The nodes that did not say, in time, that start ``start``'s engine stopped."""
        deadline = time.perf_counter() + STOP_WAIT_S
        while True:
            left = [rank for rank in range(1, self.rendezvous.nodes)
                    if self.store.get(f"stopped/{start}/{rank}") is None]
            if not left or time.perf_counter() > deadline:
                return [self.rendezvous.name(rank) for rank in left]
            time.sleep(POLL_S)

    def end(self, status: str, reason: str = "") -> None:
        """The deployment is over: the followers are told, and the store (this process's) stays up until each has
        read it or ``STOP_WAIT_S`` passed, so none mistakes a finished sweep for a leader that went away."""
        try:
            self.store.set("end", {"status": status, "reason": reason})
            deadline = time.perf_counter() + STOP_WAIT_S
            while time.perf_counter() < deadline and any(
                    self.store.get(f"left/{rank}") is None for rank in range(1, self.rendezvous.nodes)):
                time.sleep(POLL_S)
        except RuntimeError:  # a store that is gone tells the followers the same, by its absence
            pass


class DeployedServer(EngineServer):
    """Node rank 0's engine of a start that spans the nodes: the local server, plus the followers' engines watched
    while it starts and serves. A follower's failure stops the local engine at once (its in-flight requests end
    rather than wait on a rank that is gone) and becomes this server's failure, with that node named."""

    def __init__(self, *args, leader: Leader, settings: dict, engine_port: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.leader, self.settings, self.engine_port = leader, settings, engine_port
        self.start_index: int | None = None
        self.peer_failed: EngineFailed | None = None
        self.watching = threading.Event()

    def start(self) -> None:
        super().start()
        self.start_index = self.leader.announce(self.settings, self.engine_port)
        self.watching.set()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.watching.is_set():
            try:
                failure = self.leader.peer_failure(self.start_index)
            except RuntimeError:
                return
            if failure is not None:
                self.peer_failed = failure
                EngineServer.stop(self)
                return
            time.sleep(POLL_S)

    def alive(self) -> bool:
        return self.peer_failed is None and super().alive()

    def settle(self, wait_s: float = SETTLE_S) -> None:
        """Wait a moment for a follower's failure to be reported: when requests failed, or the local engine
        stopped, a follower's engine dying is the likelier cause, and its node and line are the diagnosis."""
        deadline = time.perf_counter() + wait_s
        while self.peer_failed is None and self.start_index is not None and time.perf_counter() < deadline:
            try:
                self.peer_failed = self.leader.peer_failure(self.start_index)
            except RuntimeError:
                return
            time.sleep(POLL_S / 2)

    def failure(self, cause: str, reason: str) -> EngineFailed:
        self.settle()
        if self.peer_failed is not None:
            return self.peer_failed
        if self.start_index is not None:
            missing = self.leader.not_started(self.start_index)
            if missing and cause == "timed out":
                return EngineFailed(cause, f"{reason}; {', '.join(missing)} never started its engine")
        return super().failure(cause, reason)

    def wait_healthy(self, timeout_s: float, cancelled=None) -> float:
        return super().wait_healthy(timeout_s, cancelled=lambda: self.peer_failed is not None
                                    or (cancelled is not None and cancelled()))

    def stop(self) -> None:
        """The followers are told first, so every node's engine stops at once; returns once this node's is gone and
        the followers said theirs are (or did not within ``STOP_WAIT_S``: each follower stops its own engine on
        every path out, and the control plane stops a follower whose stage outlives its leader's)."""
        self.watching.clear()
        told = False
        if self.start_index is not None:
            try:
                self.leader.request_stop(self.start_index)
                told = True
            except RuntimeError:
                pass
        super().stop()
        if told:
            try:
                self.leader.wait_stopped(self.start_index)
            except RuntimeError:
                pass


class Follower:
    """A node rank above 0: joins, then for each start the leader announces runs its engine headless until the
    leader says stop (or the engine dies: then it says why, with its node named by the leader)."""

    def __init__(self, rendezvous: Rendezvous, join_timeout_s: float, layout: dict):
        self.rendezvous, self.layout = rendezvous, layout
        try:
            self.store = _Store(rendezvous, join_timeout_s)
        except RuntimeError as error:
            raise DeploymentFailed(
                f"{rendezvous.name(0)} was not reachable at {rendezvous.master_addr}:{rendezvous.master_port} "
                f"within {join_timeout_s:.0f} s: {str(error).splitlines()[0][:200]}") from None
        self.store.set(f"joined/{rendezvous.node_rank}", rendezvous.hostnames[rendezvous.node_rank])

    def next_start(self, index: int, idle_s: float) -> dict | None:
        """Start ``index``'s settings and engine port, or None when the leader ended the deployment."""
        deadline = time.perf_counter() + idle_s
        while True:
            try:
                start = self.store.get(f"start/{index}")
                if start is not None:
                    return self._checked(start)
                if self.store.get("end") is not None:
                    return None
            except RuntimeError as error:
                raise DeploymentFailed(f"{self.rendezvous.name(0)} went away: {_first_line(error)}") from None
            if time.perf_counter() > deadline:
                raise DeploymentFailed(f"{self.rendezvous.name(0)} announced no engine start for {idle_s:.0f} s")
            time.sleep(POLL_S)

    def _checked(self, start: dict) -> dict:
        settings = check_settings(dict(start.get("settings") or {}))
        port = start.get("engine_port")
        if layout_of(settings) != self.layout:
            raise DeploymentFailed(f"{self.rendezvous.name(0)} announced the layout {layout_of(settings)}, not the "
                                   f"job's {self.layout}")
        if not (isinstance(port, int) and 1024 <= port <= 65535):
            raise DeploymentFailed(f"{self.rendezvous.name(0)} announced no usable engine port ({port!r})")
        return {"settings": settings, "engine_port": port}

    def serve(self, index: int, server: EngineServer) -> dict:
        """Run start ``index``'s engine until the leader says stop; what happened to it."""
        rank = self.rendezvous.node_rank
        outcome = {"start": index, "status": "stopped"}
        try:
            server.start()
            self.store.set(f"up/{index}/{rank}", True)
            while True:
                if self.store.get(f"stop/{index}") is not None or self.store.get("end") is not None:
                    break
                if not server.alive():
                    code = server.process.returncode
                    failure = server.failure("exited", f"its engine exited with code {code}"
                                             + (" (killed by a signal)" if code is not None and code < 0 else ""))
                    outcome = {"start": index, "status": "failed", "cause": failure.cause, "reason": failure.reason}
                    self.store.set(f"failed/{index}/{rank}", {"cause": failure.cause, "reason": failure.reason})
                    self._wait_stop(index)
                    break
                time.sleep(POLL_S)
        except RuntimeError as error:
            outcome = {"start": index, "status": "failed", "cause": "leader gone",
                       "reason": f"{self.rendezvous.name(0)} went away: {_first_line(error)}"}
            raise DeploymentFailed(outcome["reason"]) from None
        finally:
            server.stop()
            try:
                self.store.set(f"stopped/{index}/{rank}", True)
            except RuntimeError:
                pass
        return outcome

    def _wait_stop(self, index: int) -> None:
        deadline = time.perf_counter() + STOP_WAIT_S
        while time.perf_counter() < deadline:
            if self.store.get(f"stop/{index}") is not None or self.store.get("end") is not None:
                return
            time.sleep(POLL_S)

    def ended(self) -> dict:
        """How node rank 0 ended the deployment, once this node saw it end; the leader is told this node left."""
        try:
            ended = self.store.get("end") or {}
            self.store.set(f"left/{self.rendezvous.node_rank}", True)
            return ended
        except RuntimeError:
            return {}


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
