"""The node worker: runs engine stages for one node and reports back over the broker. No Django, no database.

Join a node to a cluster with one command (the cluster page shows it with the right names and a fresh token)::

    D0_JOIN_TOKEN=abcd1234.0123… D0_CONTROL_KEY=<the control plane's public key> \\
        python -m workers.node --broker redis://control-plane:6379/0 --cluster team/cluster

At its first start the worker makes the node's own key pair in ``--state-dir`` and registers the node (hostname,
host facts, devices, public key) with a proof of the join token; from then on every message it sends is signed
with that key (workers/signing.py), and a restart needs no token. It pins the control plane's key and obeys only
what that key signed for it (workers/control_trust.py). On a broker with per-node users it joins as its token's
broker user and then connects as a user of its own (workers/broker_credentials.py). It sends a heartbeat every
``--heartbeat`` seconds (on the heartbeat queue), consumes only its own queue, and answers no remote-control command
but a signed ``revoke``. A stage's started and finished reports that the broker refuses wait in the node's outbox
(workers/outbox.py) until it answers again; progress reports are best-effort.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.request import Request

from . import broker_fix  # noqa: F401 - a broker restart must not stop the node worker
from . import broker_credentials, control_trust, protocol, signing, stage_memory
from .engine.envcheck.probe import probe_devices, probe_host
from .engine.serving import endpoint_guard
from .engine.serving.engines import configured_engines, parse_engines
from .engine.stages import STAGES
from .engine.stages import run_stage as run_engine_stage
from .delivered import Delivered
from .engine.workdirs import remove_stale
from .outbox import Outbox
from .remote_control import NODE_COMMANDS, allow_only
from .stage_runs import StageRuns, loss_reason

logger = logging.getLogger("d0.node")

# No fixups: Celery's Django fixup would import Django whenever DJANGO_SETTINGS_MODULE is set in the node's env.
app = Celery("d0node", fixups=[])

# Long GPU work: hours, not Celery's defaults. A stage past the soft limit is reported as failed.
STAGE_SOFT_TIME_LIMIT = int(os.environ.get("D0_STAGE_SOFT_TIME_LIMIT", 6 * 3600))
PROGRESS_MIN_INTERVAL = 0.5  # seconds between progress messages, so a chatty stage cannot flood the broker
# Seconds between tries of a stage report the broker refused (a restart takes seconds); after the last it waits in
# the outbox for the heartbeat thread, and the stage's slot is free for the next stage.
REPORT_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)


@dataclass
class Identity:
    cluster_ref: str = ""
    hostname: str = ""
    queue: str = ""
    heartbeat_interval: float = 10.0
    key: signing.NodeKey | None = None
    join_token: str = ""
    data_roots: tuple[str, ...] = ()  # folders stage parameters may name (checkpoints); none: no path parameter
    delivered: Delivered | None = None  # stage tasks already started here (a redelivery is dropped)
    outbox: Outbox | None = None  # stage reports the broker did not take yet


identity = Identity()
_stop_heartbeat = threading.Event()
held = StageRuns()  # the stage runs this worker holds, named by its heartbeats (kept in the main process)


def key_path(state_dir: Path, cluster_ref: str, hostname: str) -> Path:
    """One key per cluster and hostname, so one machine can run nodes of several clusters."""
    return state_dir / f"{protocol.node_queue(cluster_ref, hostname)}.key"


def configure(broker_url: str, cluster_ref: str, hostname: str, heartbeat_interval: float, *,
              state_dir: Path, join_token: str = "", control_key: str = "") -> None:
    """ControlKeyError when the control plane's key is missing or not the one this node pinned."""
    identity.cluster_ref = cluster_ref
    identity.hostname = hostname
    identity.queue = protocol.node_queue(cluster_ref, hostname)
    identity.heartbeat_interval = heartbeat_interval
    identity.key, created = signing.NodeKey.load_or_create(key_path(state_dir, cluster_ref, hostname))
    control_trust.configure(state_dir, identity.queue, identity.key, control_key)
    identity.delivered = Delivered(state_dir / identity.queue)
    identity.outbox = Outbox(state_dir / identity.queue / "outbox")
    identity.join_token = join_token
    if created and not join_token:
        logger.warning("this node has no key registered yet and no join token was given (--token or "
                       "$D0_JOIN_TOKEN): the control plane will refuse it")
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_soft_time_limit=STAGE_SOFT_TIME_LIMIT,
        task_time_limit=STAGE_SOFT_TIME_LIMIT + 300,
        worker_hijack_root_logger=False,
        **broker_credentials.celery_settings(identity.queue),
    )


