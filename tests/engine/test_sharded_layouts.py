"""Sharded runs on the plan's axes (issue 31, item 2): the layout scaled from the planner's, experts enough for
every EP rank, MLA split by heads, the verdict naming the axes exercised and each rank's held share, and a wrong
expert placement caught with its reason. The runs are 2 gloo processes on a reduced model (seconds each)."""

import json

import pytest
import torch

from workers.engine.models import build_random_model, load_config, reduce_for_layout
from workers.engine.sharding import run_sharded
from workers.engine.sharding.expert_parallel import placement_problems
from workers.engine.sharding.layout import Layout, parse_fault, ranks_keeping_axes, scaled_from_plan
from workers.engine.sharding.tensor_parallel import mla_head_plan

from .conftest import CONFIGS

KIMI_PLAN = {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "nodes": 2}  # the planner's Kimi-K2 layout on 2 x 8 H200


def load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


@pytest.mark.parametrize(("planned", "ranks", "expected", "words"), [
    (KIMI_PLAN, 2, Layout(ep=2), "EP2 × TP1 on 2 ranks: the plan scaled to the 2 ranks at hand (DP16 + EP16 on 16"),
    ({"tp": 8, "pp": 2}, 4, Layout(tp=2, pp=2), "TP2 × PP2 on 4 ranks: the plan scaled"),
    ({"tp": 8, "pp": 2}, 2, Layout(tp=2), "TP2 on 2 ranks: the plan scaled"),
    ({"tp": 8, "ep": 8}, 8, Layout(tp=8, ep=8), "EP8 × TP8 on 8 ranks: the plan as it is (TP8 + EP8 on 8 devices)"),
    ({"tp": 2, "pp": 3, "dp": 3, "ep": 6}, 8, Layout(tp=3, pp=2, ep=3), "EP3 × TP3 × PP2 on 6 ranks: the plan scaled"),
    ({"tp": 2, "dp": 4}, 8, Layout(tp=2), "(DP replicas are copies of the model: not run)"),
    ({"tp": 1}, 2, Layout(tp=2), "the plan (one device on 1 device) splits nothing"),
])
def test_the_run_keeps_the_plans_axes_scaled_to_the_ranks_at_hand(planned, ranks, expected, words):
    layout, why = scaled_from_plan(planned, ranks)
    assert layout == expected
    assert words in why


def test_a_cpu_node_runs_the_fewest_processes_that_keep_every_planned_axis():
    assert ranks_keeping_axes(KIMI_PLAN) == 2
    assert ranks_keeping_axes({"tp": 8, "pp": 2}) == 4
    assert ranks_keeping_axes({"tp": 1, "pp": 1}) == 2
    with pytest.raises(ValueError, match="at least 2 ranks"):
        scaled_from_plan(KIMI_PLAN, 1)


@pytest.mark.parametrize(("name", "key", "ep", "per_rank"), [
    ("kimi-k2-instruct.json", "n_routed_experts", 2, 2),  # top-8 reduced to top-2: two experts on each rank
    ("kimi-k2-instruct.json", "n_routed_experts", 8, 2),  # 4 reduced experts would leave ranks without one
    ("deepseek-v3.json", "n_routed_experts", 4, 2),
    ("llama-4-scout-17b-16e-instruct.partial.json", "num_local_experts", 4, 1),  # top-1: one expert a rank is enough
])
def test_every_ep_rank_holds_experts_of_its_own(name, key, ep, per_rank):
    reduction = reduce_for_layout(load(name), ep=ep)
    text = reduction.config.get("text_config", reduction.config)
    assert text[key] == ep * per_rank


def test_mla_is_split_by_heads_with_its_latent_projections_whole():
    """DeepSeek-V3's plan (so Kimi-K2's) in transformers leaves attention out; the split adds it by heads."""
    config = load_config(reduce_for_layout(load("kimi-k2-instruct.json"), tp=2, ep=2).config)
    model = build_random_model(config, dtype=torch.float32, device=torch.device("cpu"), seed=0)
    entries, decided = mla_head_plan(model, dict(model.tp_plan), 2)
    assert decided["split"] == ["model.layers.*.self_attn.kv_b_proj", "model.layers.*.self_attn.o_proj",
                                "model.layers.*.self_attn.q_b_proj"]
    assert decided["replicated"] == ["model.layers.*.self_attn.kv_a_proj_with_mqa", "model.layers.*.self_attn.q_a_proj"]
    assert entries["model.layers.*.self_attn.o_proj"] == "rowwise"
    # Three heads cannot go to two ranks: attention stays whole, and the decision says why.
    assert mla_head_plan(model, dict(model.tp_plan), 3) == ({}, {"kept_whole": "2 heads do not split over 3 ranks"})


