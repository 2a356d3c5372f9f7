"""The remote-control commands a worker answers: only those d0 itself sends, and only as d0 sent them.

The broker is shared by every team's nodes, so a broadcast from anyone who can reach it (``shutdown``,
``pool_restart``, ``add_consumer``, ``ping``, ``inspect active_queues``…) must neither stop a worker, reconfigure
it, nor tell who is there. Celery can only switch remote control off as a whole, and cancelling a running stage
needs ``revoke``; so a worker's mailbox drops, without a reply, every command not on its list, and a command with a
check (a node's ``revoke``: signed by the control plane, workers/control_trust.py) when the check fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from celery.worker import pidbox

NODE_COMMANDS = frozenset({"revoke"})  # cancel: a signed revoke(terminate=True) stops the stage that runs
CONTROL_COMMANDS = frozenset({"ping"})  # health checks; nothing revokes a control-plane task

_original_on_message = pidbox.Pidbox.on_message


def allow_only(commands: frozenset[str], checks: Mapping[str, Callable[[dict], bool]] | None = None) -> None:
    """From now on this process's workers answer only ``commands`` (the mailbox consumes with no_ack), each only
    when its check in ``checks`` (given the command's arguments) passes."""
    checks = dict(checks or {})

    def on_message(self, body, message):
        if not isinstance(body, dict) or body.get("method") not in commands:
            return
        check = checks.get(body["method"])
        arguments = body.get("arguments")
        if check is not None and not (isinstance(arguments, dict) and check(arguments)):
            return
        _original_on_message(self, body, message)

    on_message.allowed = commands
    pidbox.Pidbox.on_message = on_message
