"""Jobs as the pages, the API, the admin and the control-plane tasks see them: submit, cancel, retry, fail; and a
job's next step: each stage dispatched to its nodes (past the pre-flight gate) once the one before it succeeded.

What a stage kind needs of the control plane comes from its handler (``adaptation/stages.py``); nothing here names
a kind. The nodes' reports are taken in ``reports``, the jobs a lost message left behind settled in ``recovery``.
Views and tasks stay thin: they call these functions. Messages to workers are sent only after the transaction that
created their rows commits (NetBox's ``Job.enqueue``), and carry ids, never objects.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from functools import partial

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

from workers import protocol

from . import sql
from .. import control_messages
from ..choices import ACTIVE_STATUSES, JobStatus
from ..errors import Conflict
from ..models import AdaptationJob, Node, StageRun
from ..models.jobs import log_lines, stamped
from . import statements
from .placement import eligible_nodes, preflight_refusals, stage_assignments

logger = logging.getLogger(__name__)


def celery_app():
    from d0web.celery import app

    return app


def _cancel_on_commit(runs: Iterable[StageRun]) -> None:
    """Once the transaction commits, each node running one of ``runs`` is told (a signed revoke to its mailbox,
    ``control_messages.revoke``) to stop them."""
    by_node: dict[int, tuple[Node, list[str]]] = {}
    for run in runs:
        if run.node is not None and run.celery_task_id:
            by_node.setdefault(run.node.pk, (run.node, []))[1].append(run.celery_task_id)
    for node, task_ids in by_node.values():
        transaction.on_commit(partial(_broadcast_revoke, node, task_ids))


def _broadcast_revoke(node: Node, task_ids: list[str]) -> None:
    celery_app().control.broadcast("revoke", **control_messages.revoke(node, task_ids))


def job_rows(user):
    """The user's jobs as the lists show them (without the log, the traceback or the model's config)."""
    return (AdaptationJob.objects.for_user(user)
            .select_related("cluster", "model", "submitted_by")
            .defer("log", "error_traceback", "model__config", "model__analysis"))


# --- submit, cancel, retry, fail ------------------------------------------------------------------------


def submit_job(*, team, user, cluster, stages, model=None, parameters=None, retry_of=None,
               notes=()) -> AdaptationJob:
    """A new job, started with its first stage queued on the cluster's nodes in the transaction that creates it
    (or failed there with the reason: no node online, the pre-flight gate refused them all, the stage cannot be
    placed); the stage's messages go to the nodes once it commits. Whoever submits (a page, the API, a retry)
    dispatches: a hop through the control plane to begin cost a job ~8 ms of its latency and the control worker a
    task (docs/benchmarks/dispatch-vs-floor.md). Inside a caller's transaction the messages wait for its commit.

    Two round trips to PostgreSQL: the cluster's online nodes read and the job inserted together (BEGIN included),
    then the stage runs, the job's start and the COMMIT together (adaptation/jobs/sql.py)."""
    job = AdaptationJob(
        team=team,
        cluster=cluster,
        model=model,
        stages=list(stages),
        parameters=parameters or {},
        submitted_by=user,
        retry_of=retry_of,
        log=stamped(f"submitted by {user} to cluster {cluster.name}: {', '.join(stages)}", *notes),
    )
    # The related rows are instances the caller loaded (scoped to the team): no query to check that they exist.
    job.full_clean(exclude=["team", "cluster", "model", "submitted_by", "retry_of"])
    with sql.ending_in_one_batch():
        with sql.batch():
            online, inserted = statements.online_nodes(cluster_id=cluster.pk), statements.insert_job(job)
            nodes = online.rows()
            inserted.one()
        advance(job, [], ["started"], online=nodes)
    return job


def retry_job(job: AdaptationJob, user) -> AdaptationJob:
    if not job.is_terminal:
        raise Conflict(f"Job {job.pk} is {job.status}; only a finished job can be retried.")
    return submit_job(
        team=job.team,
        cluster=job.cluster,
        model=job.model,
        stages=job.stages,
        parameters=job.parameters,
        user=user,
        retry_of=job,
    )


@transaction.atomic
def cancel_job(job: AdaptationJob, user) -> AdaptationJob:
    if not job.cancel(log=log_lines(f"cancelled by {user}")):
        raise Conflict(f"Job {job.pk} is already {job.status}; only a queued or running job can be cancelled.")
    _stop_stage_runs(job)
    return job


def _stop_stage_runs(job: AdaptationJob, error: str = "") -> None:
    """Cancel every still-active stage run of a job and revoke its node task (killing it if it runs)."""
    runs = StageRun.objects.filter(job=job).active()
    stopped = list(runs.select_related("node").only("celery_task_id", "node"))
    runs.cancel(error=error)
    _cancel_on_commit(stopped)


@transaction.atomic
def fail_job(job: AdaptationJob, error: str, traceback: str = "", notes: Iterable[str] = ()) -> None:
    """Fail a job (if still active) with its reason, and stop its other stage runs."""
    if job.fail(error, traceback, log=log_lines(*notes, f"failed: {error}")):
        _stop_stage_runs(job, error="job failed elsewhere")


@transaction.atomic
def fail_stage_run(run: StageRun, error: str) -> bool:
    """A stage run that will send no result (its node went offline or restarted, its report was lost) fails, and
    its job with it. The job's row is locked before the run's, as on every path that changes both (a report, a
    cancel), so two of them never deadlock."""
    job = statements.locked_job(run.job_id).one()
    if not run.fail(error):
        return False
    if job is not None:
        fail_job(job, error)
    return True


# --- a job's next step ----------------------------------------------------------------------------------