def test_a_wrong_expert_placement_is_named():
    layer = "model.layers.1.mlp.experts"
    assert placement_problems([{layer: [0, 1]}, {layer: [2, 3]}], {layer: 2}) == []
    doubled = placement_problems([{layer: [0, 1]}, {layer: [0, 1]}], {layer: 2})
    assert doubled == [f"{layer}: rank 1 holds experts 0–1 but is sent the tokens of experts 2–3; experts 0–1 held "
                       "by more than one rank; experts 2–3 held by no rank"]
    swapped = placement_problems([{layer: [2, 3]}, {layer: [0, 1]}], {layer: 2})
    assert "rank 0 holds experts 2–3 but is sent the tokens of experts 0–1" in swapped[0]
    assert "more than one" not in swapped[0]
    with pytest.raises(ValueError, match="needs expert parallelism"):
        parse_fault("corrupt_experts", 2, ep=1)


def held_within_tolerance_of_ideal(report: dict) -> bool:
    return all(abs(rank["held_share"] / rank["ideal_share"] - 1) <= 0.10 for rank in report["split"]["ranks"])


@pytest.mark.slow
def test_deepseek_v3_at_a_plan_with_ep_exercises_ep_splits_mla_and_catches_a_misplaced_expert_block():
    """Acceptance 3 of issue 31: a TP8 + EP8 plan on 2 ranks is EP2 x TP2: tokens travel to their experts' ranks,
    MLA is split by heads, each rank holds its layout's share; the same run with the last rank given its
    neighbour's experts fails, saying where the experts are."""
    planned = {"tp": 8, "pp": 1, "dp": 1, "ep": 8, "nodes": 1}
    layout, _ = scaled_from_plan(planned, 2)
    report = run_sharded(load("deepseek-v3.json"), tp=layout.tp, ep=layout.ep, planned=planned, decode_steps=4,
                         timeout_s=240)
    assert report["correct"] and report["greedy_match"], report["summary"]
    axes = report["axes"]
    assert axes["ep"]["exercised"] and axes["ep"]["placement_ok"] and axes["ep"]["all_to_all_calls"] > 0
    assert axes["tp"]["exercised"] and axes["tp"]["mla"].startswith("split by heads")
    assert "model.layers.*.self_attn.kv_b_proj" in report["layout"]["mla"]["split"]
    assert held_within_tolerance_of_ideal(report) and report["split"]["within_tolerance"]
    # MLA split: each rank holds little more than half (norms, routers and latents stay whole), not 3/4 as before.
    assert all(rank["held_share"] < 0.6 for rank in report["split"]["ranks"])
    assert report["summary"].startswith("EP2 × TP2 on 2 ranks (plan TP8 + EP8 on 8 devices): matched the reference")
    assert "axes: EP2 (4 experts per rank), TP2 (MLA split by heads" in report["summary"]

    misplaced = run_sharded(load("deepseek-v3.json"), tp=layout.tp, ep=layout.ep, planned=planned, decode_steps=4,
                            fault="corrupt_experts", timeout_s=240)
    assert misplaced["correct"] is False
    assert misplaced["reason"] == ("expert placement: model.layers.1.mlp.experts: rank 1 holds experts 0–3 but is "
                                   "sent the tokens of experts 4–7; experts 0–3 held by more than one rank; experts "
                                   "4–7 held by no rank")
    assert not misplaced["axes"]["ep"]["placement_ok"]
    assert "did NOT match the reference: expert placement" in misplaced["summary"]


@pytest.mark.slow
def test_kimi_k2_at_its_dp16_ep16_plan_runs_ep2_with_dp_attention_and_a_mis_split_shard_is_caught():
    layout, _ = scaled_from_plan(KIMI_PLAN, 2)
    report = run_sharded(load("kimi-k2-instruct.json"), tp=layout.tp, ep=layout.ep, planned=KIMI_PLAN,
                         decode_steps=2, timeout_s=240)
    assert report["correct"] and set(report["axes"]) == {"ep"} and report["axes"]["ep"]["exercised"]
    # DP attention: every rank keeps attention whole and half the routed experts, as the layout says.
    assert held_within_tolerance_of_ideal(report)
    assert report["summary"].startswith("EP2 × TP1 on 2 ranks (plan DP16 + EP16 on 16 devices): matched the "
                                        "reference")
    corrupted = run_sharded(load("kimi-k2-instruct.json"), tp=layout.tp, ep=layout.ep, planned=KIMI_PLAN,
                            decode_steps=2, fault="corrupt_shard", timeout_s=240)
    assert corrupted["correct"] is False and "held by more than one rank" in corrupted["reason"]
    assert corrupted["ranks"][1]["corrupted"] == {"experts": ["model.layers.1.mlp.experts"]}
