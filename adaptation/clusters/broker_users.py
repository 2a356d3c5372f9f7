"""The broker's ACL users of a cluster's join tokens and nodes, made and deleted by the control plane
(``workers/broker_credentials.py`` says what each may do, and why).

The database is what is true: a node's row keeps the SHA-256 of its broker password, a join token's row the SHA-256
of its secret, and ``sync`` (the beat, every ``D0_BROKER_USERS_SYNC_INTERVAL`` seconds) makes again any user the
broker lost (a restart forgets users made with ``ACL SETUSER``), deletes the users of tokens that expired, and loads
the one Lua script a node may run (EVALSHA only). A user is made when its row is (a token made, a registration
accepted) and deleted when its row goes (a token revoked or deleted, a node or cluster deleted).

On only when the control plane's own broker user may manage ACL users (``D0_BROKER_NODE_USERS=auto``, the default;
``on`` insists, ``off`` never) and the broker's ``default`` user is not open to anyone: with an open default user
(a development Redis) per-node users would protect nothing.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from kombu import Connection
from redis.lock import Lock

from workers import broker_credentials as credentials
from workers import protocol

from ..errors import Rejected
from ..models import JoinToken, Node

logger = logging.getLogger(__name__)

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_decided: dict[tuple[str, str], bool] = {}
_unanswered: dict[tuple[str, str], float] = {}  # a broker that did not answer: not asked again before then
ASK_AGAIN_AFTER = 10.0  # seconds; what was missed meanwhile, sync makes up for


@contextmanager
def _broker():
    """The control plane's broker client and the remote-control channel's name on it (kombu's, as the nodes'
    workers name it: ``/<db>.celery.pidbox``)."""
    with Connection(settings.CELERY_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
                    connect_timeout=5) as connection:
        # Two quick tries, no back-off: a page or a new token must not wait on a broker that is away.
        connection.ensure_connection(max_retries=1, interval_start=0)
        channel = connection.default_channel
        yield channel.client, f"{channel.keyprefix_fanout}{credentials.PIDBOX_EXCHANGE}"


def enabled() -> bool:
    """Whether this install makes per-node broker users (decided once per process and broker)."""
    mode = settings.D0_BROKER_NODE_USERS
    if mode == "off":
        return False
    if mode == "on":
        return True
    key = (mode, settings.CELERY_BROKER_URL)
    if key not in _decided:
        if time.monotonic() < _unanswered.get(key, 0):
            return False
        try:
            with _broker() as (client, _):
                _decided[key] = _can_manage_users(client)
        except Exception as error:  # noqa: BLE001 - asked again a little later: the broker may be starting
            logger.warning("per-node broker users: cannot ask the broker yet (%s)", error)
            _unanswered[key] = time.monotonic() + ASK_AGAIN_AFTER
            return False
    return _decided[key]


def _can_manage_users(client) -> bool:
    try:
        me = _text(client.execute_command("ACL", "WHOAMI"))
        verdict = _text(client.execute_command("ACL", "DRYRUN", me, "ACL", "SETUSER", "d0-probe"))
        default = client.execute_command("ACL", "GETUSER", "default") or {}
    except Exception as error:  # noqa: BLE001 - an older server, or a user without ACL rights
        logger.warning("per-node broker users are off: the control plane's broker user cannot manage ACL users "
                       "(%s); every node then connects with the broker URL it is given", error)
        return False
    if verdict != "OK":
        logger.warning("per-node broker users are off: the control plane's broker user %s may not run ACL SETUSER "
                       "(%s)", me, verdict)
        return False
    flags = {_text(flag) for flag in (default.get(b"flags") or default.get("flags") or [])}
    if "on" in flags and "nopass" in flags:
        logger.warning("per-node broker users are off: the broker's default user needs no password, so they would "
                       "protect nothing (D0_BROKER_NODE_USERS=on makes them anyway)")
        return False
    logger.info("per-node broker users are on: each node reaches only its own queue on the broker")
    return True


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _set_user(client, name: str, password_sha256: str, rules: list[str]) -> None:
    """``ACL SETUSER name reset on #hash rules…``; a command this server does not know (``client|setinfo`` is Redis
    7.2's) is left out, since nothing of this server can send it."""
    rules = list(rules)
    while True:
        try:
            client.execute_command("ACL", "SETUSER", name, "reset", "on", f"#{password_sha256}", *rules)
            return
        except Exception as error:
            unknown = re.search(r"modifier '([^']+)': Unknown command", str(error))
            if not unknown or unknown.group(1) not in rules:
                raise
            rules.remove(unknown.group(1))


def _node_rules(node: Node, pidbox_channel: str) -> list[str]:
    return credentials.node_rules(node.queue_name, control_queue=protocol.control_queue(),
                                  heartbeat_queue=protocol.heartbeat_queue(), pidbox_channel=pidbox_channel)


def _join_rules() -> list[str]:
    return credentials.join_rules(control_queue=protocol.control_queue())


