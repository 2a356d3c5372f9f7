"""Node trust on the control plane: join tokens, a node's key bound at its first registration, and every node
message verified before anything in it is applied (``workers/signing.py`` says how messages are signed).

What is checked, in order: the message has the signed shape; its key belongs to a registered node (or, for a
registration, the registration proves a join token of that very cluster, or is signed by the key already bound to
that hostname); the signature covers the exact payload; the payload names the task it was sent as. Registrations,
heartbeats and leaves must also be newer than the last one accepted from the node (a replay is not applied); a
registration must also be younger than ``D0_NODE_MESSAGE_MAX_AGE`` and not signed by a deleted node's key.
Which stage run a report may touch is checked where the report is applied (``jobs.services``). Whatever fails is
dropped, logged and counted per cluster (``RejectedNodeMessage``, shown on the cluster page), never applied.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from workers import broker_credentials, protocol, signing

from ..errors import Rejected, UnknownKey
from ..models import Cluster, JoinToken, Node, RejectedNodeMessage, RetiredNodeKey
from . import broker_users
from .services import register_node

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sender:
    node: Node
    sent_at: float  # the node's clock
    args: list
    ran_for: float | None = None  # a finished stage's seconds on the node (its "started" may never have been sent)


# --- join tokens ------------------------------------------------------------------------------------------


def create_join_token(cluster: Cluster, user, *, hours: float | None = None, description: str = "") -> tuple[
        JoinToken, str]:
    """A new join token for ``cluster`` and the whole token, ``<id>.<secret>``, which is shown this once."""
    token_id, secret = signing.new_join_token()
    hours = settings.D0_JOIN_TOKEN_HOURS if hours is None else hours
    token = JoinToken.objects.create(cluster=cluster, token_id=token_id,
                                     verify_key=signing.token_verify_key(token_id, secret),
                                     broker_password_sha256=broker_credentials.password_sha256(secret),
                                     description=description[:200], created_by=user,
                                     expires=timezone.now() + timedelta(hours=hours))
    broker_users.join_token_made(token)
    return token, f"{token_id}.{secret}"


def revoke_join_token(token: JoinToken) -> bool:
    revoked = bool(JoinToken.objects.filter(pk=token.pk, revoked__isnull=True).update(revoked=timezone.now()))
    if revoked:
        broker_users.join_token_gone(token.token_id)
    return revoked


# --- rejections -------------------------------------------------------------------------------------------


def record_rejection(task: str, reason: str, cluster: Cluster | None = None, detail: str = "") -> None:
    logger.warning("dropped node message %s (%s)%s%s", task, reason, f" for cluster {cluster}" if cluster else "",
                   f": {detail}" if detail else "")
    task, reason, detail = str(task)[:100], reason[:200], detail[:255]
    same = RejectedNodeMessage.objects.filter(cluster=cluster, task=task, reason=reason)
    if not same.update(count=F("count") + 1, last_seen=timezone.now(), detail=detail):
        RejectedNodeMessage.objects.create(cluster=cluster, task=task, reason=reason, detail=detail, count=1)


def _payload(payload: str, task: str, cluster: Cluster | None) -> dict:
    try:
        data = json.loads(payload)
    except ValueError:
        raise Rejected("payload is not JSON", cluster) from None
    if not isinstance(data, dict) or data.get("task") != task:
        raise Rejected("signed for another message kind", cluster)
    if not isinstance(data.get("ts"), (int, float)) or not isinstance(data.get("args", []), list):
        raise Rejected("payload lacks its time or arguments", cluster)
    return data


def _signed_parts(args) -> tuple[str, str, str]:
    if len(args) != 3 or not all(isinstance(part, str) for part in args):
        raise Rejected("not a signed message (an old or foreign node worker?)")
    return args[0], args[1], args[2]


# Only what checking and applying a report needs: a node's host facts can run to kilobytes of JSON, read on every
# message for nothing (its cluster loads on first use, for a rejection).
SENDER_FIELDS = ("id", "cluster_id", "hostname", "status", "public_key", "key_id", "last_signed_ts")


def sender_of(task: str, args) -> Sender:
    """The registered node that signed this message, with its arguments; ``Rejected`` otherwise."""
    key_id, payload, signature = _signed_parts(args)
    node = Node.objects.only(*SENDER_FIELDS).filter(key_id=key_id).order_by().first()
    if node is None:
        raise UnknownKey("signed by a key no node is registered with", detail=f"key {key_id[:32]}")
    try:
        signing.verify(node.public_key, payload, signature)
    except signing.SignatureError:
        raise Rejected("bad signature", node.cluster, detail=f"claimed to be {node.hostname}") from None
    try:
        data = _payload(payload, task, None)
    except Rejected as rejected:
        rejected.cluster = node.cluster
        raise
    return Sender(node=node, sent_at=float(data["ts"]), args=data.get("args", []),
                  ran_for=_seconds(data.get("ran_for")))


def _seconds(value) -> float | None:
    """A duration a node reports: a finite number of seconds, at least 0; anything else is no duration."""
    if type(value) not in (int, float) or not 0 <= value < 10**9:  # NaN fails the comparison too
        return None
    return float(value)


def accept(task: str, args, *, unknown_key_again=None) -> Sender | None:
    """``sender_of``, with a rejection recorded instead of raised. ``unknown_key_again`` (a heartbeat's retry) is
    called instead for a key not registered yet: two control workers may take a node's registration and its first
    heartbeat at once, so the heartbeat is tried again before it counts as forged."""
    try:
        return sender_of(task, args)
    except UnknownKey as rejected:
        if unknown_key_again is not None:
            unknown_key_again()
        record_rejection(task, rejected.reason, rejected.cluster, rejected.detail)
    except Rejected as rejected:
        record_rejection(task, rejected.reason, rejected.cluster, rejected.detail)
    return None


def newest(sender: Sender, task: str) -> bool:
    """Claims the sender's newest-message mark for this message; False (and nothing applied) for a replay or a
    message overtaken by a newer one. Only a clearly old one is counted: two heartbeats may cross on the way."""
    if Node.objects.filter(pk=sender.node.pk, last_signed_ts__lt=sender.sent_at).update(last_signed_ts=sender.sent_at):
        return True
    if sender.sent_at < time.time() - settings.D0_NODE_MESSAGE_MAX_AGE:
        record_rejection(task, "replayed (older than the newest message accepted)", sender.node.cluster,
                         f"from {sender.node.hostname}")
    return False


# --- registration -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """An accepted registration: the node as it is now, when the node signed it, and the stage runs whose finished
    reports it sent just before (the control task settles what the restart cut short)."""

    node: Node
    signed_ts: float
    finished_runs: list[int]


def register(args) -> Registration | None:
    """A node worker's registration: ``[payload, signature, token id, token proof]``. The payload carries the
    cluster's join name, the hostname, host facts, devices, the node's public key and the stage runs whose finished
    reports it sent just before (``finished_runs``), signed by that key. A new
    hostname needs a usable join token of that cluster; a known one only its own key."""
    task = protocol.REGISTER_NODE
    try:
        return _register(*_registration_parts(args))
    except Rejected as rejected:
        record_rejection(task, rejected.reason, rejected.cluster, rejected.detail)
        return None


def _registration_parts(args) -> tuple[str, str, str, str]:
    if len(args) != 4 or not all(isinstance(part, str) for part in args):
        raise Rejected("not a signed registration (an old or foreign node worker?)")
    return args[0], args[1], args[2], args[3]


def _register(payload: str, signature: str, token_id: str, proof: str) -> Registration:
    task = protocol.REGISTER_NODE
    try:
        claim = json.loads(payload)
        public_key, cluster_ref, hostname = claim["public_key"], claim["cluster"], claim["hostname"]
        if not all(isinstance(value, str) and value for value in (public_key, cluster_ref, hostname)):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise Rejected("registration lacks its key, cluster or hostname") from None
    detail = f"{hostname!r} for {cluster_ref!r}"[:255]
    host_facts, devices = claim.get("host_facts") or {}, claim.get("devices") or []
    if not isinstance(host_facts, dict) or not isinstance(devices, list) or not all(
            isinstance(device, dict) and isinstance(device.get("kind"), str) and isinstance(device.get("index"), int)
            for device in devices):
        raise Rejected("registration's host facts or devices are malformed", detail=detail)
    finished_runs = claim.get("finished_runs", [])
    if not isinstance(finished_runs, list) or len(finished_runs) > protocol.MAX_FINISHED_RUNS or not all(
            type(run) is int for run in finished_runs):  # bool is an int subclass: not a stage run id
        raise Rejected("registration's finished runs are malformed", detail=detail)
    sealing_key = _sealing_key(claim, detail)
    try:
        signing.verify(public_key, payload, signature)
    except signing.SignatureError:
        raise Rejected("registration not signed by the key it presents", detail=detail) from None
    cluster = _cluster(cluster_ref, detail)
    data = _payload(payload, task, cluster)
    key_id = signing.key_id(public_key)
    _fresh_and_not_retired(data["ts"], key_id, cluster, detail)
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(cluster=cluster, hostname=hostname).first()
        token = None
        if node is not None and node.key_id == key_id:
            pass  # a known node starting again: its own key is its credential
        elif node is not None and node.key_id:
            raise Rejected("hostname already registered with another key", cluster,
                           f"{detail}; a team admin removes the old node first (Django admin) to re-join it")
        else:
            token = _usable_token(cluster, token_id, payload, proof, detail)
        if node is not None and data["ts"] <= node.last_signed_ts:
            raise Rejected("replayed registration", cluster, detail)
        try:
            node = register_node(cluster, hostname, host_facts, devices, node=node, public_key=public_key,
                                 key_id=key_id, signed_ts=float(data["ts"]), sealing_key=sealing_key)
        except IntegrityError:
            raise Rejected("this key is already bound to another node", cluster, detail) from None
        broker_users.node_registered(node, claim.get("broker_password_sha256"))
        if token is not None:
            JoinToken.objects.filter(pk=token.pk).update(uses=F("uses") + 1, last_used=timezone.now())
            logger.info("node %s joined %s with join token %s", hostname, cluster.join_name, token.token_id)
    return Registration(node, float(data["ts"]), finished_runs)


def _sealing_key(claim: dict, detail: str) -> str:
    """The X25519 key the node's secrets are sealed to (base64); empty from a node worker older than sealing."""
    sealing_key = claim.get("sealing_key", "")
    try:
        if not isinstance(sealing_key, str) or sealing_key and len(base64.b64decode(sealing_key, validate=True)) != 32:
            raise ValueError
    except ValueError:
        raise Rejected("registration's sealing key is malformed", detail=detail) from None
    return sealing_key


def _fresh_and_not_retired(signed_ts: float, key_id: str, cluster: Cluster, detail: str) -> None:
    """A registration is taken only when it was sent lately (a captured one replayed later is not) and its key is
    not a deleted node's (one replayed while its join token is still valid does not bring the node back)."""
    if signed_ts < time.time() - settings.D0_NODE_MESSAGE_MAX_AGE:
        raise Rejected("registration older than D0_NODE_MESSAGE_MAX_AGE", cluster,
                       f"{detail}; if a node of yours sent it (the control plane was away that long), restart it")
    if RetiredNodeKey.objects.filter(key_id=key_id).exists():
        raise Rejected("signed by the key of a deleted node", cluster,
                       f"{detail}; to join again, remove the node's key file in its --state-dir and use a new token")


def _cluster(reference: str, detail: str) -> Cluster:
    team_slug, slash, name = reference.partition("/")
    cluster = Cluster.objects.select_related("team").filter(team__slug=team_slug, name=name).first() if slash else None
    if cluster is None:
        raise Rejected("no such cluster (join names are <team>/<cluster>)", detail=detail)
    return cluster


def _usable_token(cluster: Cluster, token_id: str, payload: str, proof: str, detail: str) -> JoinToken:
    if not token_id:
        raise Rejected("new node without a join token", cluster, detail)
    token = JoinToken.objects.filter(token_id=token_id).first()
    if token is None or not signing.check_token_proof(token.verify_key, payload, proof):
        raise Rejected("join token unknown or its proof is wrong", cluster, detail)
    if token.cluster_id != cluster.pk:
        raise Rejected("join token of another cluster", cluster, detail)
    if not token.usable:
        raise Rejected("join token revoked or expired", cluster, f"{detail}; token {token.token_id}")
    return token
