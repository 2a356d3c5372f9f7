"""Domain operations shared by the pages, the API, the admin and the control-plane tasks.

Views and tasks stay thin: they call these functions. Messages to workers are sent only after the
transaction that created their rows commits (NetBox's ``Job.enqueue``), and carry ids, never objects.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from traceback import format_exc
from collections.abc import Iterable
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from workers import protocol
from workers.engine.sharding.layout import Layout
from workers.engine.stages import STAGES

from . import catalog, preflight, stage_results
from .choices import ACTIVE_STATUSES, JobStatus, NodeStatus, TeamRole
from .models import AdaptationJob, Cluster, Device, ModelSpec, Node, StageRun, Team, VirtualBackend

logger = logging.getLogger(__name__)


class Conflict(Exception):
    """The request is valid but the object's state forbids it (the API answers 409)."""


def celery_app():
    from d0web.celery import app

    return app


def _send_on_commit(name: str, args: list, queue: str, task_id: str, **options) -> None:
    transaction.on_commit(
        partial(celery_app().send_task, name, args=args, queue=queue, task_id=task_id, **options)
    )


def _revoke_on_commit(task_ids: Iterable[str], terminate: bool) -> None:
    ids = [task_id for task_id in task_ids if task_id]
    if ids:
        transaction.on_commit(partial(celery_app().control.revoke, ids, terminate=terminate))


# --- teams ----------------------------------------------------------------------------------------------


def teams_of(user):
    return Team.objects.for_user(user)


def default_team(user) -> Team | None:
    """The user's team when there is exactly one, so forms and the API can leave it out."""
    teams = list(teams_of(user)[:2])
    return teams[0] if len(teams) == 1 else None


def is_team_admin(user, team: Team) -> bool:
    return team.memberships.filter(user=user, role=TeamRole.ADMIN).exists()


# --- jobs -----------------------------------------------------------------------------------------------


@transaction.atomic
def submit_job(*, team, user, cluster, stages, model=None, parameters=None, retry_of=None) -> AdaptationJob:
    job = AdaptationJob(
        team=team,
        cluster=cluster,
        model=model,
        stages=list(stages),
        parameters=parameters or {},
        submitted_by=user,
        retry_of=retry_of,
        celery_task_id=str(uuid.uuid4()),
    )
    job.full_clean()
    job.save()
    job.append_log(f"submitted by {user} to cluster {cluster.name}: {', '.join(job.stages)}")
    _send_on_commit(protocol.DISPATCH_JOB, [job.pk], protocol.control_queue(), job.celery_task_id)
    return job


ADAPT_STAGES = ["env_check", "op_coverage", "sharded_run", "sweep"]
# A sweep small enough for a CPU node yet with 12 configurations; nodes with accelerators can be given more.
ADAPT_SWEEP = {"grid": {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16, 32],
                        "max_batch_tokens": [256]},
               "workload": {"requests": 8, "prompt_len": 32, "output_len": 16}, "search": "smart"}


def adaptation_layout(model: ModelSpec, cluster: Cluster) -> tuple[dict, str]:
    """The sharded run's layout: the planner's best layout that fits the cluster, else tp=2 on one node for the
    reduced model (the sharded run always validates a reduced model, so correctness is checked either way)."""
    from . import planning

    devices = planning.cluster_devices(cluster)
    if devices:
        try:
            plans = planning.plan(model, devices, "bf16")
        except ValidationError:
            plans = {}
        for layout in plans.get("layouts", []):
            if layout.get("fits") and layout["nodes"] <= devices["nodes"]:
                # The sharding engine spreads experts over the tensor-parallel ranks (ep equals tp, or tp is 1);
                # a layout that also spreads them over data-parallel replicas is validated without EP.
                ep = layout["ep"] if layout["tp"] == 1 or layout["ep"] == layout["tp"] else 1
                return ({"tp": layout["tp"], "pp": layout["pp"], "ep": ep, "node_count": layout["nodes"]},
                        f"the planner's best layout that fits {cluster.name}: tp={layout['tp']} pp={layout['pp']} "
                        f"ep={ep} on {layout['nodes']} node(s)")
    return ({"tp": 2, "node_count": 1},
            f"the full model does not fit {cluster.name}: validating the reduced model with tp=2 on one node")


