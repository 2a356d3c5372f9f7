"""The whole adaptation of a model on a cluster, in one job: the env check, the operator coverage, a sharded
validation run at the planner's layout, and the real engine's serve sweep at the planner's layout scaled to the
cluster (``served_layout``). A cluster with no node offering an engine still gets the serve sweep: its placement
fails with how to add one, and the job's log says so from the start (d0's proxy sweep stays a stage of its own)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from workers.engine.sharding.layout import Layout, ranks_keeping_axes, scaled_from_plan

from ..choices import NodeStatus
from ..jobs.services import submit_job
from ..models import AdaptationJob, Cluster, Device, ModelSpec
from ..serving.services import ADAPTATION_REAL_WEIGHTS, ADAPTATION_SERVE_SWEEP, NO_ENGINE, cluster_serves
from . import catalog
from .served_layout import engine_settings, layout_text, served_plan
from .services import cluster_devices, plan

CHECKS = ["env_check", "op_coverage", "sharded_run"]
FINAL = "serve_sweep"


def cluster_plan(model: ModelSpec, cluster: Cluster) -> tuple[dict | None, dict | None, str]:
    """(the cluster's devices as the planner sees them, the planner's answer, why there is none)."""
    devices = cluster_devices(cluster)
    if not devices:
        return None, None, f"no online node of {cluster.name} has reported its devices, so there is no plan"
    try:
        return devices, plan(model, devices, "bf16"), ""
    except ValidationError as error:
        return devices, None, f"the planner has no plan for {cluster.name}: {' '.join(error.messages)}"


def has_accelerators(cluster: Cluster) -> bool:
    """Whether an online node of the cluster has a device other than its CPU."""
    return Device.objects.filter(node__cluster=cluster, node__status=NodeStatus.ONLINE).exclude(kind="cpu").exists()


def adaptation_layout(cluster: Cluster, devices: dict | None, plans: dict | None, accelerators: bool,
                      model: ModelSpec | None = None) -> tuple[dict, str]:
    """The sharded run's layout: the planner's layout (the best that fits the cluster, else the smallest that holds
    the model) scaled to the ranks at hand, keeping the axes it uses (``layout.scaled_from_plan``: DP16 + EP16 ->
    EP2 on 2 ranks, TP8 x PP2 -> TP2 x PP2 on 4). The ranks at hand are one node's: its accelerators, or on CPU
    nodes the fewest processes that keep every planned axis (``ranks_keeping_axes``); the run validates a reduced
    model, which one node holds whatever the plan spans. Without a plan (no device of the cluster could hold
    its share), the model's own axes on 2 ranks: TP2, with EP2 over the same ranks when it routes experts."""
    fitting = [layout for layout in (plans or {}).get("layouts", [])
               if layout.get("fits") and layout["nodes"] <= devices["nodes"]]
    planned = next(iter(fitting or (plans or {}).get("smallest_layouts") or []), None)
    if planned is None:
        experts = ((model.analysis or {}).get("planner") or {}).get("experts") if model else None
        layout = Layout(tp=2, ep=2 if experts else 1)
        return ({"tp": layout.tp, "ep": layout.ep, "node_count": 1},
                f"{layout.label()} on 2 ranks of one node, the model's own axes: there is no plan for "
                f"{cluster.name}")
    planned = {axis: int(planned[axis]) for axis in ("tp", "pp", "dp", "ep", "nodes")}
    ranks = devices["devices_per_node"] if accelerators else ranks_keeping_axes(planned)
    layout, how = scaled_from_plan(planned, max(ranks, 2))
    which = "the planner's best layout for" if fitting else "the smallest layout that holds the model, larger than"
    return ({"tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "node_count": 1, "planned": planned},
            f"{how}; the plan is {which} {cluster.name}; on one node")


def serve_layout(devices: dict | None, plans: dict | None, accelerators: bool, no_plan_reason: str) -> dict:
    """The serve sweep's ``plan`` parameter: the planner's best layout that fits the cluster, else the fastest of the
    fewest-device layouts on the nodes the model needs (the planner's ``smallest_layouts``), and what is served of
    it on this cluster."""
    planned = None
    if plans:
        planned = next(iter(plans.get("layouts") or plans.get("smallest_layouts") or []), None)
        if planned is None:
            no_plan_reason = f"the planner finds no layout that holds the model ({plans.get('reason')})"
    if devices is None:
        return served_plan(None, 1, 1, "", no_plan_reason)
    hardware = devices["device_name"] if accelerators else "CPU"
    return served_plan(planned, devices["devices_per_node"], devices["nodes"], hardware, no_plan_reason)


def submit_adaptation(*, model: ModelSpec, cluster: Cluster, user, weights_path: str | None = None) -> AdaptationJob:
    """The whole adaptation in one job: env check, coverage, a sharded validation run, and the engine's serve sweep
    at the planned layout, on the team's checkpoint (``weights_path`` on the nodes) or a validation checkpoint."""
    devices, plans, no_plan_reason = cluster_plan(model, cluster)
    accelerators = has_accelerators(cluster)
    layout, why = adaptation_layout(cluster, devices, plans, accelerators, model)
    layout_plan = serve_layout(devices, plans, accelerators, no_plan_reason)
    served = layout_plan["served"]
    entry = catalog.BY_SLUG.get(model.catalog_slug)
    demo = bool(entry and entry.demo_weights and not weights_path)
    real = bool(weights_path) or demo
    serve = {**(ADAPTATION_REAL_WEIGHTS if real else ADAPTATION_SERVE_SWEEP), "node_count": served["nodes"],
             "plan": layout_plan, **({"weights_path": weights_path} if weights_path else {}),
             **({"demo_weights": True} if demo else {})}
    serve["settings"] = {**serve.get("settings", {}), **engine_settings(served)}
    if not accelerators:
        # vLLM's CPU build: its torch.compile warm-up took 1-3 minutes of each engine start on a few cores, and the
        # adaptation starts one per variant; served eager, the recipe says so (--enforce-eager).
        serve["grid"] = {**serve["grid"], "enforce_eager": [True]}
    if real and served["nodes"] > 1:
        serve["variants"] = ["as_shipped"]  # quantized variants are made on one node; a deployment spans several
    method = model.analysis.get("method") if model.analysis else "?"
    weights = weights_path or ("d0's demo model with its real weights, made on the node" if demo else
                               "a validation checkpoint (the architecture reduced, seeded random weights)")
    notes = [f"adaptation: model analysed at upload ({method}); sharded run uses {why}",
             f"adaptation: the serve sweep serves {layout_text(served)}: {layout_plan['why']}; weights: {weights}",
             "adaptation: " + ("each configuration checked against transformers in float32 on the checkpoint "
                               "(chat template, answers), the accuracy gate (lm-eval against the endpoint and the "
                               f"reference), variants {', '.join(serve.get('variants', ['as_shipped']))}" if real
                               else "no accuracy check: random weights")]
    if not cluster_serves(cluster):
        notes.append(f"adaptation: {NO_ENGINE}; one must by the time the serve sweep starts, or that stage cannot "
                     "be placed")
    return submit_job(team=cluster.team, user=user, cluster=cluster, model=model, stages=[*CHECKS, FINAL],
                      parameters={"op_coverage": {"compile": False}, "sharded_run": layout, FINAL: serve},
                      notes=notes)
