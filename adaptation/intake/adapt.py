"""The whole adaptation of a model on a cluster, in one job: the env check, the operator coverage, a sharded
validation run at the planner's layout, and the tuning sweep (the real engine's where a node serves one, d0's proxy
sweep otherwise, which its report says)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from ..jobs.services import submit_job
from ..models import AdaptationJob, Cluster, ModelSpec
from ..serving.services import ADAPTATION_SERVE_SWEEP, cluster_serves
from ..sweeps.services import ADAPTATION_SWEEP
from .services import cluster_devices, plan

CHECKS = ["env_check", "op_coverage", "sharded_run"]


def adaptation_layout(model: ModelSpec, cluster: Cluster) -> tuple[dict, str]:
    """The sharded run's layout: the planner's best layout that fits the cluster, else tp=2 on one node for the
    reduced model (the sharded run always validates a reduced model, so correctness is checked either way)."""
    devices = cluster_devices(cluster)
    if devices:
        try:
            plans = plan(model, devices, "bf16")
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
    # A node with a real engine serves the model on it; without one the sweep serves d0's reduced proxy (and its
    # report says so).
    final, sweep = ("serve_sweep", ADAPTATION_SERVE_SWEEP) if cluster_serves(cluster) else ("sweep", ADAPTATION_SWEEP)
    method = model.analysis.get("method") if model.analysis else "?"
    return submit_job(team=cluster.team, user=user, cluster=cluster, model=model, stages=[*CHECKS, final],
                      parameters={"op_coverage": {"compile": False}, "sharded_run": layout, final: sweep},
                      notes=[f"adaptation: model analysed at upload ({method}); sharded run uses {why}"])