def submit_adaptation(*, model: ModelSpec, cluster: Cluster, user) -> AdaptationJob:
    """The whole adaptation in one job: env check, coverage, a sharded validation run, and the tuning sweep."""
    layout, why = adaptation_layout(model, cluster)
    job = submit_job(team=cluster.team, user=user, cluster=cluster, model=model, stages=ADAPT_STAGES,
                     parameters={"op_coverage": {"compile": False}, "sharded_run": layout, "sweep": ADAPT_SWEEP})
    job.append_log(f"adaptation: model analysed at upload ({model.analysis.get('method') if model.analysis else '?'});"
                   f" sharded run uses {why}")
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
    if not job.cancel():
        raise Conflict(f"Job {job.pk} is already {job.status}; only a queued or running job can be cancelled.")
    job.append_log(f"cancelled by {user}")
    _stop_stage_runs(job, JobStatus.CANCELLED)
    # The dispatch task is bookkeeping that reads the job row: revoke it but never kill it mid-write.
    _revoke_on_commit([job.celery_task_id], terminate=False)
    return job


def _stop_stage_runs(job: AdaptationJob, status: str, error: str = "") -> None:
    """End every still-active stage run of a job and revoke its node task (killing it if it runs)."""
    runs = StageRun.objects.filter(job=job, status__in=list(ACTIVE_STATUSES))
    task_ids = list(runs.values_list("celery_task_id", flat=True))
    runs.update(status=status, finished=timezone.now(), error=error)
    _revoke_on_commit(task_ids, terminate=True)


@transaction.atomic
def fail_job(job: AdaptationJob, error: str, traceback: str = "") -> None:
    """Fail a job (if still active) with its reason, and stop its other stage runs."""
    if job.fail(error, traceback):
        job.append_log(f"failed: {error}")
        _stop_stage_runs(job, JobStatus.CANCELLED, error="job failed elsewhere")


def eligible_nodes(job: AdaptationJob) -> list[Node]:
    nodes = Node.objects.filter(cluster=job.cluster, status=NodeStatus.ONLINE).order_by("hostname")
    wanted = job.parameters.get("nodes") if isinstance(job.parameters, dict) else None
    if wanted:
        nodes = nodes.filter(hostname__in=wanted)
    return list(nodes)


def dispatch_job(job_id: int) -> None:
    """Control-plane entry point for a new job: start it and fan out its first stage."""
    job = AdaptationJob.objects.filter(pk=job_id).first()
    if job is None or not job.start():
        return  # deleted, cancelled before it started, or already dispatched by a redelivery
    job.append_log("started")
    advance_job(job.pk)


@transaction.atomic
def advance_job(job_id: int) -> None:
    """Dispatch the next stage whose predecessors have all succeeded, or finish the job."""
    job = AdaptationJob.objects.select_for_update().get(pk=job_id)
    if job.status != JobStatus.RUNNING:
        return
    runs = list(job.stage_runs.all())
    if any(run.status in ACTIVE_STATUSES for run in runs):
        _update_job_progress(job, runs)
        return
    done = {run.kind for run in runs}
    pending = [kind for kind in job.stages if kind not in done]
    if not pending:
        job.finish()
        job.append_log("succeeded")
        return
    kind = pending[0]
    nodes = eligible_nodes(job)
    if not nodes:
        fail_job(job, f"No online node in cluster '{job.cluster.name}' can run stage {kind}. Start a node worker "
                       f"(see the cluster page) or wait for a node to come back online.")
        return
    refused = preflight.refusals(kind, nodes)
    for reason in refused.values():
        job.append_log(f"pre-flight gate: {reason}")
    nodes = [node for node in nodes if node.pk not in refused]
    if not nodes:
        fail_job(job, f"The pre-flight gate refused every node for stage {kind}: " + "; ".join(refused.values()))
        return
    try:
        assignments = stage_assignments(job, kind, nodes)
    except ValueError as error:
        fail_job(job, f"Stage {kind} cannot be placed: {error}")
        return
    for node, params in assignments:
        run = StageRun.objects.create(
            job=job, kind=kind, node=node, node_name=node.hostname, celery_task_id=str(uuid.uuid4())
        )
        job.append_log(f"stage {kind} queued on {node.hostname}")
        _send_on_commit(protocol.RUN_STAGE, [run.pk, kind, params], node.queue_name, run.celery_task_id)
    _update_job_progress(job, [*runs, *job.stage_runs.filter(kind=kind)])


