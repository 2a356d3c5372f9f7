"""No job left behind: stage runs on nodes that went silent, shut down or restarted fail with the reason, and so do
runs a live node's heartbeat says it lost or no longer names; runs past the stage timeout fail as lost; jobs a lost
or half-processed message left behind are settled. And the control plane's own liveness: since when it has
listened for heartbeats without a gap (only silence it was there to hear counts against a node), and which control
workers are alive.

The beat runs ``check_liveness`` every ``D0_LIVENESS_INTERVAL`` seconds on one control worker."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from workers import protocol

from ..choices import ACTIVE_STATUSES, JobStatus, NodeStatus
from ..errors import Rejected
from ..models import AdaptationJob, ControlWorker, Node, StageRun
from ..models.jobs import log_lines
from . import statements
from .placement import stage_assignments
from .services import advance_job, dispatch_job, fail_job, fail_stage_run, send_stage

logger = logging.getLogger(__name__)


# --- the control plane's own liveness --------------------------------------------------------------------


def _heard_since(workers, now):
    """Since when the control plane has run the liveness check without a gap, as the latest check among
    ``workers`` recorded it; None when that check is older than the beat's schedule and a busy worker explain (or
    there is none): the control plane was down or could not reach the broker, and heartbeats sent meanwhile went
    unheard."""
    latest = workers.order_by("-last_seen").only("last_seen", "listening_since").first()
    if latest is None or now - latest.last_seen > timedelta(seconds=2 * settings.D0_LIVENESS_INTERVAL + 5):
        return None
    return latest.listening_since


@transaction.atomic
def control_worker_seen(name: str) -> None:
    """``name`` runs the liveness check now; the control plane has listened since the latest check's record, or
    starts now after a gap. Measured across control workers, not per worker: the beat sends each check to one of
    them, so a worker may go several intervals without one while another hears every heartbeat."""
    now = timezone.now()
    # The latest row locked, so two checks taken at once after a gap agree on when listening started.
    since = _heard_since(ControlWorker.objects.select_for_update(), now) or now
    ControlWorker.objects.update_or_create(name=name[:255], defaults={"last_seen": now, "listening_since": since})


def listening_since():
    """Since when the control plane has been hearing node heartbeats without a gap; None when nobody listens."""
    return _heard_since(ControlWorker.objects, timezone.now())


def live_workers(user) -> dict:
    """Control-plane workers that ran the liveness check lately, and the user's teams' online nodes: health from
    the state heartbeats keep, not from a broadcast to every worker on the broker."""
    recent = timezone.now() - timedelta(seconds=3 * settings.D0_LIVENESS_INTERVAL + 5)
    return {"control": ControlWorker.objects.filter(last_seen__gte=recent).count(),
            "node": Node.objects.for_user(user).filter(status=NodeStatus.ONLINE).count()}


# --- nodes that went away --------------------------------------------------------------------------------


def check_liveness(worker: str = "control") -> list[str]:
    """The beat's periodic check, on one control worker: it records that the control plane listens, fails stage runs
    past the stage timeout, settles jobs a lost message left behind, and marks silent nodes offline. Returns the
    hostnames of the nodes it marked offline."""
    control_worker_seen(worker)
    fail_overdue_stage_runs()
    reconcile_jobs()
    return mark_silent_nodes_offline()


def mark_silent_nodes_offline() -> list[str]:
    """Mark nodes offline after missed heartbeats and fail the work they held. Returns their hostnames.

    Only silence the control plane was there to hear counts: while it has listened for less than the timeout (it
    was down, or the broker was away), a node's last heartbeat is old because nobody took the newer ones."""
    timeout = settings.D0_NODE_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=timeout)
    since = listening_since()
    if since is None or since > cutoff:
        listened = f"since {since:%H:%M:%S} UTC" if since else "not at all lately"
        logger.info("no node marked offline: the control plane has listened for heartbeats %s, less than the node "
                    "timeout (%gs)", listened, timeout)
        return []
    stale = Node.objects.filter(status__in=[NodeStatus.ONLINE, NodeStatus.DRAINING], last_heartbeat__lt=cutoff)
    gone = []
    for node in stale:
        reason = f"no heartbeat since {node.last_heartbeat:%Y-%m-%d %H:%M:%S} UTC (timeout {timeout:g}s)"
        guard = Node.objects.filter(pk=node.pk, last_heartbeat__lt=cutoff, status=node.status)
        if _mark_offline(node, reason, guard):
            gone.append(node.hostname)
    return gone


