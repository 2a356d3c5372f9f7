"""The control plane's hand-written statements (adaptation/jobs/sql.py, adaptation/jobs/statements.py): rows read as the
ORM reads them, a transaction's last writes sent with its COMMIT on PostgreSQL, and a failure there rolling all of
it back. (On SQLite the same statements run one by one: tests/test_zero_setup.py runs jobs through them there.)"""

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from adaptation.jobs import sql
from adaptation.jobs import statements
from adaptation.models import AdaptationJob, Node, StageRun

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="pipeline mode is PostgreSQL's")


def test_a_locked_job_its_nodes_and_its_runs_read_as_the_orm_reads_them(job, node):
    job.parameters = {"env_check": {"measure_seconds": 0.5}, "nodes": [node.hostname]}
    job.save()
    StageRun.objects.filter(job=job).update(progress=0.25)
    with transaction.atomic(), sql.batch():
        locked, online, runs = (statements.locked_job(job.pk), statements.online_nodes(of_job=job.pk),
                                statements.runs_of_job(job.pk))
        read, nodes, runs = locked.one(), online.rows(), runs.rows()
    orm = AdaptationJob.objects.select_related("cluster").get(pk=job.pk)
    for name in statements.JOB_READ:
        assert getattr(read, name) == getattr(orm, name), name
    assert read.get_deferred_fields() == {"log", "error_traceback"}
    assert (read.cluster.pk, read.cluster.name) == (orm.cluster.pk, orm.cluster.name)
    assert [(n.pk, n.host_facts, n.last_heartbeat) for n in nodes] == [
        (n.pk, n.host_facts, n.last_heartbeat) for n in Node.objects.filter(pk=node.pk)]
    assert [(r.kind, r.status, r.progress, r.job_id) for r in runs] == [("env_probe", "queued", 0.25, job.pk)]
    assert statements.locked_job(job.pk + 1000).one() is None


@pytest.mark.django_db(transaction=True)
def test_a_transactions_last_writes_go_in_one_batch_with_its_commit(job, node):
    sent = []
    with sql.ending_in_one_batch():
        statements.locked_job(job.pk).one()
        sql.batch_to_commit()
        # Pipeline mode: these are sent, and answered only when the COMMIT's batch is.
        assert connection.connection.pgconn.pipeline_status == psycopg.pq.PipelineStatus.ON
        run = StageRun(job=job, kind="env_probe", node=node, node_name=node.hostname)
        inserted = statements.insert_run(run)
        statements.update_job(job.pk, "queued", AdaptationJob.started_fields(log=sql.Appended("went\n")))
        transaction.on_commit(lambda: sent.append(inserted.one().pk))
    assert connection.connection.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    job.refresh_from_db()
    assert (job.status, job.log.endswith("went\n"), job.started is not None) == ("running", True, True)
    assert sent == [run.pk] == [job.stage_runs.latest("id").pk]  # beside the job fixture's run


@pytest.mark.django_db(transaction=True)
def test_a_failure_in_the_last_batch_rolls_the_whole_transaction_back_and_the_connection_goes_on(job, node):
    sent = []
    with pytest.raises(IntegrityError), sql.ending_in_one_batch():
        statements.update_job(job.pk, "queued", AdaptationJob.started_fields())
        sql.batch_to_commit()
        # A stage run of a job that does not exist: the foreign key is checked at COMMIT (deferred).
        statements.insert_run(StageRun(job_id=job.pk + 1000, kind="env_probe", node=node, node_name="x"))
        transaction.on_commit(lambda: sent.append("sent"))
    assert connection.connection.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    job.refresh_from_db()
    assert (job.status, StageRun.objects.count(), sent) == ("queued", 1, [])  # the job fixture's one run
    assert AdaptationJob.objects.filter(pk=job.pk).exists()  # the connection still works


def test_a_run_ends_only_for_the_node_it_is_assigned_to_and_only_once(job, node, cluster):
    other = Node.objects.create(cluster=cluster, hostname="other", queue_name="q-other")
    run = job.stage_runs.get()
    run.start()
    end = {**StageRun.finished_fields(result={"ok": True}), "started": sql.IfUnset(run.created)}
    assert statements.end_run(run.pk, other.pk, end).one() is None
    ended = statements.end_run(run.pk, node.pk, end).one()
    assert (ended.pk, ended.status, ended.progress, ended.started is not None) == (run.pk, "succeeded", 1.0, True)
    assert statements.end_run(run.pk, node.pk, end).one() is None
    run.refresh_from_db()
    assert run.result == {"ok": True}