def stage_parameters(job: AdaptationJob, kind: str) -> dict:
    """What a node's stage gets: the job's parameters for that stage (``parameters[kind]``) plus what the control
    plane knows: the cluster's expected device count, the model's config.json."""
    params = dict(job.parameters.get(kind) or {})
    if kind == "env_check":
        params.setdefault("expected_devices_per_node", job.cluster.expected_devices_per_node)
    if STAGES[kind].needs_model:
        params["config"] = job.model.config
    if kind == "op_coverage" and params.get("virtual_backends"):
        # Ids of the team's virtual backends become the operator lists the node judges against.
        backends = VirtualBackend.objects.filter(team=job.team, pk__in=params["virtual_backends"])
        params["virtual_backends"] = [{"name": backend.name, "operators": backend.operators} for backend in backends]
    return params


def measured_hardware(node: Node) -> dict | None:
    """What the node's latest env check measured, as the sweep's roofline wants it (None if never checked)."""
    devices = list(node.devices.all())
    measured = [device.measured for device in ([d for d in devices if d.kind != "cpu"] or devices) if device.measured]
    if not measured:
        return None
    first = measured[0]
    hardware = {"flops_per_s": {dtype: value for dtype, value in (first.get("matmul_flops_per_s") or {}).items()
                                if value}}
    if first.get("copy_bandwidth_bytes_per_s"):
        hardware["memory_bandwidth_bytes_per_s"] = first["copy_bandwidth_bytes_per_s"]
    return hardware


def stage_assignments(job: AdaptationJob, kind: str, nodes: list[Node]) -> list[tuple[Node, dict]]:
    """(node, params) for each stage run of ``kind``: every eligible node, or for a "group" stage (a sharded run)
    ``node_count`` nodes forming one torch.distributed world, rendezvousing on the first one (torchrun's
    env:// method: its address and a port)."""
    params = stage_parameters(job, kind)
    placement = STAGES[kind].placement
    if placement == "one":
        if kind == "sweep" and "hardware" not in params:
            params["hardware"] = measured_hardware(nodes[0])
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
    # The port cannot be checked free on a remote node: a random one from a range torchrun users leave alone
    # makes two concurrent runs (or two control planes on one host) unlikely to meet.
    rendezvous = {"master_addr": master, "master_port": 20000 + secrets.randbelow(10000), "world_size": world_size,
                  "nproc_per_node": world_size // node_count}
    return [(node, {**params, "rendezvous": {**rendezvous, "node_rank": rank}}) for rank, node in enumerate(chosen)]


def _update_job_progress(job: AdaptationJob, runs: list[StageRun]) -> None:
    """Job progress = mean over its stages of the mean progress of that stage's runs (0 if not yet run)."""
    per_stage = []
    for kind in job.stages:
        fractions = [run.progress for run in runs if run.kind == kind]
        per_stage.append(sum(fractions) / len(fractions) if fractions else 0.0)
    job.set_progress(sum(per_stage) / len(per_stage))


def record_stage_started(stage_run_id: int) -> None:
    run = StageRun.objects.filter(pk=stage_run_id).first()
    if run and run.start():
        run.job.append_log(f"stage {run.kind} running on {run.node_name}")


def record_stage_progress(stage_run_id: int, fraction: float, message: str) -> None:
    updated = StageRun.objects.filter(pk=stage_run_id, status=JobStatus.RUNNING).update(
        progress=min(max(float(fraction), 0.0), 1.0), message=str(message)[:255]
    )
    if updated:
        job = AdaptationJob.objects.get(stage_runs__pk=stage_run_id)
        _update_job_progress(job, list(job.stage_runs.all()))


def record_stage_finished(stage_run_id: int, ok: bool, result, error: str, traceback: str) -> None:
    run = StageRun.objects.select_related("job").filter(pk=stage_run_id).first()
    if run is None:
        return
    moved = run.finish(result=result, message="done") if ok else run.fail(error or "stage failed", traceback)
    if not moved:
        return  # cancelled, or failed by the node sweep: a late report never overwrites that
    job = run.job
    if not ok:
        fail_job(job, f"Stage {run.kind} failed on {run.node_name}: {error}", traceback)
        return
    try:
        stage_results.store(run)
    except Exception as problem:  # noqa: BLE001 - a malformed report must end the job, not leave it running
        logger.exception("could not store the result of stage run %s", run.pk)
        fail_job(job, f"Stage {run.kind} on {run.node_name} finished, but its result could not be stored: "
                      f"{type(problem).__name__}: {problem}", format_exc())
        return
    job.append_log(f"stage {run.kind} succeeded on {run.node_name} in {run.duration_seconds or 0:.1f}s"
                   + _verdict_note(result))
    advance_job(job.pk)


# --- nodes ----------------------------------------------------------------------------------------------


def _verdict_note(result) -> str:
    if not isinstance(result, dict) or "verdict" not in result:
        return ""
    worst = [check["message"] for check in result.get("checks", []) if check.get("status") == result["verdict"]]
    return f": {result['verdict'].upper()}" + (f" ({worst[0]})" if worst and result["verdict"] != "pass" else "")


def resolve_cluster(reference: str) -> Cluster:
    """A cluster from a node's join name: ``team/cluster``, or a bare cluster name that is unique."""
    team_slug, _, name = reference.rpartition("/")
    clusters = Cluster.objects.filter(name=name).select_related("team")
    if team_slug:
        clusters = clusters.filter(team__slug=team_slug)
    found = list(clusters[:2])
    if len(found) != 1:
        problem = "matches several clusters; use <team>/<cluster>" if found else "matches no cluster"
        raise ValidationError(f"Cluster reference {reference!r} {problem}.")
    return found[0]


@transaction.atomic
def register_node(cluster_ref: str, hostname: str, queue_name: str, host_facts: dict, devices: list[dict]) -> Node:
    cluster = resolve_cluster(cluster_ref)
    now = timezone.now()
    node = Node.objects.select_for_update().filter(cluster=cluster, hostname=hostname).first()
    if node is None:
        node = Node(cluster=cluster, hostname=hostname)
    if node.status != NodeStatus.DRAINING:
        node.status = NodeStatus.ONLINE
    node.queue_name = queue_name
    node.last_heartbeat = now
    node.host_facts = host_facts
    node.save()
    seen = []
    for reported in devices:
        device, _ = Device.objects.update_or_create(
            node=node,
            kind=reported["kind"],
            index=reported["index"],
            defaults={
                "name": reported.get("name", "")[:255],
                "memory_bytes": int(reported.get("memory_bytes") or 0),
                "properties": reported.get("properties") or {},
            },
        )
        seen.append(device.pk)
    node.devices.exclude(pk__in=seen).delete()
    logger.info("node %s registered in %s with %d devices", hostname, cluster.join_name, len(seen))
    return node


def record_heartbeat(queue_name: str) -> bool:
    now = timezone.now()
    if not Node.objects.filter(queue_name=queue_name).update(last_heartbeat=now):
        return False
    Node.objects.filter(queue_name=queue_name, status=NodeStatus.OFFLINE).update(status=NodeStatus.ONLINE)
    return True


def node_left(queue_name: str) -> None:
    """A node worker shut down cleanly: offline now, rather than after the heartbeat timeout."""
    for node in Node.objects.filter(queue_name=queue_name, status=NodeStatus.ONLINE):
        _mark_offline(node, "its worker shut down", Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE))