def _sender(connection=None, queue: str | None = None, expires: float | None = None):
    def send(task_name: str, message: list) -> None:
        app.send_task(task_name, args=message, queue=queue or protocol.control_queue(), expires=expires,
                      connection=connection, **broker_credentials.PUBLISH_OPTIONS)
    return send


def report(task_name: str, *args, **extra) -> None:
    """A report the job depends on (a stage started or finished), signed with this node's key now (``extra``: more
    signed fields, e.g. a finished stage's ``ran_for`` seconds). It never raises:
    what the broker refuses is tried again with back-off, then kept in the outbox and sent when the broker answers
    again (the heartbeat thread, the next report or the node's next start), oldest first."""
    left = identity.outbox.deliver(task_name, identity.key.message(task_name, list(args), **extra), _sender(),
                                   REPORT_RETRY_DELAYS)
    if left:
        logger.warning("the broker is away: %d report(s) wait in %s", left, identity.outbox.folder)


def report_progress(*args) -> None:
    """Progress is best-effort: one try, dropped when the broker refuses it (the next one says more), and skipped
    while reports wait in the outbox, which it must not overtake. A stage never fails for its progress."""
    if identity.outbox.pending():
        return
    try:
        _sender()(protocol.STAGE_PROGRESS, identity.key.message(protocol.STAGE_PROGRESS, list(args)))
    except Exception as error:  # noqa: BLE001 - see above
        logger.warning("progress report dropped: %s", error)


def finished_runs_kept(outbox: Outbox) -> list[int]:
    """The stage runs whose "finished" reports wait in ``outbox`` (each kept message is [key id, payload,
    signature], the payload's "args" starting with the stage run's id), at most the newest MAX_FINISHED_RUNS."""
    runs = []
    for message in outbox.kept(protocol.STAGE_FINISHED):
        try:
            run = json.loads(message[1])["args"][0]
        except (IndexError, KeyError, TypeError, ValueError):
            continue  # not a report this worker signed: the control plane drops it when it comes
        if type(run) is int:
            runs.append(run)
    return runs[-protocol.MAX_FINISHED_RUNS:]


def registration(host: dict, devices: list[dict], finished_runs: list[int] = ()) -> list[str]:
    """The registration's arguments: [payload, signature, token id, token proof]. The token's secret is never
    sent: a key derived from it signs the payload, which the control plane checks with the public half it keeps.
    ``finished_runs``: the stage runs whose finished reports this start sends just before, from its outbox, so the
    control plane leaves them to their report instead of failing them as cut short by the restart."""
    payload = signing.encode_payload({"task": protocol.REGISTER_NODE, "ts": time.time(),
                                      "cluster": identity.cluster_ref, "hostname": identity.hostname,
                                      "public_key": identity.key.public_key, "host_facts": host, "devices": devices,
                                      "finished_runs": list(finished_runs),
                                      **control_trust.registration_fields(),
                                      **broker_credentials.registration_fields()})
    token_id = proof = ""
    if identity.join_token:
        token_id, secret = signing.split_join_token(identity.join_token)
        proof = signing.token_proof(token_id, secret, payload)
    return [payload, identity.key.sign(payload), token_id, proof]


