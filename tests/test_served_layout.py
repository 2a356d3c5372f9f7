"""The layout the whole adaptation serves: the plan's where the cluster holds it, else the same shape scaled down to
the cluster, said in one sentence; never tp=1 without saying so."""

import pytest

from adaptation.intake.served_layout import engine_settings, served_plan
from workers.engine.serving.launchers import split_over_nodes

KIMI_ON_TWO_H200_NODES = {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "nodes": 2}


def axes(layout):
    return {key: layout[key] for key in ("tp", "pp", "dp", "ep", "nodes")}


def test_a_plan_the_cluster_holds_is_served_as_planned():
    plan = served_plan(KIMI_ON_TWO_H200_NODES, 8, 2, "H200")
    assert axes(plan["served"]) == KIMI_ON_TWO_H200_NODES
    assert plan["why"] == ("the plan (tp=1 pp=1 dp=16 ep=16 on 2 nodes) needs 16 devices and this cluster (2 H200 "
                           "nodes of 8 devices) holds it: serving it as planned")


def test_dp16_ep16_on_two_cpu_nodes_becomes_dp2_ep2_across_both():
    plan = served_plan(KIMI_ON_TWO_H200_NODES, 1, 2, "CPU")
    assert axes(plan["served"]) == {"tp": 1, "pp": 1, "dp": 2, "ep": 2, "nodes": 2}
    assert engine_settings(plan["served"]) == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                                                "data_parallel_size": 2, "enable_expert_parallel": True}
    assert plan["why"].endswith("this cluster has 2 CPU nodes of 1 device: serving tp=1 pp=1 dp=2 ep=2 on 2 nodes, "
                                "the same shape scaled down")


def test_tensor_parallelism_is_kept_longest_and_halved_not_decremented():
    # tp=8 pp=2 on 2 nodes of 8, served on 2 nodes of 1: the stages give way first at equal size; tp never becomes 3.
    plan = served_plan({"tp": 8, "pp": 2, "dp": 1, "ep": 1, "nodes": 2}, 1, 2, "CPU")
    assert axes(plan["served"]) == {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "nodes": 2}
    assert axes(served_plan({"tp": 6, "pp": 1, "dp": 1, "ep": 1, "nodes": 1}, 4, 1, "L4")["served"])["tp"] == 3


def test_pipeline_stages_shrink_one_at_a_time_to_the_largest_that_fits():
    plan = served_plan({"tp": 1, "pp": 3, "dp": 1, "ep": 1, "nodes": 3}, 1, 2, "CPU")
    assert axes(plan["served"]) == {"tp": 1, "pp": 2, "dp": 1, "ep": 1, "nodes": 2}


def test_one_device_serves_tp1_and_says_why():
    plan = served_plan({"tp": 1, "pp": 3, "dp": 1, "ep": 1, "nodes": 3}, 1, 1, "CPU")
    assert axes(plan["served"]) == {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "nodes": 1}
    assert "one device holds no split of it" in plan["why"] and "scaled down to one device" in plan["why"]
    moe = served_plan(KIMI_ON_TWO_H200_NODES, 1, 1, "CPU")
    assert moe["served"]["ep"] == 1 and moe["why"].endswith("(expert parallel needs more than one rank)")


def test_without_a_plan_the_reason_is_the_sentence():
    plan = served_plan(None, 1, 2, "CPU", "no online node of local has reported its devices, so there is no plan")
    assert plan["planned"] is None and axes(plan["served"]) == {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "nodes": 1}
    assert plan["why"].startswith("no online node of local has reported its devices, so there is no plan: serving")


@pytest.mark.parametrize("devices_per_node,nodes", [(1, 2), (2, 2), (8, 3), (4, 1), (3, 4)])
@pytest.mark.parametrize("planned", [KIMI_ON_TWO_H200_NODES, {"tp": 8, "pp": 4, "dp": 1, "ep": 1, "nodes": 4},
                                     {"tp": 2, "pp": 1, "dp": 6, "ep": 12, "nodes": 2}])
def test_every_served_layout_fits_the_cluster_and_spreads_as_vllm_spreads_it(planned, devices_per_node, nodes):
    served = served_plan(planned, devices_per_node, nodes, "X")["served"]
    world = served["tp"] * served["pp"] * served["dp"]
    assert served["nodes"] <= nodes and world <= devices_per_node * served["nodes"]
    split_over_nodes(engine_settings(served), served["nodes"])  # raises where vLLM could not spread it
    assert all(served[axis] <= planned[axis] for axis in ("tp", "pp", "dp"))
