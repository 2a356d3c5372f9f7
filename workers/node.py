"""The node worker: runs engine stages for one node and reports back over the broker. No Django, no database.

Join a node to a cluster with one command (the cluster page shows it with the right names)::

    python -m workers.node --broker redis://control-plane:6379/0 --cluster my-team/my-cluster

On start the worker registers the node (hostname, host facts, devices) and then sends a heartbeat every
``--heartbeat`` seconds; it consumes only its own queue, so the control plane addresses nodes one by one.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded

from . import protocol
from .engine.envcheck.probe import probe_devices, probe_host
from .engine.stages import run_stage as run_engine_stage

logger = logging.getLogger("d0.node")

# No fixups: Celery's Django fixup would import Django whenever DJANGO_SETTINGS_MODULE is set in the node's env.
app = Celery("d0node", fixups=[])

# Long GPU work: hours, not Celery's defaults. A stage past the soft limit is reported as failed.
STAGE_SOFT_TIME_LIMIT = int(os.environ.get("D0_STAGE_SOFT_TIME_LIMIT", 6 * 3600))
PROGRESS_MIN_INTERVAL = 0.5  # seconds between progress messages, so a chatty stage cannot flood the broker


@dataclass
class Identity:
    cluster_ref: str = ""
    hostname: str = ""
    queue: str = ""
    heartbeat_interval: float = 10.0


identity = Identity()
_stop_heartbeat = threading.Event()


def configure(broker_url: str, cluster_ref: str, hostname: str, heartbeat_interval: float) -> None:
    url, transport_options = protocol.broker_settings(broker_url)
    identity.cluster_ref = cluster_ref
    identity.hostname = hostname
    identity.queue = protocol.node_queue(cluster_ref, hostname)
    identity.heartbeat_interval = heartbeat_interval
    app.conf.update(
        broker_url=url,
        broker_transport_options=transport_options,
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
    )


def report(task_name: str, *args, expires: float | None = None, connection=None) -> None:
    app.send_task(task_name, args=list(args), queue=protocol.control_queue(), expires=expires, connection=connection)


@app.task(name=protocol.RUN_STAGE)
def run_stage(stage_run_id: int, kind: str, params: dict) -> None:
    report(protocol.STAGE_STARTED, stage_run_id)
    last_sent = 0.0

    def progress(fraction: float, message: str) -> None:
        nonlocal last_sent
        now = time.monotonic()
        if now - last_sent >= PROGRESS_MIN_INTERVAL:
            last_sent = now
            report(protocol.STAGE_PROGRESS, stage_run_id, float(fraction), str(message))

    try:
        result = run_engine_stage(kind, params or {}, progress)
    except SoftTimeLimitExceeded:
        report(protocol.STAGE_FINISHED, stage_run_id, False, None,
               f"stage {kind} ran past its time limit ({STAGE_SOFT_TIME_LIMIT}s)", traceback.format_exc())
    except Exception as error:  # noqa: BLE001 - every failure goes back to the job row, with its traceback
        report(protocol.STAGE_FINISHED, stage_run_id, False, None, f"{type(error).__name__}: {error}",
               traceback.format_exc())
    else:
        report(protocol.STAGE_FINISHED, stage_run_id, True, result, "", "")


def _heartbeat_loop() -> None:
    # A connection of its own: the worker's consumer connection is not to be shared with another thread.
    with app.connection_for_write() as connection:
        while not _stop_heartbeat.wait(identity.heartbeat_interval):
            try:
                # Expires: a heartbeat that waited in the broker longer than an interval proves nothing.
                report(protocol.NODE_HEARTBEAT, identity.queue, expires=identity.heartbeat_interval * 2,
                       connection=connection)
            except Exception:  # noqa: BLE001 - a broker blip must not kill the heartbeat thread
                logger.exception("heartbeat failed; retrying in %ss", identity.heartbeat_interval)


@signals.worker_ready.connect
def _register_and_beat(sender=None, **kwargs) -> None:
    if not identity.queue:
        return
    host = probe_host()
    host["node_name"] = identity.hostname
    report(protocol.REGISTER_NODE, identity.cluster_ref, identity.hostname, identity.queue, host, probe_devices(host))
    threading.Thread(target=_heartbeat_loop, name="d0-heartbeat", daemon=True).start()
    logger.info("node %s registered with cluster %s on queue %s", identity.hostname, identity.cluster_ref,
                identity.queue)


@signals.worker_shutting_down.connect
def _leave(**kwargs) -> None:
    if not identity.queue:
        return
    _stop_heartbeat.set()
    try:
        report(protocol.NODE_LEAVING, identity.queue)
    except Exception:  # noqa: BLE001 - shutting down anyway; the heartbeat timeout covers it
        logger.exception("could not tell the control plane that this node leaves")


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
    parser.add_argument("--loglevel", default="info")
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("no broker: pass --broker redis://HOST:6379/0 or set D0_BROKER_URL")
    if args.address:
        os.environ["D0_NODE_ADDRESS"] = args.address  # read by the probe the registration sends
    configure(args.broker, args.cluster, args.hostname, args.heartbeat)
    app.worker_main([
        "worker",
        "--queues", identity.queue,
        "--hostname", f"{identity.queue}@{args.hostname}",
        "--concurrency", str(args.concurrency),
        "--loglevel", args.loglevel,
        "--without-gossip",
        "--without-mingle",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
