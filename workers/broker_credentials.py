"""Broker credentials of one node: a Redis/Valkey ACL user per node, made by the control plane, reaching only that
node's own keys and what it must send to the control plane.

Why per-node users: the broker is shared by every node of every team, and one password for all nodes let any node
read, pop or push any queue (another team's stage messages, the heartbeat queue, the unacknowledged data). With an
ACL user per node, the broker itself refuses everything else. Both sides import this module (no Django): the names
and key patterns here are what the node uses and what the control plane grants (``adaptation.clusters.broker_users``).

- A join token ``<id>.<secret>`` is also a broker user ``d0-join-<id>`` whose password is the secret: it may only
  push onto the control queue (write-only: it cannot read what waits there), enough to send the registration.
- At its first start the node makes a random broker password (kept in ``--state-dir``, mode 0600) and sends its
  SHA-256 in the signed registration. The control plane, once it accepts the registration, makes the user
  ``d0-node-<key id>`` with that hash (the broker keeps only the hash) and the rules of ``node_rules``; the node then
  connects as that user, and so does every later start.

What kombu's Redis transport and Celery's worker need of the broker was read off a real server (MONITOR and
``ACL LOG`` while a node joined, ran, acknowledged, was revoked and shut down); the node is configured not to need
more (``celery_settings``): its publishes declare nothing (no writes to the shared ``_kombu.binding.*`` sets of
the control queues), its unacknowledged messages live under its own keys, it sends no Celery events, and its
remote-control queue does not expire (an expiring one runs Lua that reads the shared binding deadlines).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from .private_files import create_private_file

logger = logging.getLogger("d0.node")

JOIN_USER_PREFIX = "d0-join-"
NODE_USER_PREFIX = "d0-node-"
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: queue<sep><priority> holds a queue's prioritised messages
PIDBOX_EXCHANGE = "celery.pidbox"  # Celery's remote-control fanout exchange (control_exchange "celery")

# Commands a node worker sends (kombu 5.7, Celery 5.7, redis-py 8): connecting, consuming its queue (BRPOP), ack
# emulation (its unacked hash, index and mutex; the mutex is released by redis-py's Lua script, which the control
# plane loads: EVALSHA only, never EVAL or SCRIPT LOAD, so no node can run a script of its own, nor block the
# broker with one), declaring and binding its own queue, pushing onto the control queues and listening (never
# publishing) on the remote-control channel. Everything else, KEYS, SCAN, FLUSH*, CONFIG, ACL, PUBLISH, is refused.
NODE_COMMANDS = (
    "+ping", "+hello", "+auth", "+client|setinfo", "+client|setname", "+select", "+quit", "+reset",
    "+brpop", "+lpush", "+rpush", "+llen", "+exists", "+del",
    "+sadd", "+srem", "+set", "+get", "+evalsha",
    "+hset", "+hget", "+hdel", "+zadd", "+zrem", "+zrange",
    "+watch", "+unwatch", "+multi", "+exec", "+discard",
    "+psubscribe", "+punsubscribe", "+subscribe", "+unsubscribe",
)
JOIN_COMMANDS = ("+ping", "+hello", "+auth", "+client|setinfo", "+client|setname", "+select", "+quit", "+reset",
                 "+lpush")


def join_user(token_id: str) -> str:
    return f"{JOIN_USER_PREFIX}{token_id}"


def node_user(key_id: str) -> str:
    return f"{NODE_USER_PREFIX}{key_id}"


def password_sha256(password: str) -> str:
    """What the broker keeps of a password (``ACL SETUSER … #<hex>``), and what a registration carries."""
    return hashlib.sha256(password.encode()).hexdigest()


def unacked_keys(queue: str) -> dict[str, str]:
    """kombu's ack-emulation keys of one node: its own, so no node reads (or restores) another's in-flight
    messages. The control plane has its own (settings.CELERY_BROKER_TRANSPORT_OPTIONS)."""
    return {f"unacked{part}_key": f"{queue}.unacked{part}" for part in ("", "_index", "_mutex")}


def celery_settings(queue: str) -> dict:
    """The node worker's Celery settings that keep it within ``node_rules``."""
    return {
        "broker_transport_options": unacked_keys(queue),
        # An expiring remote-control queue makes kombu refresh and sweep binding deadlines, a set every consumer
        # shares, with Lua; a non-expiring one is bound with two SADDs (removed again at shutdown).
        "control_queue_expires": None,
    }


# Publishing options of every message a node sends: no queue declared (declaring binds, i.e. writes the control
# queue's shared binding set; kombu routes a queue-named message without it).
PUBLISH_OPTIONS = {"declare": []}


def own_keys(queue: str) -> list[str]:
    """Key patterns of one node, read-write: its queue (and the queue's priority lists), its remote-control queue
    (``<queue>@<host>.celery.pidbox``), its unacked data, its queue's binding sets. Queue names are slugs
    (``protocol.node_queue``: ``[a-z0-9_-]`` parts joined by dots), so they hold no glob characters, and no other
    node's queue starts with ``<queue>@``, ``<queue><sep>`` or ``<queue>.unacked``."""
    return [queue, f"{queue}{PRIORITY_SEP}*", f"{queue}@*", *unacked_keys(queue).values(),
            f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]


def node_rules(queue: str, *, control_queue: str, heartbeat_queue: str, pidbox_channel: str) -> list[str]:
    """The ACL rules of a node's user (after ``reset``/``on``/password): full access to its own keys, write-only
    (``%W~``: push, never read or pop) to the control and heartbeat queues and to the remote-control binding sets,
    subscribe-only to the remote-control channel."""
    return ["resetkeys", "resetchannels", "-@all", *NODE_COMMANDS,
            *(f"~{pattern}" for pattern in own_keys(queue)),
            f"%W~{control_queue}", f"%W~{heartbeat_queue}",
            f"%W~_kombu.binding.{PIDBOX_EXCHANGE}", f"%W~_kombu.binding_permanent.{PIDBOX_EXCHANGE}",
            f"&{pidbox_channel}"]


def join_rules(*, control_queue: str) -> list[str]:
    """A join token's user: it pushes the registration onto the control queue, and nothing else."""
    return ["resetkeys", "resetchannels", "-@all", *JOIN_COMMANDS, f"%W~{control_queue}"]


# --- the node's side ----------------------------------------------------------------------------------------


def has_credentials(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.username or parts.password)


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` (no credentials) as ``user``: redis://user:password@host:port/db, and for kombu's unix-socket form
    redis+socket://user:password@/path/to.sock."""
    parts = urlsplit(url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def load_or_create_password(path: Path) -> str:
    """The node's broker password, made at its first start and kept readable by its owner only."""
    if not path.exists():
        create_private_file(path, secrets.token_hex(32).encode())
    return path.read_text().strip()


class BrokerAway(Exception):
    """The broker did not answer at all (not: it refused the credentials)."""


def accepts(url: str, timeout: float = 5.0) -> bool:
    """Whether the broker lets ``url``'s user in (a PING through kombu's own client); ``BrokerAway`` when it does
    not answer."""
    from kombu import Connection
    from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

    # One try: kombu's own retries (three, 2 s apart) spent 6 s on every refused user, which a node start asks up to
    # twice; a broker that is away is retried by the caller (``_retrying``), saying so.
    connection = Connection(url, connect_timeout=timeout, transport_options={"socket_timeout": timeout,
                                                                            "max_retries": 0})
    try:
        connection.default_channel.client.ping()
        return True
    except (AuthenticationError, NoPermissionError):
        return False
    except Exception as error:  # noqa: BLE001 - kombu wraps redis' errors: look at the cause
        cause = error.__cause__ or error.__context__ or error
        if isinstance(cause, (AuthenticationError, NoPermissionError)) or (
                isinstance(cause, ResponseError) and str(cause).startswith(("NOAUTH", "WRONGPASS", "NOPERM"))):
            return False
        raise BrokerAway(str(error)) from error
    finally:
        connection.release()


class NoBrokerUser(Exception):
    """Neither this node's user nor its join token lets it in, and the broker is not open to the URL as given."""


# Set by ``worker_broker_url``: what the registration carries (the control plane makes the node's user from it).
_registered_password_sha256 = ""


def registration_fields() -> dict:
    """The fields the node's registration adds for its broker user (none when it uses a URL with credentials)."""
    return {"broker_password_sha256": _registered_password_sha256} if _registered_password_sha256 else {}


def worker_broker_url(broker_url: str, *, password_path: Path, key_id: str, join_token: str,
                      send_registration: Callable[[str], None], wait: float = 120.0, resend_every: float = 15.0,
                      poll: float = 0.5, accepts=accepts) -> str:
    """The URL the node worker connects with.

    ``broker_url`` with credentials is used as given (an operator's own user). Otherwise: this node's own user when
    the broker knows it (every start after the first); else, with a join token the broker knows, the registration
    is sent as the token's user (``send_registration(url)``) and the node waits until the control plane has made its
    user; else the URL as given when the broker lets anyone in (no per-node users on this broker)."""
    global _registered_password_sha256
    if has_credentials(broker_url):
        return broker_url
    password = load_or_create_password(password_path)
    _registered_password_sha256 = password_sha256(password)
    node_url = with_credentials(broker_url, node_user(key_id), password)
    answers = _retrying(accepts)
    if answers(node_url):
        return node_url
    if join_token:
        token_id, _, secret = join_token.strip().partition(".")
        join_url = with_credentials(broker_url, join_user(token_id), secret)
        if answers(join_url):
            deadline, sent = time.monotonic() + wait, 0.0
            while time.monotonic() < deadline:
                if time.monotonic() - sent >= resend_every:
                    send_registration(join_url)
                    sent = time.monotonic()
                    logger.info("sent the registration as the join token's broker user; waiting for this node's "
                                "own user %s", node_user(key_id))
                time.sleep(poll)
                if answers(node_url):
                    return node_url
            raise NoBrokerUser(f"the control plane made no broker user for this node within {wait:.0f} s: see the "
                               "cluster page's rejected node messages, and check that the control worker runs")
    if answers(broker_url):
        logger.info("the broker lets this node in without a user of its own (no per-node broker users here)")
        return broker_url
    raise NoBrokerUser("the broker knows neither this node's user nor the join token's: start the node with a new "
                       "join token of its cluster (--token or $D0_JOIN_TOKEN) — expired, revoked, or the node was "
                       "removed")


def _retrying(accepts, every: float = 2.0):
    """``accepts`` that waits for a broker that does not answer yet (it is starting, or restarting)."""
    def answers(url: str) -> bool:
        while True:
            try:
                return accepts(url)
            except BrokerAway as error:
                logger.warning("the broker does not answer (%s); trying again in %.0f s", error, every)
                time.sleep(every)
    return answers