def dispatch_job(job_id: int) -> bool:
    """Start a job left queued (one made outside ``submit_job``, such as in the admin; the reconciler finds it) and
    fan out its first stage, in one transaction: a worker killed half-way leaves the job queued, never started with
    nothing dispatched. False when there was nothing to start (deleted, cancelled, or already started).

    Two round trips to PostgreSQL: the job locked and its cluster's online nodes read together, then the stage
    runs, the job's start and the COMMIT together (adaptation/jobs/sql.py)."""
    with sql.ending_in_one_batch():
        with sql.batch():
            locked, online = statements.locked_job(job_id), statements.online_nodes(of_job=job_id)
            job, nodes = locked.one(), online.rows()
        if job is None or job.status != JobStatus.QUEUED:
            return False
        advance(job, [], ["started"], online=nodes)
        return True


def advance_job(job_id: int, notes: Iterable[str] = ()) -> None:
    """Dispatch the next stage whose predecessors have all succeeded, or finish the job."""
    with sql.ending_in_one_batch():
        with sql.batch():
            locked, runs = statements.locked_job(job_id), statements.runs_of_job(job_id)
            job, runs = locked.one(), runs.rows()
        if job is not None and job.status == JobStatus.RUNNING:
            advance(job, runs, list(notes))


def advance(job: AdaptationJob, runs: list[StageRun], notes: list[str], online: list[Node] | None = None) -> None:
    """The job's next step, with the row locked by the caller: wait for active runs, finish, fail, or queue the
    next stage's runs. The job's own changes (status, progress, the log lines in ``notes``) go in one UPDATE, sent
    with the new runs' INSERTs and the COMMIT (``sql.batch_to_commit``: nothing after it recovers from a database
    error). ``online``: the cluster's online nodes, if the caller read them already."""
    if any(run.status in ACTIVE_STATUSES for run in runs):
        sql.batch_to_commit()
        _save_job(job, notes, progress=_job_progress(job, runs))
        return
    done = {run.kind for run in runs}
    pending = [kind for kind in job.stages if kind not in done]
    if not pending:
        sql.batch_to_commit()
        _save_job(job, [*notes, "succeeded"], **AdaptationJob.finished_fields())
        return
    kind = pending[0]
    nodes = eligible_nodes(job, online)
    if not nodes:
        fail_job(job, f"No online node in cluster '{job.cluster.name}' can run stage {kind}. Start a node worker "
                      f"(see the cluster page) or wait for a node to come back online.", notes=notes)
        return
    refused = preflight_refusals(kind, nodes)
    notes += [f"pre-flight gate: {reason}" for reason in refused.values()]
    nodes = [node for node in nodes if node.pk not in refused]
    if not nodes:
        fail_job(job, f"The pre-flight gate refused every node for stage {kind}: " + "; ".join(refused.values()),
                 notes=notes)
        return
    try:
        assignments = stage_assignments(job, kind, nodes)
    except ValueError as error:
        fail_job(job, f"Stage {kind} cannot be placed: {error}", notes=notes)
        return
    sql.batch_to_commit()
    for node, params in assignments:
        run = StageRun(job=job, kind=kind, node=node, node_name=node.hostname, celery_task_id=str(uuid.uuid4()))
        inserted = statements.insert_run(run)
        runs.append(run)
        notes.append(f"stage {kind} queued on {node.hostname}")
        # The run's id is known once the batch is answered, which the COMMIT waits for.
        transaction.on_commit(partial(_send_run, inserted, kind, params, node, run.celery_task_id))
    _save_job(job, notes, progress=_job_progress(job, runs))


def _send_run(inserted: sql.Pending, kind: str, params: dict, node: Node, task_id: str) -> None:
    send_stage(inserted.one(), kind, params, node, task_id)


def send_stage(run: StageRun, kind: str, params: dict, node: Node, task_id: str) -> None:
    """A committed stage run's message to its node, signed for it with its secrets sealed to it
    (``control_messages``). One the broker would not take (it stayed away past Celery's own retries) would leave
    the run queued with nothing to run it, for ever: its job fails now, with that reason; so does one whose secrets
    cannot be sealed to the node."""
    try:
        message = control_messages.stage_message(run.pk, kind, params, node, task_id)
    except control_messages.Unsealable as problem:
        fail_stage_run(run, f"Stage {kind} could not be sent to {run.node_name}: {problem}.")
        return
    try:
        celery_app().send_task(protocol.RUN_STAGE, args=message, queue=node.queue_name, task_id=task_id)
    except BrokerError as problem:
        logger.warning("stage run %s could not be sent: %s", run.pk, problem)
        fail_stage_run(run, f"Stage {kind} could not be sent to {run.node_name}: the message broker did not take it "
                            f"({problem}). Submit the job again once the broker is back.")


def _save_job(job: AdaptationJob, notes: list[str], **fields) -> None:
    """A queued job starts here (unless ``fields`` end it); a running one takes the new progress and log lines,
    or its end. The row is locked."""
    if job.status == JobStatus.QUEUED:
        fields = {**AdaptationJob.started_fields(), **fields}
    if notes:
        fields["log"] = sql.Appended(stamped(*notes))
    statements.update_job(job.pk, job.status, fields)
    job.status = fields.get("status", job.status)


def _job_progress(job: AdaptationJob, runs: list[StageRun]) -> float:
    """Job progress = mean over its stages of the mean progress of that stage's runs (0 if not yet run)."""
    per_stage = []
    for kind in job.stages:
        fractions = [run.progress for run in runs if run.kind == kind]
        per_stage.append(sum(fractions) / len(fractions) if fractions else 0.0)
    return sum(per_stage) / len(per_stage)
