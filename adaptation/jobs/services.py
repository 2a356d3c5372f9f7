"""Jobs as the pages, the API, the admin and the control-plane tasks see them: submit, cancel, retry, the whole
adaptation in one job; dispatch of each stage to its nodes (past the pre-flight gate), the nodes' reports of a
stage (started, progress, finished, its result stored by its capability), and no job left behind when a node goes
silent or a report is lost.

Views and tasks stay thin: they call these functions. Messages to workers are sent only after the
transaction that created their rows commits (NetBox's ``Job.enqueue``), and carry ids, never objects.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from traceback import format_exc

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Exists, F, FloatField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from workers import protocol
from workers.engine.sharding.layout import Layout
from workers.engine.stages import STAGES

from .. import sql
from ..choices import ACTIVE_STATUSES, JobStatus, NodeStatus
from ..clusters import services as clusters
from ..clusters import trust
from ..coverage import services as coverage
from ..models import AdaptationJob, Cluster, ModelSpec, Node, StageRun
from ..models.jobs import log_lines, stamped
from ..sharding import services as sharding
from ..serving import services as serving
from ..sweeps import services as sweeps
from . import statements

logger = logging.getLogger(__name__)


class Conflict(Exception):
    """The request is valid but the object's state forbids it (the API answers 409)."""


def celery_app():
    from d0web.celery import app

    return app


def _revoke_on_commit(task_ids: Iterable[str], terminate: bool) -> None:
    ids = [task_id for task_id in task_ids if task_id]
    if ids:
        transaction.on_commit(partial(celery_app().control.revoke, ids, terminate=terminate))


def job_rows(user):
    """The user's jobs as the lists show them (without the log, the traceback or the model's config)."""
    return (AdaptationJob.objects.for_user(user)
            .select_related("cluster", "model", "submitted_by")
            .defer("log", "error_traceback", "model__config", "model__analysis"))


# --- submit, cancel, retry ------------------------------------------------------------------------------


def submit_job(*, team, user, cluster, stages, model=None, parameters=None, retry_of=None,
               notes=()) -> AdaptationJob:
    """A new job, started with its first stage queued on the cluster's nodes in the transaction that creates it
    (or failed there with the reason: no node online, the pre-flight gate refused them all, the stage cannot be
    placed); the stage's messages go to the nodes once it commits. Whoever submits (a page, the API, a retry)
    dispatches: a hop through the control plane to begin cost a job ~8 ms of its latency and the control worker a
    task (docs/benchmarks/dispatch-vs-floor.md). Inside a caller's transaction the messages wait for its commit.

    Two round trips to PostgreSQL: the cluster's online nodes read and the job inserted together (BEGIN included),
    then the stage runs, the job's start and the COMMIT together (adaptation/sql.py)."""
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
        _advance(job, [], ["started"], online=nodes)
    return job


ADAPT_STAGES = ["env_check", "op_coverage", "sharded_run", "sweep"]


def submit_adaptation(*, model: ModelSpec, cluster: Cluster, user) -> AdaptationJob:
    """The whole adaptation in one job: env check, coverage, a sharded validation run, and the tuning sweep."""
    layout, why = sharding.adaptation_layout(model, cluster)
    # A node with a real engine serves the model on it; without one the sweep serves d0's reduced proxy (and its
    # report says so).
    serve = serving.cluster_serves(cluster)
    final = ("serve_sweep", serving.ADAPTATION_SERVE_SWEEP) if serve else ("sweep", sweeps.ADAPTATION_SWEEP)
    method = model.analysis.get("method") if model.analysis else "?"
    return submit_job(team=cluster.team, user=user, cluster=cluster, model=model, stages=[*ADAPT_STAGES[:-1], final[0]],
                      parameters={"op_coverage": {"compile": False}, "sharded_run": layout, final[0]: final[1]},
                      notes=[f"adaptation: model analysed at upload ({method}); sharded run uses {why}"])


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
    _stop_stage_runs(job, JobStatus.CANCELLED)
    # A job an earlier version queued has a dispatch task (this version's submit dispatches itself, and leaves the
    # id empty): bookkeeping that reads the job row, revoked but never killed mid-write.
    _revoke_on_commit([job.celery_task_id], terminate=False)
    return job