@app.task(name=protocol.RUN_STAGE, bind=True)
def run_stage(self, *message) -> None:
    stage = control_trust.stage_message(message, self.request.id)
    if stage is None:
        return  # not the control plane's message for this node: nothing in it is run or reported
    stage_run_id, kind = stage.stage_run_id, stage.kind
    if identity.delivered is not None and not identity.delivered.first_delivery(stage.task_id):
        # Started here before, by a worker that died mid-stage: the control plane failed that run already.
        logger.warning("stage run %s (task %s) was delivered again after this node started it; not run twice",
                       stage_run_id, self.request.id)
        return
    # An instant stage (a probe) is told by its "finished" report alone, which carries how long it ran: the control
    # plane takes one report, not two. (Deferring "started" for every stage, by a timer thread or to the first
    # progress, left a pool process behind a cold shutdown, or a long stage "queued" until its first progress.)
    clock = time.monotonic()
    if not (kind in STAGES and STAGES[kind].instant):
        report(protocol.STAGE_STARTED, stage_run_id)
    # "started" says the stage runs; a progress report within the next interval adds nothing a person could see.
    last_sent = clock

    def progress(fraction: float, message: str) -> None:
        nonlocal last_sent
        now = time.monotonic()
        if now - last_sent >= PROGRESS_MIN_INTERVAL:
            last_sent = now
            report_progress(stage_run_id, float(fraction), str(message))

    def finished(*outcome) -> None:
        report(protocol.STAGE_FINISHED, stage_run_id, *outcome, ran_for=round(time.monotonic() - clock, 6))

    try:
        result = run_engine_stage(kind, control_trust.stage_parameters(stage), progress,
                                  data_roots=identity.data_roots)
    except SoftTimeLimitExceeded:
        finished(False, None, f"stage {kind} ran past its time limit ({STAGE_SOFT_TIME_LIMIT}s)",
                 traceback.format_exc())
    except Exception as error:  # noqa: BLE001 - every failure goes back to the job row, with its traceback
        finished(False, None, f"{type(error).__name__}: {error}", traceback.format_exc())
    else:
        finished(True, result, "", "")


def _heartbeat_loop() -> None:
    # A connection of its own: the worker's consumer connection is not to be shared with another thread.
    with app.connection_for_write() as connection:
        # On a queue of its own, which the control worker reads in turn with its control queue, so a backlog of
        # reports and dispatches cannot hold heartbeats back. Expires: a heartbeat that waited in the broker
        # longer than two intervals proves nothing.
        beat = _sender(connection, protocol.heartbeat_queue(), expires=identity.heartbeat_interval * 2)
        while not _stop_heartbeat.wait(identity.heartbeat_interval):
            try:
                beat(protocol.NODE_HEARTBEAT, identity.key.message(protocol.NODE_HEARTBEAT, heartbeat_args()))
            except Exception as error:  # noqa: BLE001 - a broker blip must not kill the heartbeat thread
                logger.warning("heartbeat failed (%s); trying again in %ss", error, identity.heartbeat_interval)
                continue
            # The broker answers: send what it refused before. Not waiting for a stage's report being sent now.
            identity.outbox.flush(_sender(connection), wait=False)


def heartbeat_args() -> list:
    """A heartbeat's one argument: the stage runs this worker holds, those that ended here lately, and those whose
    process died without a report, with why (``workers/stage_runs.py``)."""
    return [held.beat(identity.heartbeat_interval, finished_runs_kept(identity.outbox))]


class StageRequest(Request):
    """A stage message's request in the worker's main process, which sees its end: acknowledged (it ran, or was
    revoked before it ran), rejected, or failed by the pool (the stage's process died: killed by the kernel's OOM
    killer or anyone else, terminated by a revoke, past the hard time limit) — then ``held`` keeps why."""

    def on_failure(self, exc_info, *args, **kwargs):
        error = exc_info.exception
        held.ended(self.id, loss_reason(getattr(error, "exc", error)))  # an ExceptionWithTraceback wraps it
        # The dead process ran no clean-up; the worker goes on, so its work folders go now, not at the next start.
        for folder in remove_stale():
            logger.warning("removed the work folder %s of a stage whose process died", folder)
        return super().on_failure(exc_info, *args, **kwargs)

    def acknowledge(self):
        held.ended(self.id)
        return super().acknowledge()

    def reject(self, requeue=False):
        held.ended(self.id)
        return super().reject(requeue=requeue)


@signals.worker_init.connect
def _stage_requests(**kwargs) -> None:
    # Before the consumer builds its task strategies, which read the task's Request class.
    app.tasks[protocol.RUN_STAGE].Request = StageRequest


@signals.task_received.connect
def _stage_arrived(request=None, **kwargs) -> None:
    if request is not None and request.name == protocol.RUN_STAGE:
        # Only what the control plane signed for this node: a forged message must not keep a lost run "held".
        stage = control_trust.stage_message(request.args, request.id, log=False)
        if stage is not None:
            held.arrived(request.id, stage.stage_run_id)


@signals.task_prerun.connect
def _limit_stage_memory(task=None, **kwargs) -> None:
    # In the pool process, around the stage only: the node's own work between stages is not the stage's.
    if task is not None and task.name == protocol.RUN_STAGE:
        stage_memory.enter()


@signals.task_postrun.connect
def _lift_stage_memory(task=None, **kwargs) -> None:
    if task is not None and task.name == protocol.RUN_STAGE:
        stage_memory.leave()


