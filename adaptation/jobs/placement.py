"""Where a stage runs: the job's online nodes, the pre-flight gate that keeps gated stages off unfit nodes, and each
stage run's node and parameters as the stage's placement and its handler say (``adaptation/stages.py``)."""

from __future__ import annotations

import zlib
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from workers.engine.stages import STAGES

from .. import stages as handlers
from ..choices import CheckVerdict
from ..models import AdaptationJob, EnvReport, Node
from . import statements


def eligible_nodes(job: AdaptationJob, online: list[Node] | None = None) -> list[Node]:
    """The cluster's online nodes (``online`` if the caller read them already) the job may use."""
    if online is None:
        online = statements.online_nodes(cluster_id=job.cluster_id).rows()
    wanted = job.parameters.get("nodes") if isinstance(job.parameters, dict) else None
    return [node for node in online if node.hostname in wanted] if wanted else online


def preflight_refusals(kind: str, nodes: list[Node], now=None) -> dict[int, str]:
    """Node id → why the gate refuses it for a stage of ``kind`` (empty when the stage is not gated).

    Gated stages run only on nodes whose latest env check passed (or only warned) and is recent enough. A refused
    node is named in the job's log with the reason, so the fix is obvious."""
    if not STAGES[kind].gated:
        return {}
    now = now or timezone.now()
    max_age = timedelta(hours=settings.D0_PREFLIGHT_MAX_AGE_HOURS)
    latest = EnvReport.objects.latest_per_node(nodes)
    reasons = {}
    for node in nodes:
        report = latest.get(node.pk)
        if report is None:
            reasons[node.pk] = f"node {node.hostname} has no env check yet: run an env_check job first"
        elif report.verdict == CheckVerdict.FAIL:
            failed = "; ".join(check["message"] for check in report.failed_checks) or "see its report"
            reasons[node.pk] = f"node {node.hostname} failed its latest env check ({report.created:%Y-%m-%d %H:%M}" \
                               f" UTC): {failed}"
        elif now - report.created > max_age:
            reasons[node.pk] = (f"node {node.hostname}'s latest env check is from {report.created:%Y-%m-%d %H:%M} "
                                f"UTC, older than {settings.D0_PREFLIGHT_MAX_AGE_HOURS:g} h: run env_check again")
    return reasons


# A group stage's parameter saying over how many nodes its world spreads: the control plane's to read, not the node's.
GROUP_SIZE = "node_count"


def stage_parameters(job: AdaptationJob, kind: str, nodes: list[Node]) -> dict:
    """What each node of ``nodes`` (those chosen to run ``kind``) gets: the job's parameters for that stage, the
    model's config.json when the stage is about a model, and what the stage's handler adds (a group stage's ranks
    and rendezvous come on top, from ``stage_assignments``)."""
    params = {key: value for key, value in (job.parameters.get(kind) or {}).items() if key != GROUP_SIZE}
    if STAGES[kind].needs_model:
        params["config"] = job.model.config
    return handlers.handler(kind).prepare(job, params, nodes)


def stage_assignments(job: AdaptationJob, kind: str, nodes: list[Node]) -> list[tuple[Node, dict]]:
    """(node, params) for each stage run of ``kind`` among ``nodes`` (the job's eligible ones, in order) that the
    stage's handler accepts, as the stage's placement says: on "every" node, on "one" (the first), or on a "group"
    of ``node_count`` nodes forming one torch.distributed world that rendezvouses on the first one (torchrun's
    env:// method: its address and a port). A ValueError says why the stage cannot be placed."""
    placement, handler = STAGES[kind].placement, handlers.handler(kind)
    declared = job.parameters.get(kind) or {}
    nodes = handler.eligible(job, declared, nodes)
    if placement == "every":
        chosen = nodes
    elif placement == "one":
        chosen = nodes[:1]
    else:
        node_count = int(declared.get(GROUP_SIZE, 1))
        if node_count < 1 or node_count > len(nodes):
            raise ValueError(f"it needs {node_count} node(s) and {len(nodes)} eligible node(s) are online")
        chosen = nodes[:node_count]
    params = stage_parameters(job, kind, chosen)
    if placement != "group" or len(chosen) == 1:
        return [(node, params) for node in chosen]
    world_size = handler.world_size(params)
    if world_size % len(chosen):
        raise ValueError(f"a world of {world_size} ranks does not split evenly over {len(chosen)} nodes")
    master = chosen[0].host_facts.get("address") or chosen[0].hostname
    rendezvous = {"master_addr": master, "master_port": rendezvous_port(job.pk, kind), "world_size": world_size,
                  "nproc_per_node": world_size // len(chosen), "hostnames": [node.hostname for node in chosen]}
    return [(node, {**params, "rendezvous": {**rendezvous, "node_rank": rank}}) for rank, node in enumerate(chosen)]


def rendezvous_port(job_id: int, kind: str) -> int:
    """A group stage's rendezvous port, from a range torchrun users leave alone. The port cannot be checked free
    on a remote node; spread by job id, two concurrent runs (or two control planes on one host) are unlikely to
    meet. The same whenever the stage's messages are made, so a message sent again matches its ranks'."""
    return 20000 + (job_id * 7919 + zlib.crc32(kind.encode())) % 10000