def _stop_stage_runs(job: AdaptationJob, status: str, error: str = "") -> None:
    """End every still-active stage run of a job and revoke its node task (killing it if it runs)."""
    runs = StageRun.objects.filter(job=job, status__in=list(ACTIVE_STATUSES))
    task_ids = list(runs.values_list("celery_task_id", flat=True))
    runs.update(status=status, finished=timezone.now(), error=error)
    _revoke_on_commit(task_ids, terminate=True)


@transaction.atomic
def fail_job(job: AdaptationJob, error: str, traceback: str = "", notes: Iterable[str] = ()) -> None:
    """Fail a job (if still active) with its reason, and stop its other stage runs."""
    if job.fail(error, traceback, log=log_lines(*notes, f"failed: {error}")):
        _stop_stage_runs(job, JobStatus.CANCELLED, error="job failed elsewhere")


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


# --- dispatch -------------------------------------------------------------------------------------------


def eligible_nodes(job: AdaptationJob, online: list[Node] | None = None) -> list[Node]:
    """The cluster's online nodes (``online`` if the caller read them already) the job may use."""
    if online is None:
        online = statements.online_nodes(cluster_id=job.cluster_id).rows()
    wanted = job.parameters.get("nodes") if isinstance(job.parameters, dict) else None
    return [node for node in online if node.hostname in wanted] if wanted else online


def dispatch_job(job_id: int) -> bool:
    """Start a job left queued and fan out its first stage, in one transaction (a worker killed half-way leaves the
    job queued for the redelivery or the reconciler, never started with nothing dispatched). ``submit_job`` starts
    its jobs itself; a queued one was submitted by an earlier version of d0, which sent the control plane a dispatch
    message (still taken: protocol.DISPATCH_JOB). False when there was nothing to start (deleted, cancelled, or
    already started).

    Two round trips to PostgreSQL: the job locked and its cluster's online nodes read together, then the stage
    runs, the job's start and the COMMIT together (adaptation/sql.py)."""
    with sql.ending_in_one_batch():
        with sql.batch():
            locked, online = statements.locked_job(job_id), statements.online_nodes(of_job=job_id)
            job, nodes = locked.one(), online.rows()
        if job is None or job.status != JobStatus.QUEUED:
            return False
        _advance(job, [], ["started"], online=nodes)
        return True


def advance_job(job_id: int, notes: Iterable[str] = ()) -> None:
    """Dispatch the next stage whose predecessors have all succeeded, or finish the job."""
    with sql.ending_in_one_batch():
        with sql.batch():
            locked, runs = statements.locked_job(job_id), statements.runs_of_job(job_id)
            job, runs = locked.one(), runs.rows()
        if job is not None and job.status == JobStatus.RUNNING:
            _advance(job, runs, list(notes))


def _advance(job: AdaptationJob, runs: list[StageRun], notes: list[str], online: list[Node] | None = None) -> None:
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
    refused = clusters.preflight_refusals(kind, nodes)
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
        transaction.on_commit(partial(_send_run, inserted, kind, params, node.queue_name, run.celery_task_id))
    _save_job(job, notes, progress=_job_progress(job, runs))


def _send_run(inserted: sql.Pending, kind: str, params: dict, queue: str, task_id: str) -> None:
    _send_stage(inserted.one(), kind, params, queue, task_id)


def _send_stage(run: StageRun, kind: str, params: dict, queue: str, task_id: str) -> None:
    """A committed stage run's message to its node. One the broker would not take (it stayed away past Celery's own
    retries) would leave the run queued with nothing to run it, for ever: its job fails now, with that reason."""
    try:
        celery_app().send_task(protocol.RUN_STAGE, args=[run.pk, kind, params], queue=queue, task_id=task_id)
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