@functools.cache
def host_report() -> tuple[dict, list[dict]]:
    """(host facts, devices) as the registration reports them, probed once per start (a first start registers
    twice: as its join token's broker user, then as its own)."""
    host = probe_host()
    host["node_name"] = identity.hostname
    host["data_roots"] = list(identity.data_roots)  # so a job naming a path elsewhere is refused at submit
    host["engines"] = [engine.probe() for engine in configured_engines().values()]
    return host, probe_devices(host)


def join_as(url: str) -> None:
    """Sends the registration as the join token's broker user (``url``), before this node has a user of its own."""
    with app.connection_for_write(url) as connection:
        app.send_task(protocol.REGISTER_NODE, args=registration(*host_report()), queue=protocol.control_queue(),
                      connection=connection, **broker_credentials.PUBLISH_OPTIONS)


def use_own_broker_user(broker_url: str, state_dir: Path) -> None:
    """Connects the worker as this node's own broker user (workers/broker_credentials.py), joining first if it
    has none yet."""
    app.conf.broker_url = broker_credentials.worker_broker_url(
        broker_url, password_path=state_dir / f"{identity.queue}.broker-password", key_id=identity.key.key_id,
        join_token=identity.join_token, send_registration=join_as)


@signals.worker_ready.connect
def _register_and_beat(sender=None, **kwargs) -> None:
    if not identity.queue:
        return
    host, devices = host_report()
    # Work folders of stages a kill cut short (no clean-up runs on SIGKILL) go before any new stage starts.
    for folder in remove_stale():
        logger.warning("removed the work folder %s of a stage that did not end cleanly", folder)
    # Reports the last worker could not send go before the registration, which fails the stage runs the old worker
    # left running: a stage that finished while the broker was away is then taken first and recorded as it ended.
    # Two control processes may take both at once, so the registration also names the runs whose finished reports
    # were kept, and the control plane leaves those to their report.
    finished = finished_runs_kept(identity.outbox)
    held.reported(finished)
    left = identity.outbox.flush(_sender())
    if left:
        logger.warning("%d report(s) from before this start still wait in %s", left, identity.outbox.folder)
    app.send_task(protocol.REGISTER_NODE, args=registration(host, devices, finished),
                  queue=protocol.control_queue(), **broker_credentials.PUBLISH_OPTIONS)
    threading.Thread(target=_heartbeat_loop, name="d0-heartbeat", daemon=True).start()
    logger.info("node %s (key %s) sent its registration to cluster %s; it consumes queue %s", identity.hostname,
                identity.key.key_id, identity.cluster_ref, identity.queue)


@signals.worker_shutting_down.connect
def _leave(**kwargs) -> None:
    if not identity.queue:
        return
    _stop_heartbeat.set()
    try:
        # Best-effort, never kept for later: the next start's registration says more than a late goodbye.
        _sender()(protocol.NODE_LEAVING, identity.key.message(protocol.NODE_LEAVING, []))
    except Exception:  # noqa: BLE001 - shutting down anyway; the heartbeat timeout covers it
        logger.exception("could not tell the control plane that this node leaves")