def _after_commit(action, what: str) -> None:
    """Runs ``action`` against the broker once the rows are committed; a broker that refuses is logged, and
    ``sync`` makes up for it."""
    def run():
        try:
            action()
        except Exception:  # noqa: BLE001 - see above
            logger.exception("broker users: could not %s (sync tries again)", what)
    transaction.on_commit(run)


# --- join tokens ------------------------------------------------------------------------------------------


def join_token_made(token: JoinToken) -> None:
    if not enabled():
        return

    def make():
        with _broker() as (client, _):
            _set_user(client, credentials.join_user(token.token_id), token.broker_password_sha256, _join_rules())
    _after_commit(make, f"make the join user of token {token.token_id}")


def join_token_gone(token_id: str) -> None:
    if enabled():
        _after_commit(lambda: _delete_users([credentials.join_user(token_id)]),
                      f"delete the join user of token {token_id}")


# --- nodes ------------------------------------------------------------------------------------------------


def node_registered(node: Node, password_sha256) -> None:
    """An accepted registration: the node's broker user is made (again) from the password hash it carries, with the
    rules of its queue. Nothing when the registration carries none (a node given a broker URL with credentials)."""
    if password_sha256 is None:
        return
    if not isinstance(password_sha256, str) or not SHA256_HEX.fullmatch(password_sha256):
        raise Rejected("registration's broker password hash is malformed", node.cluster, f"from {node.hostname}")
    if node.broker_password_sha256 != password_sha256:
        Node.objects.filter(pk=node.pk).update(broker_password_sha256=password_sha256)
        node.broker_password_sha256 = password_sha256
    if not enabled():
        return

    def make():
        with _broker() as (client, pidbox_channel):
            _set_user(client, credentials.node_user(node.key_id), password_sha256, _node_rules(node, pidbox_channel))
            _load_scripts(client)
    _after_commit(make, f"make the broker user of node {node.hostname}")


@receiver(post_delete, sender=Node, dispatch_uid="d0-broker-user-of-a-deleted-node")
def _node_deleted(sender, instance: Node, **kwargs) -> None:
    if instance.key_id and enabled():
        _after_commit(lambda: _delete_users([credentials.node_user(instance.key_id)]),
                      f"delete the broker user of node {instance.hostname}")


@receiver(post_delete, sender=JoinToken, dispatch_uid="d0-broker-user-of-a-deleted-join-token")
def _join_token_deleted(sender, instance: JoinToken, **kwargs) -> None:
    join_token_gone(instance.token_id)


def _delete_users(names: list[str]) -> None:
    if names:
        with _broker() as (client, _):
            client.execute_command("ACL", "DELUSER", *names)


def _load_scripts(client) -> None:
    """The scripts a node may run (it may EVALSHA, never load one): redis-py's lock release, which kombu's mutex
    around restoring unacknowledged messages uses. The broker forgets its scripts when it restarts."""
    client.script_load(Lock.LUA_RELEASE_SCRIPT)


# --- keeping the broker in step -------------------------------------------------------------------------------


def sync() -> dict:
    """Makes the users the broker lacks (usable join tokens, registered nodes), deletes the users of join tokens no
    longer usable, and loads the nodes' script. Users of other installs sharing the broker are left alone: only the
    users of this database's tokens and nodes are touched. Returns what it did, by kind."""
    done = {"made": 0, "deleted": 0}
    if not enabled():
        return done
    with _broker() as (client, pidbox_channel):
        existing = {_text(name) for name in client.execute_command("ACL", "USERS")}
        _load_scripts(client)
        tokens = JoinToken.objects.usable().exclude(broker_password_sha256="")
        for token in tokens.only("token_id", "broker_password_sha256"):
            if credentials.join_user(token.token_id) not in existing:
                _set_user(client, credentials.join_user(token.token_id), token.broker_password_sha256, _join_rules())
                done["made"] += 1
        token_ids = [name.removeprefix(credentials.JOIN_USER_PREFIX) for name in existing
                     if name.startswith(credentials.JOIN_USER_PREFIX)]
        usable = set(JoinToken.objects.usable().filter(token_id__in=token_ids).values_list("token_id", flat=True))
        ended = [credentials.join_user(token_id) for token_id in JoinToken.objects.filter(
            token_id__in=token_ids).exclude(token_id__in=usable).values_list("token_id", flat=True)]
        if ended:
            client.execute_command("ACL", "DELUSER", *ended)
            done["deleted"] += len(ended)
        for node in Node.objects.exclude(broker_password_sha256="").exclude(key_id=None).only(
                "key_id", "queue_name", "broker_password_sha256"):
            if credentials.node_user(node.key_id) not in existing:
                _set_user(client, credentials.node_user(node.key_id), node.broker_password_sha256,
                          _node_rules(node, pidbox_channel))
                done["made"] += 1
    if done["made"] or done["deleted"]:
        logger.info("broker users: made %(made)d, deleted %(deleted)d", done)
    return done
