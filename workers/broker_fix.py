"""Keeps a worker alive when the Redis broker goes away while one of its messages is unacknowledged.

kombu 5.7's Redis transport (with Celery 5.7) kills the worker in that case: on a lost connection Celery's consumer
first collects the connection (which drops the transport's reference to its client) and then closes it; that close
reaches the channel, which restores its unacknowledged messages through a client made from the transport's client,
now ``None``, and the ``AttributeError`` is not a connection error, so nothing catches it and the worker stops
("Unrecoverable error"). A control worker always has one: with ``acks_late`` every task it runs is unacknowledged
until it ends, and it keeps polling with its free processes. The same error comes back when such a task's
acknowledgement goes out on the old channel. Seen as a broker restart that left a job running for ever (the control
worker was gone, so the node's report waited in the queue); ``tests/test_faults.py`` holds a control task in flight
across a broker restart.

The fix makes that case what it is, a connection error: the channel of a closed connection cannot reach the broker.
Celery then reconnects as for any lost connection; the messages that were in flight stay in the broker's unacked
index and come back after the visibility timeout, which d0's workers already treat as duplicates (a report about a
run that is over is dropped, a node runs a task id once: workers/delivered.py). Imported by both Celery apps
(d0web/celery.py, workers/node.py).
"""

from __future__ import annotations

from kombu.transport import redis as redis_transport
from redis.exceptions import ConnectionError as RedisConnectionError

_connparams = redis_transport.Channel._connparams


def _connparams_of_an_open_connection(self, asynchronous=False):
    if self.connection.client is None:  # the connection was closed (collected) under this channel
        raise RedisConnectionError("the connection to the broker is closed")
    return _connparams(self, asynchronous)


if not getattr(_connparams, "d0_fixed", False):
    _connparams_of_an_open_connection.d0_fixed = True
    redis_transport.Channel._connparams = _connparams_of_an_open_connection
