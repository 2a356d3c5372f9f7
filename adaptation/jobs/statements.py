"""The job state machine's statements on the path every stage takes, written once as SQL (adaptation/jobs/sql.py):
insert a job, lock a job with its cluster, read a cluster's online nodes, insert a stage run, end a run, read a
job's runs, update a job. What they write is the models' own transitions (``StatusTransitions.finished_fields``
and the like); what decides a job's next step stays in ``adaptation.jobs.services``.

Each returns a ``Pending`` answer, so a caller can send several in one batch and read them after."""

from __future__ import annotations

from functools import cache

from django.db import connection

from ..choices import ACTIVE_STATUSES, NodeStatus
from ..models import AdaptationJob, Cluster, Node, StageRun
from .sql import Pending, placeholders, send, table

# A job as the control plane reads it under its lock: without its log and traceback (they only grow).
JOB_READ = tuple(f.attname for f in AdaptationJob._meta.concrete_fields if f.name not in ("log", "error_traceback"))
# What deciding a job's next step reads of its stage runs.
ADVANCE_RUN_FIELDS = ("id", "job_id", "kind", "status", "progress")
# A run as its end leaves it (its result is the caller's; its traceback is not needed again).
ENDED_RUN_FIELDS = tuple(f.attname for f in StageRun._meta.concrete_fields if f.name not in ("result",
                                                                                             "error_traceback"))


CLUSTER_READ = tuple(f.attname for f in Cluster._meta.concrete_fields)
NODE_READ = tuple(f.attname for f in Node._meta.concrete_fields)


# Each statement's SQL is made once per variant (``cache``): only its parameters change from call to call.
@cache
def _job_of_run() -> str:
    runs = table(StageRun)
    return f"(SELECT {runs.column('job_id')} FROM {runs.name} WHERE {runs.column('id')} = %s)"


@cache
def _locked_job_sql(of_run: bool) -> str:
    jobs, clusters = table(AdaptationJob), table(Cluster)
    lock = f" FOR UPDATE OF {jobs.name}" if connection.features.has_select_for_update_of else ""
    return (f"SELECT {jobs.columns(JOB_READ)}, {clusters.columns(CLUSTER_READ)} FROM {jobs.name} "
            f"JOIN {clusters.name} ON {clusters.column('id')} = {jobs.column('cluster_id')} "
            f"WHERE {jobs.column('id')} = {_job_of_run() if of_run else '%s'}{lock}")


def locked_job(job_id: int | None = None, *, of_run: int | None = None) -> Pending:
    """A job (or the job of stage run ``of_run``) with its cluster, its row locked until the transaction ends
    (``FOR UPDATE OF`` the job only: where the database has row locks)."""
    jobs, clusters = table(AdaptationJob), table(Cluster)
    read_job, read_cluster = jobs.reader(JOB_READ), clusters.reader(CLUSTER_READ)

    def read(row):
        job = read_job(row[:len(JOB_READ)])
        job.cluster = read_cluster(row[len(JOB_READ):])
        return job

    return send(_locked_job_sql(of_run is not None), [job_id if of_run is None else of_run], read)


@cache
def _online_nodes_sql(of_job: bool) -> str:
    jobs, nodes = table(AdaptationJob), table(Node)
    which = f"(SELECT {jobs.column('cluster_id')} FROM {jobs.name} WHERE {jobs.column('id')} = %s)" if of_job else "%s"
    return (f"SELECT {nodes.columns(NODE_READ)} FROM {nodes.name} WHERE {nodes.column('cluster_id')} = {which} "
            f"AND {nodes.column('status')} = %s ORDER BY {nodes.column('hostname')}")


def online_nodes(*, cluster_id: int | None = None, of_job: int | None = None) -> Pending:
    """The online nodes of a cluster (or of job ``of_job``'s cluster), by hostname."""
    return send(_online_nodes_sql(of_job is not None), [cluster_id if of_job is None else of_job, NodeStatus.ONLINE],
                table(Node).reader(NODE_READ))


def insert_job(job: AdaptationJob) -> Pending:
    """A new job; its id is set when the answer is read."""
    return table(AdaptationJob).insert(job)


def insert_run(run: StageRun) -> Pending:
    """A new stage run; its id is set when the answer is read."""
    return table(StageRun).insert(run)


@cache
def _runs_of_job_sql(of_run: bool) -> str:
    runs = table(StageRun)
    return (f"SELECT {runs.columns(ADVANCE_RUN_FIELDS)} FROM {runs.name} WHERE {runs.column('job_id')} = "
            f"{_job_of_run() if of_run else '%s'} ORDER BY {runs.column('id')}")


def runs_of_job(job_id: int | None = None, *, of_run: int | None = None) -> Pending:
    """What deciding the next step reads of a job's (or of stage run ``of_run``'s job's) stage runs."""
    return send(_runs_of_job_sql(of_run is not None), [job_id if of_run is None else of_run],
                table(StageRun).reader(ADVANCE_RUN_FIELDS))


def end_run(run_id: int, node_id: int, fields: dict) -> Pending:
    """Write ``fields`` (a run's end) on stage run ``run_id`` if it is assigned to node ``node_id`` and still
    active; the answer is the run as it is now, or None when nothing moved."""
    runs = table(StageRun)
    assignments, params = runs.assignments(fields)
    return send(f"UPDATE {runs.name} SET {assignments} WHERE {runs.column('id')} = %s AND {runs.column('node_id')} = "
                f"%s AND {runs.column('status')} IN ({placeholders(ACTIVE_STATUSES)}) RETURNING "
                f"{runs.columns(ENDED_RUN_FIELDS, qualified=False)}",
                [*params, run_id, node_id, *ACTIVE_STATUSES], runs.reader(ENDED_RUN_FIELDS))


def update_job(job_id: int, status: str, fields: dict) -> Pending:
    """Write ``fields`` on job ``job_id`` if it is still ``status`` (its row is locked by the caller)."""
    jobs = table(AdaptationJob)
    assignments, params = jobs.assignments(fields)
    return send(f"UPDATE {jobs.name} SET {assignments} WHERE {jobs.column('id')} = %s AND {jobs.column('status')} = %s",
                [*params, job_id, status])