def stage_parameters(job: AdaptationJob, kind: str) -> dict:
    """What a node's stage gets: the job's parameters for that stage (``parameters[kind]``) plus what the control
    plane knows: the cluster's expected device count, the model's config.json."""
    params = dict(job.parameters.get(kind) or {})
    if kind == "env_check":
        params.setdefault("expected_devices_per_node", job.cluster.expected_devices_per_node)
    if STAGES[kind].needs_model:
        params["config"] = job.model.config
    if kind == "op_coverage" and "virtual_backends" in params:
        # Ids of the team's virtual backends become the operator lists the node judges against.
        params["virtual_backend_lists"] = coverage.operator_lists(job.team, params.pop("virtual_backends"))
    if kind == "endpoint_bench":
        # The stored endpoint's address and (decrypted) key go only into the dispatched message, never the job row.
        params.update(serving.endpoint_parameters(job.team, params.get("endpoint")))
    return params


def stage_assignments(job: AdaptationJob, kind: str, nodes: list[Node]) -> list[tuple[Node, dict]]:
    """(node, params) for each stage run of ``kind``: every eligible node, or for a "group" stage (a sharded run)
    ``node_count`` nodes forming one torch.distributed world, rendezvousing on the first one (torchrun's
    env:// method: its address and a port)."""
    params = stage_parameters(job, kind)
    placement = STAGES[kind].placement
    if placement == "one":
        if kind == "sweep" and "hardware" not in params:
            params["hardware"] = sweeps.measured_hardware(nodes[0])
        if kind == "serve_sweep":
            engine = params.get("engine", "vllm")
            serving_nodes = [node for node in nodes if serving.engine_of(node.host_facts or {}, engine)]
            if not serving_nodes:
                raise ValueError(f"no eligible node offers a usable {engine} engine (start a node worker with "
                                 f"--engine {engine}=/path/to/its/python)")
            if "hardware" not in params:
                params["hardware"] = sweeps.measured_hardware(serving_nodes[0])
            return [(serving_nodes[0], params)]
        return [(nodes[0], params)]
    if placement != "group":
        return [(node, params) for node in nodes]
    node_count = int(params.pop("node_count", 1))
    if node_count < 1 or node_count > len(nodes):
        raise ValueError(f"it needs {node_count} node(s) and {len(nodes)} eligible node(s) are online")
    if node_count == 1:
        return [(nodes[0], params)]
    world_size = Layout(**{axis: int(params.get(axis, 1)) for axis in ("tp", "pp", "ep")}).world_size
    if world_size % node_count:
        raise ValueError(f"a world of {world_size} ranks does not split evenly over {node_count} nodes")
    chosen = nodes[:node_count]
    master = chosen[0].host_facts.get("address") or chosen[0].hostname
    rendezvous = {"master_addr": master, "master_port": rendezvous_port(job.pk, kind), "world_size": world_size,
                  "nproc_per_node": world_size // node_count}
    return [(node, {**params, "rendezvous": {**rendezvous, "node_rank": rank}}) for rank, node in enumerate(chosen)]


def rendezvous_port(job_id: int, kind: str) -> int:
    """A group stage's rendezvous port, from a range torchrun users leave alone. The port cannot be checked free
    on a remote node; spread by job id, two concurrent runs (or two control planes on one host) are unlikely to
    meet. The same whenever the stage's messages are made, so a message sent again matches its ranks'."""
    return 20000 + (job_id * 7919 + zlib.crc32(kind.encode())) % 10000


def _job_progress(job: AdaptationJob, runs: list[StageRun]) -> float:
    """Job progress = mean over its stages of the mean progress of that stage's runs (0 if not yet run)."""
    per_stage = []
    for kind in job.stages:
        fractions = [run.progress for run in runs if run.kind == kind]
        per_stage.append(sum(fractions) / len(fractions) if fractions else 0.0)
    return sum(per_stage) / len(per_stage)


# --- what the nodes report ------------------------------------------------------------------------------

# What the control plane does with a stage's result besides keeping it on the stage run, by stage kind.
RESULT_STORES = {"env_check": clusters.store_env_check, "op_coverage": coverage.store_op_coverage}


def _assigned_run(stage_run_id, sender: Node, task: str) -> StageRun | None:
    """The stage run a node reports on (what the report needs of it, and its job's stages), if it was assigned to
    that node; a report on any other is dropped and counted (a node may speak only for its own work)."""
    known = isinstance(stage_run_id, int)
    run = (StageRun.objects.select_related("job").only(*REPORTED_RUN_FIELDS).filter(pk=stage_run_id).first()
           if known else None)
    if run is None or run.node_id != sender.pk:
        trust.record_rejection(task, "stage run not assigned to the sender", sender.cluster,
                               f"{sender.hostname} about stage run {stage_run_id!r}")
        return None
    return run


REPORTED_RUN_FIELDS = ("job_id", "kind", "node_id", "node_name", "status", "started", "job__stages")


def _started_now():
    """``started`` for a report that proves the stage ran: now, unless its "started" report came first (reports
    travel independently, so "progress" can overtake it)."""
    return Coalesce(F("started"), Value(timezone.now()))


def record_stage_started(stage_run_id: int, *, sender: Node) -> None:
    """Two UPDATEs on the way every report takes: the run (only if it is the sender's and still queued), then its
    job's log line, the stage's kind read by the same statement. The run is read only when the first one changed
    nothing, to tell a report about someone else's work (counted) from one that came late (ignored)."""
    started = (isinstance(stage_run_id, int) and StageRun.objects.filter(
        pk=stage_run_id, node_id=sender.pk, status=JobStatus.QUEUED).update(status=JobStatus.RUNNING,
                                                                            started=timezone.now()))
    if not started:
        _assigned_run(stage_run_id, sender, protocol.STAGE_STARTED)
        return
    run = StageRun.objects.filter(pk=stage_run_id)
    AdaptationJob.objects.filter(pk=Subquery(run.values("job_id"))).update(log=Concat(
        F("log"), Value(stamped("stage ")[:-1]), Subquery(run.values("kind")),
        Value(f" running on {sender.hostname}\n")))


def record_stage_progress(stage_run_id: int, fraction: float, message: str, *, sender: Node) -> None:
    run = _assigned_run(stage_run_id, sender, protocol.STAGE_PROGRESS)
    if run is None:
        return
    updated = StageRun.objects.filter(pk=run.pk, status__in=list(ACTIVE_STATUSES)).update(
        status=JobStatus.RUNNING, started=_started_now(), progress=min(max(float(fraction), 0.0), 1.0),
        message=str(message)[:255]
    )
    if updated:
        # Stages run one after another, so those before this one are done: the job's progress is theirs plus
        # this stage's mean over its runs, folded in by one UPDATE without reading the runs back.
        stages = run.job.stages
        this_stage = Subquery(StageRun.objects.filter(job_id=run.job_id, kind=run.kind).values("kind")
                              .annotate(mean=Avg("progress")).values("mean")[:1], output_field=FloatField())
        AdaptationJob.objects.filter(pk=run.job_id, status=JobStatus.RUNNING).update(
            progress=(Value(float(stages.index(run.kind))) + this_stage) / Value(float(len(stages))))


def record_stage_finished(stage_run_id: int, ok: bool, result, error: str, traceback: str, *, sender: Node,
                          ran_for: float | None = None) -> None:
    """The stage's end, its result stored and the job's next step, in one transaction: a control worker killed
    half-way commits none of it, and the redelivered report does all of it. ``ran_for``: the seconds the node ran
    the stage, which date its start when no "started" report came (a stage shorter than the node's delay for it).

    Two round trips to PostgreSQL for a job's last stage: the job locked, the run ended (only if it is the sender's
    and still active) and the job's runs read, together; then the job's end (or its next stage) with the COMMIT."""
    if type(stage_run_id) is not int:
        _assigned_run(stage_run_id, sender, protocol.STAGE_FINISHED)  # counted as a report on someone else's work
        return
    error, traceback = str(error or ""), str(traceback or "")
    began = timezone.now() - timedelta(seconds=ran_for or 0)
    end = (StageRun.finished_fields(result=result, message="done") if ok
           else StageRun.failed_fields(error or "stage failed", traceback))
    end["started"] = sql.IfUnset(began)
    with sql.ending_in_one_batch():
        with sql.batch():
            locked = statements.locked_job(of_run=stage_run_id)
            ended = statements.end_run(stage_run_id, sender.pk, end)
            runs = statements.runs_of_job(of_run=stage_run_id)
            job, run, runs = locked.one(), ended.one(), runs.rows()
        if run is None:
            # Not the sender's run (counted), or no longer active: cancelled, or failed by the node sweep; a late
            # report never overwrites that.
            _assigned_run(stage_run_id, sender, protocol.STAGE_FINISHED)
            return
        if job is None or job.status != JobStatus.RUNNING:
            return
        run.job, run.result = job, result if ok else None
        if not ok:
            fail_job(job, f"Stage {run.kind} failed on {run.node_name}: {error}", traceback)
            return
        try:
            store = RESULT_STORES.get(run.kind)
            if store:
                with transaction.atomic():
                    store(run)
        except Exception as problem:  # noqa: BLE001 - a malformed report must end the job, not leave it running
            logger.exception("could not store the result of stage run %s", run.pk)
            fail_job(job, f"Stage {run.kind} on {run.node_name} finished, but its result could not be stored: "
                          f"{type(problem).__name__}: {problem}", format_exc())
            return
        _advance(job, runs, [
            f"stage {run.kind} succeeded on {run.node_name} in {run.duration_seconds:.1f}s{_verdict_note(result)}"])


def _verdict_note(result) -> str:
    if not isinstance(result, dict) or "verdict" not in result:
        return ""
    worst = [check["message"] for check in result.get("checks", []) if check.get("status") == result["verdict"]]
    return f": {result['verdict'].upper()}" + (f" ({worst[0]})" if worst and result["verdict"] != "pass" else "")


# --- no job left behind ---------------------------------------------------------------------------------


def node_left(node: Node) -> None:
    """A node worker shut down cleanly: offline now, rather than after the heartbeat timeout."""
    _mark_offline(node, "its worker shut down", Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE))


