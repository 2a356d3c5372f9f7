"""What the control plane and node workers agree on: task names and queue names.

Both sides import this module; it imports nothing from Django so a node needs only the broker.
Tasks cross between the two Celery apps by name (``send_task``), so these strings are the wire protocol.
"""

from __future__ import annotations

import os
import re

# Control-plane tasks (run by the Django-side worker on the control queue; heartbeats on their own queue).
REGISTER_NODE = "d0.control.register_node"
NODE_HEARTBEAT = "d0.control.node_heartbeat"
NODE_LEAVING = "d0.control.node_leaving"
STAGE_STARTED = "d0.control.stage_started"
STAGE_PROGRESS = "d0.control.stage_progress"
STAGE_FINISHED = "d0.control.stage_finished"
CHECK_LIVENESS = "d0.control.check_liveness"
SYNC_BROKER_USERS = "d0.control.sync_broker_users"

# Node-side task (run by the worker on one node's own queue).
RUN_STAGE = "d0.node.run_stage"
# What the control plane signs when it cancels a node's running stages: Celery's remote-control ``revoke``, which a
# node obeys only with that signature in this extra argument (workers/control_trust.py).
CANCEL_STAGE = "d0.node.cancel_stage"
SIGNED_ARGUMENT = "d0_signed"

DEFAULT_CONTROL_QUEUE = "d0.control"

# A registration names the stage runs whose "finished" reports the starting node found kept in its outbox (sent
# just before it), so the control plane does not fail them as cut short by the restart. A node runs a handful of
# stages at once: more than this is no honest outbox, and the registration is refused as malformed.
MAX_FINISHED_RUNS = 500


def control_queue() -> str:
    return os.environ.get("D0_CONTROL_QUEUE", DEFAULT_CONTROL_QUEUE)


def heartbeat_queue() -> str:
    """Node heartbeats' own queue, read by the control worker besides the control queue (kombu's Redis transport
    takes from its queues in turn), so heartbeats never wait behind a backlog of dispatches and reports."""
    return f"{control_queue()}.heartbeat"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-") or "x"


def node_queue(cluster_ref: str, hostname: str) -> str:
    """One queue per node, named from the cluster reference and the node's hostname.

    Both parts are slugged so that a reference like ``team/cluster`` or a hostname with dots gives a name
    every broker accepts, and the queue can be read back by a person looking at the broker.
    """
    parts = [_slug(part) for part in cluster_ref.split("/")]
    return ".".join(["d0", "node", *parts, _slug(hostname)])



def node_worker_name(queue: str, hostname: str) -> str:
    """The Celery worker name of a node (its mailbox's address for a remote-control command)."""
    return f"{queue}@{hostname}"