def node_left(node: Node) -> None:
    """A node worker shut down cleanly: offline now, rather than after the heartbeat timeout."""
    _mark_offline(node, "its worker shut down", Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE))


@transaction.atomic
def _mark_offline(node: Node, reason: str, guard) -> bool:
    if not guard.go_offline():
        return False  # a heartbeat arrived in between
    logger.warning("node %s offline: %s", node.hostname, reason)
    for run in StageRun.objects.filter(node=node).active():
        fail_stage_run(run, f"Node {node.hostname} went offline ({reason}) while stage {run.kind} was {run.status}.")
    return True


def node_registered(node: Node, registered_ts: float, finished_runs: list[int] = ()) -> int:
    """A node registers when its worker starts: a stage it was running before (started before this registration
    was sent) ended with the old worker process and will send no result, so it fails now with that reason instead
    of staying "running" until the stage timeout. Stages queued for it stay: their messages wait in its queue.
    So do ``finished_runs``: their finished reports, kept in the node's outbox, were sent just before this
    registration, and another control process may be storing one right now. Returns how many runs failed."""
    before = datetime.fromtimestamp(registered_ts, tz=UTC)
    failed = 0
    running = StageRun.objects.filter(node=node, status=JobStatus.RUNNING, started__lt=before)
    for run in running.exclude(pk__in=list(finished_runs)):
        failed += fail_stage_run(run, f"Node {node.hostname} restarted while stage {run.kind} was running: the "
                                      "worker process that ran it ended, so no result will come.")
    return failed


# --- stages a live node no longer runs -------------------------------------------------------------------


@dataclass(frozen=True)
class HeldRuns:
    """A heartbeat's account of the stage runs its node worker holds (``workers/stage_runs.py``): taken at
    ``as_of`` (the node's clock), every ``interval`` seconds; ``named``: running there or ended lately (a finished
    report may still be on its way); ``lost``: ended without a report, with why."""

    as_of: float
    interval: float
    named: frozenset[int]
    lost: dict[int, str]


def held_runs(args) -> HeldRuns | None:
    """The account in a heartbeat's arguments; None from a node worker that sends none (an older one: its runs are
    left to the node timeout and the stage timeout). ``Rejected`` when it is malformed."""
    if not args:
        return None
    beat = args[0] if len(args) == 1 else None
    if not isinstance(beat, dict):
        raise Rejected("heartbeat's stage runs are malformed")
    as_of, interval = beat.get("as_of"), beat.get("interval")
    running, ended, lost = beat.get("running"), beat.get("ended"), beat.get("lost")
    limit = 2 * protocol.MAX_FINISHED_RUNS
    if (type(as_of) not in (int, float) or type(interval) not in (int, float) or not 0 < interval < 86400
            or not math.isfinite(as_of)
            or not all(isinstance(runs, list) and len(runs) <= limit for runs in (running, ended, lost))
            or not all(type(run) is int for run in (*running, *ended))
            or not all(isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int
                       and isinstance(entry[1], str) for entry in lost)):
        raise Rejected("heartbeat's stage runs are malformed")
    return HeldRuns(float(as_of), float(interval), frozenset((*running, *ended)),
                    {run: why[:200] for run, why in lost})


def runs_the_node_let_go(node: Node, args) -> int:
    """A heartbeat names the stage runs its node holds: a run the control plane has as running there fails now when
    the node says its process died (killed by the OOM killer, a revoke, the hard time limit: it sends no result), or
    when the node no longer names it at all, though it took this account at least one heartbeat interval after it
    sent the run's "started" report (so the run had reached it: a run dispatched and not started yet, or started
    just after the account was taken, is left alone; both times are the node's clock). Returns how many failed."""
    account = held_runs(args)
    if account is None:
        return 0
    failed = 0
    for run in StageRun.objects.filter(node=node, status=JobStatus.RUNNING).only("id", "job_id", "kind",
                                                                                   "started_on_node"):
        if run.pk in account.lost:
            why = account.lost[run.pk]
        elif (run.pk not in account.named and run.started_on_node is not None
              and account.as_of >= run.started_on_node + account.interval):
            why = "its node worker no longer runs it and no result came"
        else:
            continue
        failed += fail_stage_run(run, f"Stage {run.kind} on {node.hostname} was lost on the node: {why}.")
    return failed


# --- lost messages ---------------------------------------------------------------------------------------