def import_stage_code() -> None:
    """What the stages run (each declares its ``preload``), imported once before the pool forks: every stage starts
    without paying for its imports, and no stage is cut short (a cancel's SIGTERM) half-way through a first import,
    which leaves a module that cannot be imported again in that process ("cannot load module more than once per
    process" for the next stage there)."""
    for spec in STAGES.values():
        for name in spec.preload:
            importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.node", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", required=True, help="the cluster's join name, <team>/<cluster>")
    parser.add_argument("--broker", default=os.environ.get("D0_BROKER_URL") or os.environ.get("REDIS_URL"),
                        help="broker URL (default: $D0_BROKER_URL or $REDIS_URL)")
    parser.add_argument("--hostname", default=socket.gethostname(), help="node name (default: this host's name)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="stages run at once (default 1: stages use the node's devices exclusively)")
    parser.add_argument("--heartbeat", type=float, default=float(os.environ.get("D0_HEARTBEAT_INTERVAL", 10)),
                        help="seconds between heartbeats")
    parser.add_argument("--address", default=os.environ.get("D0_NODE_ADDRESS"),
                        help="address other nodes reach this one at, for multi-node sharded runs "
                             "(default: what the hostname resolves to)")
    parser.add_argument("--token", default=os.environ.get("D0_JOIN_TOKEN", ""),
                        help="the cluster's join token, needed at the node's first start only (default: "
                             "$D0_JOIN_TOKEN; the environment keeps it out of the process list)")
    parser.add_argument("--control-key", default=os.environ.get("D0_CONTROL_KEY", ""),
                        help="the control plane's public key, as the cluster page's join command shows it; pinned "
                             "in --state-dir at the first start, and a different one refused after (default: "
                             "$D0_CONTROL_KEY)")
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("D0_NODE_STATE_DIR") or Path.home() / ".local/state/d0-node"),
                        help="where the node keeps its private key (default: $D0_NODE_STATE_DIR or "
                             "~/.local/state/d0-node)")
    parser.add_argument("--data-root", action="append", dest="data_roots", metavar="DIR",
                        default=[root for root in os.environ.get("D0_NODE_DATA_ROOTS", "").split(os.pathsep) if root],
                        help="a folder whose files stage parameters may name (e.g. checkpoints); repeat for more "
                             "(default: $D0_NODE_DATA_ROOTS, separated by ':'; none: path parameters are refused)")
    parser.add_argument("--engine", action="append", dest="engines", metavar="NAME=PYTHON",
                        default=os.environ.get("D0_ENGINES", "").split(),
                        help="a serving engine this node offers and its interpreter, e.g. vllm=/opt/vllm/bin/python "
                             "(repeat for more; default: $D0_ENGINES, space-separated)")
    parser.add_argument("--endpoint-allow", default=os.environ.get(endpoint_guard.ALLOW_ENV, ""), metavar="HOSTS",
                        help="hosts or CIDRs an endpoint benchmark may reach although they are loopback, link-local "
                             "or a metadata address, comma-separated (default: $D0_NODE_ENDPOINT_ALLOW; the broker "
                             "is refused whatever is listed)")
    parser.add_argument("--stage-memory", default=os.environ.get(stage_memory.VARIABLE, ""), metavar="SIZE",
                        help="memory each stage's process may take, e.g. 8G, 60%% of the RAM, or off (default: "
                             f"${stage_memory.VARIABLE}, else {stage_memory.DEFAULT_SHARE * 100:.0f}%% of the RAM)")
    parser.add_argument("--loglevel", default="info")
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("no broker: pass --broker redis://HOST:6379/0 or set D0_BROKER_URL")
    team, slash, cluster = args.cluster.partition("/")
    if not (team and slash and cluster) or "/" in cluster:
        parser.error(f"--cluster takes the cluster's join name, <team>/<cluster>, not {args.cluster!r}")
    if args.token:
        try:
            signing.split_join_token(args.token)
        except ValueError as error:
            parser.error(f"--token: {error}")
    if args.address:
        os.environ["D0_NODE_ADDRESS"] = args.address  # read by the probe the registration sends
    try:
        configure(args.broker, args.cluster, args.hostname, args.heartbeat, state_dir=args.state_dir,
                  join_token=args.token, control_key=args.control_key)
    except control_trust.ControlKeyError as error:
        parser.error(f"--control-key: {error}")
    identity.data_roots = tuple(os.path.realpath(root) for root in args.data_roots)
    try:
        parse_engines(args.engines)
    except ValueError as error:
        parser.error(f"--engine: {error}")
    # The serve stage reads the node's engines from here: a job can pick an engine by name, never an interpreter.
    os.environ["D0_ENGINES"] = " ".join(args.engines)
    try:  # what an endpoint benchmark may reach, read by the stage process (its broker is never one)
        os.environ.update(endpoint_guard.node_environment(args.endpoint_allow, args.broker))
    except ValueError as error:
        parser.error(f"--endpoint-allow: {error}")
    try:
        stage_memory.configure(stage_memory.parse_limit(args.stage_memory))
    except ValueError as error:
        parser.error(f"--stage-memory: {error}")
    allow_only(NODE_COMMANDS, {"revoke": control_trust.revoke_is_signed})
    import_stage_code()
    try:
        use_own_broker_user(args.broker, args.state_dir)
    except broker_credentials.NoBrokerUser as error:
        parser.exit(1, f"d0 node: {error}\n")
    app.worker_main([
        "worker",
        "--queues", identity.queue,
        "--hostname", protocol.node_worker_name(identity.queue, args.hostname),
        "--concurrency", str(args.concurrency),
        "--loglevel", args.loglevel,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",  # Celery's worker events are PUBLISHed, which a node's broker user may not do
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