def sweep_stuck_stage_runs() -> int:
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
    """Settle jobs a lost or half-processed message left behind, on every sweep (the beat):

    - a job still *queued* after ``D0_RECONCILE_AFTER`` seconds: its dispatch message was lost (a consumer killed
      holding it) or waits behind a backlog; it is dispatched here, and a late message finds it started;
    - a stage run *queued* that long on an online node running nothing: its message never left (the process that
      committed it died before sending it); it is sent once more, with the same task id (a node runs a task id
      once: workers/delivered.py) and the same parameters;
    - a *running* job with no stage run active for that long: the control worker died between storing a stage's
      end (or the job's start) and dispatching what comes next; a failed stage fails the job with its reason, else
      the job advances (its next stage, or success).

    Every step is a guarded transition or ``advance_job`` under the job's row lock, so a sweep that races the real
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
    transaction.on_commit(partial(_send_stage, run, run.kind, params, run.node.queue_name, run.celery_task_id))
    return True


def sweep_nodes() -> list[str]:
    """Mark nodes offline after missed heartbeats and fail the work they held. Returns their hostnames.

    Only silence the control plane was there to hear counts: while it has listened for less than the timeout (it
    was down, or the broker was away), a node's last heartbeat is old because nobody took the newer ones."""
    timeout = settings.D0_NODE_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=timeout)
    listening_since = clusters.listening_since()
    if listening_since is None or listening_since > cutoff:
        listened = f"since {listening_since:%H:%M:%S} UTC" if listening_since else "not at all lately"
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


@transaction.atomic
def _mark_offline(node: Node, reason: str, guard) -> bool:
    if not guard.update(status=NodeStatus.OFFLINE):
        return False  # a heartbeat arrived in between
    logger.warning("node %s offline: %s", node.hostname, reason)
    for run in StageRun.objects.filter(node=node, status__in=list(ACTIVE_STATUSES)):
        fail_stage_run(run, f"Node {node.hostname} went offline ({reason}) while stage {run.kind} was {run.status}.")
    return True
