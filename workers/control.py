"""Control-plane tasks: thin bridges from broker messages to the control plane's services (``adaptation.jobs`` and
``adaptation.clusters``).

They run in the Django-side worker (``celery -A d0web worker -Q d0.control``). Node workers send the
``STAGE_*`` and ``NODE_*`` messages by name (see workers/protocol.py), each signed with the node's own key
(workers/signing.py); ``adaptation.clusters.trust`` checks who sent a message before anything in it is applied,
and drops and counts what it cannot trust. Nodes never touch the database.
"""

from celery import shared_task
from django.db import InterfaceError, OperationalError

from adaptation.clusters import broker_users
from adaptation.clusters import services as clusters
from adaptation.clusters import trust
from adaptation.errors import Rejected
from adaptation.jobs import recovery, reports

from . import protocol

# A task that loses the database (PostgreSQL restarting or failing over, a connection cut, a deadlock) is tried
# again with back-off (up to 30 times, at most 30 s apart: minutes) rather than failed: a failed task's message is
# acknowledged and gone, and a node's report has already left the node, so the job would wait for the stage timeout
# (hours). Each of these tasks is idempotent (guarded transitions, one transaction each). Heartbeats, progress
# reports and the liveness check are not retried: the next one says more.
DATABASE_LOST = (OperationalError, InterfaceError)
RETRIED_WHILE_THE_DATABASE_IS_AWAY = {"autoretry_for": DATABASE_LOST, "retry_backoff": 1, "retry_backoff_max": 30,
                                      "retry_jitter": True, "max_retries": 30}


@shared_task(name=protocol.REGISTER_NODE, **RETRIED_WHILE_THE_DATABASE_IS_AWAY)
def register_node(*message) -> None:
    registration = trust.register(message)
    if registration is not None:
        recovery.node_registered(registration.node, registration.signed_ts, registration.finished_runs)


@shared_task(name=protocol.NODE_HEARTBEAT, bind=True, max_retries=2)
def node_heartbeat(self, *message) -> None:
    def again():
        if self.request.retries < self.max_retries:
            raise self.retry(countdown=1)  # Retry is an exception: nothing is recorded this time

    sender = trust.accept(protocol.NODE_HEARTBEAT, message, unknown_key_again=again)
    if sender and trust.newest(sender, protocol.NODE_HEARTBEAT):
        clusters.record_heartbeat(sender.node)
        try:
            recovery.runs_the_node_let_go(sender.node, sender.args)
        except Rejected as rejected:
            trust.record_rejection(protocol.NODE_HEARTBEAT, rejected.reason, sender.node.cluster,
                                   f"from {sender.node.hostname}")


@shared_task(name=protocol.NODE_LEAVING, **RETRIED_WHILE_THE_DATABASE_IS_AWAY)
def node_leaving(*message) -> None:
    sender = trust.accept(protocol.NODE_LEAVING, message)
    if sender and trust.newest(sender, protocol.NODE_LEAVING):
        recovery.node_left(sender.node)


def _report(task: str, message, apply, arity: int, *, with_duration: bool = False, with_send_time: bool = False
            ) -> None:
    sender = trust.accept(task, message)
    if sender is None:
        return
    if len(sender.args) != arity:
        trust.record_rejection(task, f"takes {arity} arguments, not {len(sender.args)}", sender.node.cluster,
                               f"from {sender.node.hostname}")
        return
    signed = {"ran_for": sender.ran_for} if with_duration else {}  # the signed seconds a finished stage ran
    if with_send_time:
        signed["sent_at"] = sender.sent_at  # the node's clock, which its heartbeats are compared with
    try:
        apply(*sender.args, sender=sender.node, **signed)
    except Rejected as rejected:  # a report about a stage run that is not the sender's
        trust.record_rejection(task, rejected.reason, rejected.cluster, rejected.detail)


@shared_task(name=protocol.STAGE_STARTED, **RETRIED_WHILE_THE_DATABASE_IS_AWAY)
def stage_started(*message) -> None:
    _report(protocol.STAGE_STARTED, message, reports.record_stage_started, 1, with_send_time=True)


@shared_task(name=protocol.STAGE_PROGRESS)
def stage_progress(*message) -> None:
    _report(protocol.STAGE_PROGRESS, message, reports.record_stage_progress, 3)


@shared_task(name=protocol.STAGE_FINISHED, **RETRIED_WHILE_THE_DATABASE_IS_AWAY)
def stage_finished(*message) -> None:
    _report(protocol.STAGE_FINISHED, message, reports.record_stage_finished, 5, with_duration=True)


@shared_task(name=protocol.CHECK_LIVENESS, bind=True)
def check_liveness(self) -> list:
    return recovery.check_liveness(self.request.hostname or "control")


@shared_task(name=protocol.SYNC_BROKER_USERS)
def sync_broker_users() -> dict:
    return broker_users.sync()
