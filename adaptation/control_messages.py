"""Control plane -> node messages: signed with the control plane's key, addressed to one node, secrets sealed to it.

The control plane's Ed25519 key is made at its first use in ``D0_CONTROL_KEY_FILE`` (mode 0600; every control-plane
process must read the same file); nodes pin its public half when they join (the cluster page's join command
carries it) and obey only what it signed for them (``workers/control_trust.py``). A stage message names its node
(key id), its task id and when it expires; a stage's secret parameters (an endpoint's API key) are sealed to that
node's registered sealing key (``workers/sealing.py``), so the broker never holds them in the clear. A cancel is
Celery's ``revoke`` to the node's mailbox with the control plane's signature over its task ids in an extra argument.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from django.conf import settings

from workers import protocol, sealing, signing
from workers.engine.stages import secret_parameters

from .models import Node

logger = logging.getLogger(__name__)

TERMINATE_SIGNAL = "SIGTERM"  # as Celery's own revoke(terminate=True) sends it


@cache
def _key(path: Path) -> signing.ControlKey:
    key, created = signing.ControlKey.load_or_create(path)
    if created:
        logger.warning("made the control plane's key %s in %s: nodes pin it when they join", key.key_id, path)
    return key


def control_key() -> signing.ControlKey:
    return _key(Path(settings.D0_CONTROL_KEY_FILE))


def public_key() -> str:
    """What a joining node is given (``--control-key``)."""
    return control_key().public_key


class Unsealable(ValueError):
    """A secret parameter cannot be sealed to the node (it registered no sealing key)."""


def sealed_parameters(stage_run_id: int, kind: str, params: dict, node: Node) -> dict:
    """``params`` with each secret one sealed to ``node`` for this stage run."""
    secrets = [name for name in secret_parameters(kind) if params.get(name) is not None]
    if secrets and not node.sealing_key:
        raise Unsealable(f"node {node.hostname} registered no sealing key for the stage's secret parameters (its "
                         "node worker is older than this control plane): update it and start it again")
    return {**params, **{name: sealing.seal(node.sealing_key, params[name],
                                            sealing.context(stage_run_id, node.key_id or "", name))
                         for name in secrets}}


def stage_message(stage_run_id: int, kind: str, params: dict, node: Node, task_id: str) -> list[str]:
    """The ``run_stage`` message's arguments: [payload, signature], the payload's ``args`` being
    [stage run id, kind, parameters] with the secret ones sealed. Unsealable when a secret cannot be sealed."""
    return control_key().message(protocol.RUN_STAGE, node.key_id or "",
                                 [stage_run_id, kind, sealed_parameters(stage_run_id, kind, params, node)],
                                 max_age=settings.D0_STAGE_MESSAGE_MAX_AGE, id=task_id, queue=node.queue_name)


def revoke(node: Node, task_ids: list[str]) -> dict:
    """A cancel of ``task_ids`` on ``node``: keyword arguments of ``app.control.broadcast("revoke", ...)`` that
    the node's mailbox obeys (it terminates the stages that run them)."""
    task_ids = sorted(task_ids)
    signed = control_key().message(protocol.CANCEL_STAGE, node.key_id or "", [task_ids, True, TERMINATE_SIGNAL],
                                   max_age=settings.D0_NODE_MESSAGE_MAX_AGE)
    return {"destination": [protocol.node_worker_name(node.queue_name, node.hostname)],
            "arguments": {"task_id": task_ids, "terminate": True, "signal": TERMINATE_SIGNAL,
                          protocol.SIGNED_ARGUMENT: signed}}
