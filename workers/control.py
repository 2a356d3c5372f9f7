"""Control-plane tasks: thin bridges from broker messages to the control plane's services (``adaptation.jobs`` and
``adaptation.clusters``).

They run in the Django-side worker (``celery -A d0web worker -Q d0.control``). Node workers send the
``STAGE_*`` and ``NODE_*`` messages by name (see workers/protocol.py); nodes never touch the database.
"""

import traceback

from celery import shared_task
from django.core.exceptions import ValidationError

from adaptation.clusters import services as clusters
from adaptation.jobs import services as jobs
from adaptation.models import AdaptationJob

from . import protocol


@shared_task(name=protocol.DISPATCH_JOB)
def dispatch_job(job_id: int) -> None:
    try:
        jobs.dispatch_job(job_id)
    except Exception as error:
        # The job row must end in a terminal state with the reason, never stay "running" with nobody on it.
        job = AdaptationJob.objects.filter(pk=job_id).first()
        if job:
            jobs.fail_job(job, f"The control plane could not dispatch the job: {type(error).__name__}: {error}",
                          traceback.format_exc())
        raise


@shared_task(name=protocol.REGISTER_NODE)
def register_node(cluster_ref: str, hostname: str, queue_name: str, host_facts: dict, devices: list) -> None:
    try:
        clusters.register_node(cluster_ref, hostname, queue_name, host_facts, devices)
    except ValidationError as error:
        # Not retried: a wrong cluster name does not fix itself. The node's log points at the join command.
        clusters.logger.error("node %s could not register: %s", hostname, "; ".join(error.messages))


@shared_task(name=protocol.NODE_HEARTBEAT)
def node_heartbeat(queue_name: str) -> None:
    clusters.record_heartbeat(queue_name)


@shared_task(name=protocol.NODE_LEAVING)
def node_leaving(queue_name: str) -> None:
    jobs.node_left(queue_name)


@shared_task(name=protocol.STAGE_STARTED)
def stage_started(stage_run_id: int) -> None:
    jobs.record_stage_started(stage_run_id)


@shared_task(name=protocol.STAGE_PROGRESS)
def stage_progress(stage_run_id: int, fraction: float, message: str) -> None:
    jobs.record_stage_progress(stage_run_id, fraction, message)


@shared_task(name=protocol.STAGE_FINISHED)
def stage_finished(stage_run_id: int, ok: bool, result, error: str, traceback: str) -> None:
    jobs.record_stage_finished(stage_run_id, ok, result, error, traceback)


@shared_task(name=protocol.SWEEP_NODES)
def sweep_nodes() -> list:
    jobs.sweep_stuck_stage_runs()
    return jobs.sweep_nodes()
