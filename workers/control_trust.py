"""The node's side of control -> node trust: the control plane's public key, pinned when the node joins; every
stage message and cancel checked against it before anything in it is done; secret stage parameters opened with
the node's own sealing key just before the stage runs.

Whoever can reach the broker can push a message into a node's queue or broadcast a ``revoke``. So a stage message
is obeyed only when the pinned key signed it, for this node (its key id), under the task id it arrived with, and
not past its signed expiry; a ``revoke`` only when its extra ``d0_signed`` argument is the control plane's
signature over exactly those task ids, for this node, not past its expiry. What fails is logged and dropped,
unreported: nothing in it can be trusted, not even the stage run it names.

The key is given once (``--control-key`` or ``$D0_CONTROL_KEY``, shown in the cluster page's join command) and
kept in ``<state-dir>/<node queue>/control-key.pub``; a different key given later stops the node from starting,
until its operator removes that file. Imports nothing from Django.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from pathlib import Path

from celery.utils.functional import maybe_list

from . import protocol, sealing, signing
from .private_files import create_private_file
from .engine.stages import secret_parameters

logger = logging.getLogger("d0.node")

PIN_FILE = "control-key.pub"


class ControlKeyError(ValueError):
    """The node cannot start: no control-plane key, a malformed one, or one other than the pinned key."""


@dataclass
class ControlTrust:
    control_key: str = ""  # the pinned public key (base64)
    node_key_id: str = ""
    sealing: sealing.SealingKey | None = None


trust = ControlTrust()


def sealing_key_path(state_dir: Path, queue: str) -> Path:
    return state_dir / f"{queue}.seal"


def pinned_control_key(folder: Path, given: str) -> str:
    """The control plane's public key this node trusts: the one pinned in ``folder``, or ``given`` pinned now.
    ControlKeyError when neither is there, ``given`` is not an Ed25519 public key, or it differs from the pin."""
    given = given.strip()
    if given:
        try:
            if len(base64.b64decode(given, validate=True)) != 32:
                raise ValueError
        except ValueError:
            raise ControlKeyError(f"{given!r} is not a control-plane key (the base64 of an Ed25519 public key, as "
                                  "the cluster page's join command shows it)") from None
    pin = folder / PIN_FILE
    if not pin.exists() and given and create_private_file(pin, (given + "\n").encode()):
        logger.info("pinned the control plane's key %s in %s", signing.key_id(given), pin)
        return given
    if pin.exists():  # pinned before, or by a start racing this one
        pinned = pin.read_text().strip()
        if given and given != pinned:
            raise ControlKeyError(f"the control-plane key given differs from the one this node pinned when it "
                                  f"joined ({pin}): a node obeys only the control plane it joined. If the control "
                                  f"plane's key was really replaced, remove {pin} and start the node again")
        return pinned
    raise ControlKeyError("no control-plane key: pass --control-key (or set $D0_CONTROL_KEY) as the cluster "
                          "page's join command shows it")


def configure(state_dir: Path, queue: str, node_key: signing.NodeKey, given_control_key: str) -> None:
    trust.control_key = pinned_control_key(state_dir / queue, given_control_key)
    trust.node_key_id = node_key.key_id
    trust.sealing = sealing.SealingKey.load_or_create(sealing_key_path(state_dir, queue))


def registration_fields() -> dict:
    """What the node's registration adds for this direction: the key secrets are sealed to."""
    return {"sealing_key": trust.sealing.public_key}


# --- stage messages ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageMessage:
    task_id: str
    stage_run_id: int
    kind: str
    params: dict
    expired: bool  # authentic, but it waited in the queue past its signed expiry


def stage_message(message, task_id: str, log: bool = True) -> StageMessage | None:
    """The stage a ``run_stage`` message asks for, if the control plane signed it for this node under this task
    id; None (logged, unless ``log`` is false: the message is read twice, on arrival and when it runs) otherwise."""
    warn = logger.warning if log else logger.debug
    expired = False
    try:
        data = signing.open_control_message(trust.control_key, list(message), protocol.RUN_STAGE, trust.node_key_id)
    except signing.Expired as error:
        data, expired = error.payload, True
    except (signing.SignatureError, ValueError) as error:
        warn("refused a stage message (task %s): %s", task_id, error)
        return None
    args = data["args"]
    if data.get("id") != task_id:
        # A copy of a real message under another task id would escape a cancel (revoke names task ids).
        warn("refused a stage message: signed for task %s, delivered as task %s", data.get("id"), task_id)
        return None
    if len(args) != 3 or type(args[0]) is not int or not isinstance(args[1], str) or not isinstance(args[2], dict):
        warn("refused a stage message (task %s): malformed arguments", task_id)
        return None
    return StageMessage(task_id, args[0], args[1], args[2], expired)


class StageMessageExpired(ValueError):
    pass


def stage_parameters(stage: StageMessage) -> dict:
    """The stage's parameters with its secret ones opened (sealed to this node, for this stage run), just before
    it runs. StageMessageExpired for a message that waited past its expiry; SealError for a secret that is not
    sealed or does not open here."""
    if stage.expired:
        raise StageMessageExpired("the stage's message waited in the node's queue past its expiry "
                                  "(D0_STAGE_MESSAGE_MAX_AGE on the control plane); submit the job again")
    params = dict(stage.params)
    for name in secret_parameters(stage.kind) if stage.kind else ():
        value = params.get(name)
        if value is None:
            continue
        if not sealing.is_sealed(value):
            raise sealing.SealError(f"the secret parameter {name} was not sealed to this node")
        params[name] = trust.sealing.open(value, sealing.context(stage.stage_run_id, trust.node_key_id, name))
    return params


# --- cancel ------------------------------------------------------------------------------------------------


def revoke_is_signed(arguments: dict) -> bool:
    """Whether a ``revoke`` broadcast carries the control plane's signature over exactly its task ids, terminate
    flag and signal, for this node, not expired. Logged when not."""
    try:
        data = signing.open_control_message(trust.control_key, arguments.get(protocol.SIGNED_ARGUMENT),
                                            protocol.CANCEL_STAGE, trust.node_key_id)
        asked = [sorted(maybe_list(arguments.get("task_id")) or []), arguments.get("terminate", False),
                 arguments.get("signal")]
        if data["args"] != asked:
            raise signing.SignatureError("signed for other tasks")
    except (signing.SignatureError, ValueError, TypeError) as error:
        logger.warning("refused a revoke of %s: %s", arguments.get("task_id"), error)
        return False
    return True
