"""The layout the whole adaptation serves: the planner's for the cluster, or, where the cluster has fewer devices than
the plan needs, the largest layout of the same shape that it holds, with one sentence saying which and why.

Plain data in and out: a planned layout ``{"tp", "pp", "dp", "ep", "nodes"}`` (as the planner lists them) and the
cluster's shape (devices per node, nodes). A CPU node counts as one device (the node's probe reports its CPU as one
device): the engine's CPU build runs one rank per node, bound to that node's cores.
"""

from __future__ import annotations

from workers.engine.serving.launchers import split_over_nodes

AXES = ("tp", "pp", "dp")
# Which axis gives way first when two are equally large: pipeline stages add no decode rate, data-parallel replicas
# add only throughput; tensor parallelism is the layout's core (and EP follows TP x DP).
SHRINK_FIRST = ("pp", "dp", "tp")


def layout_text(layout: dict) -> str:
    return " ".join(f"{axis}={layout[axis]}" for axis in (*AXES, "ep")) + \
        f" on {layout['nodes']} node{'s' if layout['nodes'] != 1 else ''}"


def engine_settings(layout: dict) -> dict:
    """vLLM's arguments for a layout (``workers/engine/serving/launchers.SETTINGS``); EP is vLLM's flag, its size
    then TP x DP."""
    return {"tensor_parallel_size": layout["tp"], "pipeline_parallel_size": layout["pp"],
            "data_parallel_size": layout["dp"], "enable_expert_parallel": layout["ep"] > 1}


def _shrunk(axis: str, size: int) -> int:
    """The next smaller size of an axis: TP by its smallest factor (it must still divide the heads, as the plan's
    did), pipeline stages and data-parallel replicas by one (any count serves)."""
    if axis != "tp":
        return size - 1
    return size // next(factor for factor in range(2, size + 1) if size % factor == 0)


def node_count(layout: dict, devices_per_node: int, nodes: int) -> int | None:
    """The fewest of the cluster's nodes that hold the layout, as vLLM spreads it (whole DP replicas per node, else
    a replica's TP x PP ranks split evenly), or None."""
    world = layout["tp"] * layout["pp"] * layout["dp"]
    for count in range(1, nodes + 1):
        if world % count or world // count > devices_per_node:
            continue
        try:
            split_over_nodes(engine_settings({**layout, "ep": 1}), count)
        except ValueError:
            continue
        return count
    return None


def scaled_layout(planned: dict, devices_per_node: int, nodes: int) -> dict:
    """The planned layout if the cluster holds it, else the same shape scaled down: the largest axis shrinks
    (``_shrunk``), again, until the layout fits. EP stays on while there is more than one TP x DP rank."""
    layout = {axis: int(planned[axis]) for axis in AXES}
    while (count := node_count(layout, devices_per_node, nodes)) is None:
        axis = max(SHRINK_FIRST, key=lambda name: layout[name])
        layout[axis] = _shrunk(axis, layout[axis])
    ep = layout["tp"] * layout["dp"] if planned.get("ep", 1) > 1 and layout["tp"] * layout["dp"] > 1 else 1
    return {**layout, "ep": ep, "nodes": count}


def served_plan(planned: dict | None, devices_per_node: int, nodes: int, hardware: str,
                no_plan_reason: str = "") -> dict:
    """``{"planned", "served", "why"}`` as the serve sweep's ``plan`` parameter takes it. ``hardware`` names the
    devices ("CPU", "H200"); ``no_plan_reason`` says why there is no plan when ``planned`` is None."""
    cluster = f"{nodes} {hardware} node{'s' if nodes != 1 else ''} of {devices_per_node} device" \
              f"{'s' if devices_per_node != 1 else ''}"
    if planned is None:
        served = {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "nodes": 1}
        return {"planned": None, "served": served,
                "why": f"{no_plan_reason}: serving {layout_text(served)} of this cluster ({cluster})"}
    planned = {key: int(planned[key]) for key in (*AXES, "ep", "nodes")}
    served = scaled_layout(planned, devices_per_node, nodes)
    devices = planned["tp"] * planned["pp"] * planned["dp"]
    needs = f"the plan ({layout_text(planned)}) needs {devices} device{'s' if devices != 1 else ''}"
    if {axis: served[axis] for axis in AXES} == {axis: planned[axis] for axis in AXES}:
        why = f"{needs} and this cluster ({cluster}) holds it: serving it as planned"
    elif served["tp"] * served["pp"] * served["dp"] == 1:
        why = (f"{needs}; this cluster has {cluster} and one device holds no split of it: serving "
               f"{layout_text(served)}, the plan scaled down to one device")
    else:
        why = f"{needs}; this cluster has {cluster}: serving {layout_text(served)}, the same shape scaled down"
    if planned["ep"] > 1 and served["ep"] == 1:
        why += " (expert parallel needs more than one rank)"
    return {"planned": planned, "served": served, "why": why}
