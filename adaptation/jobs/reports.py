"""What the nodes report about their stage runs: started, progress, finished (the result kept as the stage's handler
says, and the job's next step). A node may speak only for the runs assigned to it: a report on any other raises
``Rejected``, which the control task records against the node's cluster (``adaptation.clusters.trust``)."""

from __future__ import annotations

import logging
from datetime import timedelta
from traceback import format_exc

from django.db import transaction
from django.db.models import Avg, F, FloatField, Subquery, Value
from django.db.models.functions import Concat
from django.utils import timezone

from . import sql
from .. import stages as handlers
from ..choices import JobStatus
from ..errors import Rejected
from ..models import AdaptationJob, Node, StageRun
from ..models.jobs import stamped
from . import statements
from .services import advance, fail_job

logger = logging.getLogger(__name__)

REPORTED_RUN_FIELDS = ("job_id", "kind", "node_id", "node_name", "status", "started", "job__stages")


def _assigned_run(stage_run_id, sender: Node) -> StageRun:
    """The stage run a node reports on (what the report needs of it, and its job's stages), if it was assigned to
    that node; ``Rejected`` for any other (a node may speak only for its own work)."""
    known = isinstance(stage_run_id, int)
    run = (StageRun.objects.select_related("job").only(*REPORTED_RUN_FIELDS).filter(pk=stage_run_id).first()
           if known else None)
    if run is None or run.node_id != sender.pk:
        raise Rejected("stage run not assigned to the sender", sender.cluster,
                       f"{sender.hostname} about stage run {stage_run_id!r}")
    return run


def record_stage_started(stage_run_id: int, *, sender: Node, sent_at: float | None = None) -> None:
    """Two UPDATEs on the way every report takes: the run (only if it is the sender's and still queued), then its
    job's log line, the stage's kind read by the same statement. The run is read only when the first one changed
    nothing, to tell a report about someone else's work (rejected) from one that came late (ignored). ``sent_at``:
    the node's signed send time, which its later heartbeats are compared with (``recovery.runs_the_node_let_go``)."""
    started = isinstance(stage_run_id, int) and StageRun.objects.filter(pk=stage_run_id, node_id=sender.pk).start(
        started_on_node=sent_at)
    if not started:
        _assigned_run(stage_run_id, sender)
        return
    run = StageRun.objects.filter(pk=stage_run_id)
    AdaptationJob.objects.filter(pk=Subquery(run.values("job_id"))).update(log=Concat(
        F("log"), Value(stamped("stage ")[:-1]), Subquery(run.values("kind")),
        Value(f" running on {sender.hostname}\n")))


def record_stage_progress(stage_run_id: int, fraction: float, message: str, *, sender: Node) -> None:
    run = _assigned_run(stage_run_id, sender)
    updated = StageRun.objects.filter(pk=run.pk).running_with_progress(min(max(float(fraction), 0.0), 1.0),
                                                                       str(message)[:255])
    if updated:
        # Stages run one after another, so those before this one are done: the job's progress is theirs plus
        # this stage's mean over its runs, folded in by one UPDATE without reading the runs back.
        stages = run.job.stages
        this_stage = Subquery(StageRun.objects.filter(job_id=run.job_id, kind=run.kind).values("kind")
                              .annotate(mean=Avg("progress")).values("mean")[:1], output_field=FloatField())
        AdaptationJob.objects.filter(pk=run.job_id).set_progress(
            (Value(float(stages.index(run.kind))) + this_stage) / Value(float(len(stages))))


def record_stage_finished(stage_run_id: int, ok: bool, result, error: str, traceback: str, *, sender: Node,
                          ran_for: float | None = None) -> None:
    """The stage's end, its result stored and the job's next step, in one transaction: a control worker killed
    half-way commits none of it, and the redelivered report does all of it. ``ran_for``: the seconds the node ran
    the stage, which date its start when no "started" report came (a stage shorter than the node's delay for it).

    Two round trips to PostgreSQL for a job's last stage: the job locked, the run ended (only if it is the sender's
    and still active) and the job's runs read, together; then the job's end (or its next stage) with the COMMIT."""
    if type(stage_run_id) is not int:
        _assigned_run(stage_run_id, sender)  # rejected: a report on someone else's work
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
            # Not the sender's run (rejected), or no longer active: cancelled, or failed by the liveness check; a
            # late report never overwrites that.
            _assigned_run(stage_run_id, sender)
            return
        if job is None or job.status != JobStatus.RUNNING:
            return
        run.job, run.result = job, result if ok else None
        if not ok:
            fail_job(job, f"Stage {run.kind} failed on {run.node_name}: {error}", traceback)
            return
        handler = handlers.handler(run.kind)
        try:
            if handler.stores_results:
                with transaction.atomic():
                    handler.store(run)
        except Exception as problem:  # noqa: BLE001 - a malformed report must end the job, not leave it running
            logger.exception("could not store the result of stage run %s", run.pk)
            fail_job(job, f"Stage {run.kind} on {run.node_name} finished, but its result could not be stored: "
                          f"{type(problem).__name__}: {problem}", format_exc())
            return
        advance(job, runs, [
            f"stage {run.kind} succeeded on {run.node_name} in {run.duration_seconds:.1f}s{_verdict_note(result)}"])


def _verdict_note(result) -> str:
    """An env check's verdict (pass, warn, fail) in the job's log line; other stages' verdicts (a sweep's judgement
    of its pick, an object) are their pages' to show."""
    if not isinstance(result, dict) or not isinstance(result.get("verdict"), str):
        return ""
    worst = [check.get("message") for check in result.get("checks", [])
             if isinstance(check, dict) and check.get("status") == result["verdict"]]
    return f": {result['verdict'].upper()}" + (f" ({worst[0]})" if worst and result["verdict"] != "pass" else "")
