"""The remote-control commands a worker answers: only those d0 itself sends.

The broker is shared by every team's nodes, so a broadcast from anyone who can reach it (``shutdown``,
``pool_restart``, ``add_consumer``, ``ping``, ``inspect active_queues``…) must neither stop a worker, reconfigure
it, nor tell who is there. Celery can only switch remote control off as a whole, and cancelling a running stage
needs ``revoke``; so a worker's mailbox drops, without a reply, every command not on its list.
"""

from __future__ import annotations

from celery.worker import pidbox

NODE_COMMANDS = frozenset({"revoke"})  # cancel: revoke(terminate=True) stops the stage that runs
CONTROL_COMMANDS = frozenset({"revoke", "ping"})  # the dispatch task is revoked on cancel; ping for health checks

_original_on_message = pidbox.Pidbox.on_message


def allow_only(commands: frozenset[str]) -> None:
    """From now on this process's workers answer only ``commands`` (the mailbox consumes with no_ack)."""

    def on_message(self, body, message):
        if isinstance(body, dict) and body.get("method") in commands:
            _original_on_message(self, body, message)

    on_message.allowed = commands
    pidbox.Pidbox.on_message = on_message