def fail_overdue_stage_runs() -> int:
    """Fail stage runs that have been running longer than any stage may (their report was lost: a broker
    restart, a worker killed between two messages). Returns how many were failed."""
    limit = settings.D0_STAGE_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=limit)
    failed = 0
    for run in StageRun.objects.filter(status=JobStatus.RUNNING, started__lt=cutoff):
        failed += fail_stage_run(run, f"Stage {run.kind} on {run.node_name} sent no result within {limit:g}s; its "
                                      "report was lost.")
    return failed


def reconcile_jobs() -> dict[str, int]:
    """Settle jobs a lost or half-processed message left behind:

    - a job still *queued* after ``D0_RECONCILE_AFTER`` seconds: nothing dispatched it (it was made outside a
      submit, or the submitting process died); it is dispatched here;
    - a stage run *queued* that long on an online node running nothing: its message never left (the process that
      committed it died before sending it); it is sent once more, with the same task id (a node runs a task id
      once: workers/delivered.py) and the same parameters;
    - a *running* job with no stage run active for that long: the control worker died between storing a stage's
      end (or the job's start) and dispatching what comes next; a failed stage fails the job with its reason, else
      the job advances (its next stage, or success).

    Every step is a guarded transition or ``advance_job`` under the job's row lock, so a check that races the real
    message does the work once. Returns how many jobs of each kind were settled."""
    cutoff = timezone.now() - timedelta(seconds=settings.D0_RECONCILE_AFTER)
    settled = {"dispatched": 0, "resent": 0, "advanced": 0, "failed": 0}
    for job_id in AdaptationJob.objects.filter(status=JobStatus.QUEUED, created__lt=cutoff).values_list("pk",
                                                                                                       flat=True):
        settled["dispatched"] += dispatch_job(job_id)
    for run in _runs_that_lost_their_message(cutoff):
        settled["resent"] += _send_again(run)
    running = AdaptationJob.objects.filter(status=JobStatus.RUNNING, started__lt=cutoff).exclude(
        stage_runs__status__in=list(ACTIVE_STATUSES))
    for job in running.distinct():
        runs = list(job.stage_runs.all())
        if any(run.finished and run.finished >= cutoff for run in runs):
            continue  # its report is being processed right now
        broken = next((run for run in runs if run.status in (JobStatus.FAILED, JobStatus.CANCELLED)), None)
        if broken is not None:
            fail_job(job, broken.error or f"Stage {broken.kind} on {broken.node_name} {broken.status}.")
            settled["failed"] += 1
        else:
            advance_job(job.pk, ["reconciled: no stage was active, the job goes on"])
            settled["advanced"] += 1
    if any(settled.values()):
        logger.warning("reconciled jobs: %s", settled)
    return settled


RESENT = "its message sent again: queued on an idle node past the reconcile delay"


def _runs_that_lost_their_message(cutoff):
    """Stage runs queued since before ``cutoff``, not sent again yet, of a running job, on an online node that runs
    no stage: a node consumes its queue in order, so an idle one holds no message for them."""
    busy = StageRun.objects.filter(node=OuterRef("node"), status=JobStatus.RUNNING)
    return (StageRun.objects.filter(status=JobStatus.QUEUED, created__lt=cutoff, job__status=JobStatus.RUNNING,
                                    node__status=NodeStatus.ONLINE, message="")
            .exclude(Exists(busy)).select_related("node"))


@transaction.atomic
def _send_again(run: StageRun) -> bool:
    """Send a queued stage run's message once more, its parameters made again as its dispatch made them (a group
    stage's ranks from its runs' nodes in order, its rendezvous port from the job). The job's row is locked first,
    as on every path that changes a job's runs."""
    job = statements.locked_job(run.job_id).one()
    if job is None or job.status != JobStatus.RUNNING:
        return False
    if not StageRun.objects.filter(pk=run.pk, status=JobStatus.QUEUED, message="").update(message=RESENT):
        return False
    siblings = [other.node for other in StageRun.objects.filter(job_id=job.pk, kind=run.kind).select_related("node")
                .order_by("id") if other.node is not None]
    try:
        params = next(params for node, params in stage_assignments(job, run.kind, siblings) if node.pk == run.node_id)
    except (ValueError, StopIteration) as problem:
        fail_stage_run(run, f"Stage {run.kind} on {run.node_name} was never received and cannot be sent again: "
                            f"{problem or 'its node is no longer in the stage placement'}.")
        return False
    AdaptationJob.objects.filter(pk=job.pk).update(log=log_lines(
        f"stage {run.kind} on {run.node_name}: queued past {settings.D0_RECONCILE_AFTER:g}s on an idle node, its "
        "message sent again"))
    transaction.on_commit(partial(send_stage, run, run.kind, params, run.node, run.celery_task_id))
    return True