def sweep_stuck_stage_runs() -> int:
    """Fail stage runs that have been running longer than any stage may (their report was lost: a broker
    restart, a worker killed between two messages). Returns how many were failed."""
    limit = settings.D0_STAGE_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=limit)
    failed = 0
    for run in StageRun.objects.select_related("job").filter(status=JobStatus.RUNNING, started__lt=cutoff):
        error = f"Stage {run.kind} on {run.node_name} sent no result within {limit:g}s; its report was lost."
        if run.fail(error):
            fail_job(run.job, error)
            failed += 1
    return failed


def sweep_nodes() -> list[str]:
    """Mark nodes offline after missed heartbeats and fail the work they held. Returns their hostnames."""
    timeout = settings.D0_NODE_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=timeout)
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
    for run in StageRun.objects.select_related("job").filter(node=node, status__in=list(ACTIVE_STATUSES)):
        error = f"Node {node.hostname} went offline ({reason}) while stage {run.kind} was {run.status}."
        if run.fail(error):
            fail_job(run.job, error)
    return True


# --- models ---------------------------------------------------------------------------------------------


def add_from_catalog(*, team, user, slug: str) -> tuple[ModelSpec, bool]:
    """The team's model for a catalog entry, created if the team has none yet; (spec, created)."""
    entry = catalog.BY_SLUG[slug]
    existing = ModelSpec.objects.filter(team=team, catalog_slug=slug).first()
    if existing:
        return existing, False
    spec = ModelSpec(team=team, name=entry.name, config=entry.config(), catalog_slug=slug, created_by=user,
                     source_note=f"d0 catalog: {entry.hf_id}" + (f" ({entry.note})" if entry.note else ""))
    spec.full_clean()
    spec.save()
    return spec, True
