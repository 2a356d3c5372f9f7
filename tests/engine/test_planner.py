"""The planner against the layouts vendors publish for serving the largest open models.

Recipes matched (memory figures are the planner's own; the recipes say which splits and how many nodes):
- Kimi-K2 (Moonshot's deployment guide, and vLLM's recipe): FP8 weights on 16 H200/H20 GPUs, either TP8 x PP2
  across two nodes or DP16 + EP (data-parallel attention, experts spread over all 16 GPUs).
- DeepSeek-V3 (SGLang's DeepSeek-V3 guide; vLLM's recipe): FP8 on one node of 8 x H200; bf16 on two nodes of
  8 x H100/H200.
- Llama-3.1-405B (Meta's model card and vLLM's distributed-serving docs): FP8 on one node of 8 x H100; bf16 on two
  nodes (16 x H100), TP8 inside each node and PP2 across them.

vLLM splits a pipeline's layers with ``get_pp_indices`` (vllm/distributed/utils.py): as even as possible, the extra
layers going to the stages before the last, from the second-to-last backwards.
"""

import functools

import pytest

from workers.engine.analysis import analyze, load_config_file, plan_from_analysis
from workers.engine.pipeline_stages import stage_layer_ranges

from .conftest import CONFIGS

H200 = {"devices_per_node": 8, "device_memory_bytes": 141 * 10**9, "device_name": "NVIDIA H200"}
# What nvidia-smi reports for an H100 80GB HBM3: 81559 MiB.
H100 = {"devices_per_node": 8, "device_memory_bytes": 81559 * 2**20, "device_name": "NVIDIA H100 80GB HBM3"}


@functools.lru_cache(maxsize=None)
def analysis(name: str) -> dict:
    return analyze(load_config_file(CONFIGS / f"{name}.json"))


def plans(name: str, devices: dict, nodes: int, precision: str, **workload) -> dict:
    return plan_from_analysis(analysis(name), {**devices, "nodes": nodes}, precision, workload or None)


def layout_of(plan: dict, **split) -> dict | None:
    return next((layout for layout in plan["layouts"] if all(layout[key] == value for key, value in split.items())),
                None)


# --- the stage split ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layers, pp, sizes", [
    (61, 2, [31, 30]),            # vLLM's docs: DeepSeek-V3 / Kimi-K2 on two stages
    (61, 4, [15, 15, 16, 15]),    # the extra layer on the second-to-last stage
    (10, 4, [2, 3, 3, 2]),        # two extra: second-to-last and the one before it
    (7, 4, [2, 2, 2, 1]),         # pp - 1 extra: every stage but the last
    (126, 4, [31, 32, 32, 31]),   # Llama-3.1-405B
    (32, 4, [8, 8, 8, 8]),
])
def test_stages_split_as_vllms_get_pp_indices_does(layers, pp, sizes):
    ranges = stage_layer_ranges(layers, pp)
    assert [len(stage) for stage in ranges] == sizes
    assert [stage.start for stage in ranges] == [sum(sizes[:index]) for index in range(pp)]


def test_the_plan_shows_the_stage_sizes_it_planned_with():
    plan = plans("llama-3.1-405b", H100, 2, "bf16")
    uneven = [layout for layout in plan["layouts"] + plan["smallest_layouts"] if 126 % layout["pp"]]
    assert uneven, "a pipeline that does not divide 126 layers is planned"
    for layout in plan["layouts"] + plan["smallest_layouts"]:
        assert layout["stage_layers"] == [len(stage) for stage in stage_layer_ranges(126, layout["pp"])]
        assert [stage["layers"] for stage in layout["stages"]] == [
            [stage.start, stage.stop - 1] for stage in stage_layer_ranges(126, layout["pp"])]


# --- the recipes --------------------------------------------------------------------------------------------------

def test_kimi_k2_fp8_at_128k_context_is_planned_on_16_h200s_as_its_recipes_are():
    """Moonshot/vLLM: 16 GPUs, TP8 x PP2 or DP16 + EP. Before uneven stages only PP 1 or 61 could split 61 layers,
    and the plan was 61 devices on 8 nodes."""
    plan = plans("kimi-k2-instruct", H200, 2, "fp8", concurrency=1, context_tokens=131072)
    assert plan["fits"] and not plan["one_node"]["fits"]
    first = plan["layouts"][0]
    assert first["devices"] <= 16 and first["nodes"] <= 2 and first["rank"] == 1
    assert plan["minimum_devices"] <= 16 and plan["nodes_needed"] == 2
    tp8_pp2 = layout_of(plan, tp=8, pp=2, dp=1, ep=1)
    assert tp8_pp2 is not None and tp8_pp2["stage_layers"] == [31, 30] and tp8_pp2["nodes"] == 2
    assert "2 stages, one per node" in tp8_pp2["placement"]
    dp16_ep = layout_of(plan, tp=1, pp=1, dp=16, ep=16)
    assert dp16_ep is not None and dp16_ep["fits"]
    # One sequence, 16 replicas: DP beyond the concurrency is planned because EP spreads the experts over them.
    assert any("16 replicas for 1 sequence(s)" in note for note in dp16_ep["notes"])


def test_deepseek_v3_needs_two_h200_nodes_in_bf16_and_one_in_fp8():
    """SGLang's guide: FP8 on one 8 x H200 node; bf16 on two nodes."""
    bf16_one = plans("deepseek-v3", H200, 1, "bf16")
    assert not bf16_one["fits"] and bf16_one["nodes_needed"] == 2 and bf16_one["minimum_devices"] > 8
    bf16_two = plans("deepseek-v3", H200, 2, "bf16")
    assert bf16_two["fits"] and not bf16_two["one_node"]["fits"] and bf16_two["layouts"][0]["nodes"] == 2
    fp8 = plans("deepseek-v3", H200, 1, "fp8")
    assert fp8["fits"] and fp8["nodes_needed"] == 1 and fp8["layouts"][0]["devices"] <= 8


def test_llama_405b_needs_two_h100_nodes_in_bf16_and_one_in_fp8():
    """Meta / vLLM: FP8 on one 8 x H100 node; bf16 on 16 H100s, TP8 in a node x PP2 across two."""
    bf16_one = plans("llama-3.1-405b", H100, 1, "bf16")
    assert not bf16_one["fits"] and bf16_one["nodes_needed"] == 2
    bf16_two = plans("llama-3.1-405b", H100, 2, "bf16")
    first = bf16_two["layouts"][0]
    assert (first["tp"], first["pp"], first["dp"], first["stage_layers"]) == (8, 2, 1, [63, 63])
    fp8 = plans("llama-3.1-405b", H100, 1, "fp8")
    assert fp8["fits"] and (fp8["layouts"][0]["tp"], fp8["layouts"][0]["pp"], fp8["layouts"][0]["nodes"]) == (8, 1, 1)


# --- what each plan states ----------------------------------------------------------------------------------------

def test_each_plan_states_its_per_device_memory_by_stage():
    plan = plans("deepseek-v3", H200, 2, "bf16")
    for layout in plan["layouts"] + plan["smallest_layouts"]:
        memory = layout["per_device_bytes"]
        assert memory["total"] == pytest.approx(memory["weights"] + memory["kv_cache"] + memory["activations"]
                                                + memory["runtime_overhead"], abs=4)
        assert memory["total"] <= memory["usable"] == int(141 * 10**9 * 0.9)
        # The breakdown shown is the heaviest stage's; every stage is listed and none is heavier.
        heaviest = layout["stages"][layout["heaviest_stage"]]
        assert (heaviest["weights"], heaviest["kv_cache"], heaviest["total"]) == (
            memory["weights"], memory["kv_cache"], memory["total"])
        assert max(stage["total"] for stage in layout["stages"]) == memory["total"]
        assert layout["tp"] <= 8 and 128 % layout["tp"] == 0 and 256 % layout["ep"] == 0


def test_the_stages_hold_the_whole_model_once():
    """Without TP or EP the stages' weights add up to the model's (Llama's head is not tied: nothing is copied)."""
    report = analysis("llama-3.1-405b")
    plan = plan_from_analysis(report, {**H100, "devices_per_node": 1, "nodes": 32}, "bf16")
    layout = plan["smallest_layouts"][0]
    assert (layout["tp"], layout["dp"]) == (1, 1) and layout["pp"] > 1
    assert sum(stage["weights"] for stage in layout["stages"]) == pytest.approx(report["weights_bytes"]["bf16"],
                                                                                abs=layout["pp"])


def test_each_plan_says_why_it_ranks_where_it_does():
    plan = plans("deepseek-v3", H200, 2, "bf16")
    ranked = plan["layouts"]
    assert [layout["rank"] for layout in ranked] == list(range(1, len(ranked) + 1))
    rates = [layout["decode_tokens_per_s"] for layout in ranked]
    assert rates == sorted(rates, reverse=True)
    assert ranked[0]["reason"].startswith(f"#1 of {plan['layouts_fitting']} that fit: the highest predicted")
    for index, layout in enumerate(ranked[1:], 1):
        equal = rates.index(layout["decode_tokens_per_s"])
        if equal < index:  # equals one ranked above: says which
            assert f"ties with #{equal + 1} " in layout["reason"] or f"as fast as #{equal + 1} " in layout["reason"]
        else:
            below = 100 * (1 - layout["decode_tokens_per_s"] / rates[0])
            assert f"{below:.1f}% below #1" in layout["reason"] and "of weights" in layout["reason"]
    fewest = plan["smallest_layouts"][0]
    assert fewest["devices"] == plan["minimum_devices"] and fewest["reason"].endswith("the fewest devices that fit")


def test_data_parallel_goes_beyond_the_concurrency_only_with_expert_parallelism():
    """An idle replica raises no decode rate unless it holds experts that every token's step would read."""
    dense = plans("llama-3.1-405b", H100, 4, "fp8", concurrency=1)
    assert dense["layouts"] and all(layout["dp"] == 1 for layout in dense["layouts"])
    moe = plans("deepseek-v3", H200, 4, "fp8", concurrency=1)
    beyond = [layout for layout in moe["layouts"] if layout["dp"] > 1]
    assert beyond and all(layout["ep"] == layout["tp"] * layout["dp"] for layout in beyond)
    # Spreading the experts thinner makes each step read less: the widest EP at TP 8 beats TP 8 alone.
    widest = max((layout for layout in moe["layouts"] if layout["tp"] == 8 and layout["pp"] == 1),
                 key=lambda layout: layout["ep"])
    alone = layout_of(moe, tp=8, pp=1, dp=1)
    assert widest["ep"] > 8 and widest["decode_tokens_per_s"] > alone["decode_tokens_per_s"]


def test_tensor_parallel_stays_inside_a_node():
    plan = plans("llama-3.1-405b", {**H100, "devices_per_node": 4}, 8, "bf16")
    assert plan["fits"] and all(layout["tp"] <= 4 for layout in plan["layouts"] + plan["smallest_layouts"])


@pytest.mark.parametrize("name, precision, concurrency", [("deepseek-v3", "bf16", 32), ("llama-3.1-405b", "bf16", 8),
                                                          ("kimi-k2-instruct", "fp8", 1)])
def test_the_search_for_the_fewest_stages_misses_no_layout(name, precision, concurrency):
    """The planner checks one memory figure per TP x stages (see ``most_sequences``) instead of every layout; a
    brute force over every tp x pp x dp x ep of two H200 nodes finds the same fewest devices, and one stage fewer
    than planned never fits."""
    from workers.engine.analysis.planner import LayoutEvaluator, Workload, _model_from_inputs, cluster_from

    cluster = cluster_from({**H200, "nodes": 2})
    model = _model_from_inputs(analysis(name)["planner"], precision)
    evaluator = LayoutEvaluator(model, cluster, Workload(concurrency=concurrency), 4.8e12)
    fitting = [tp * pp * dp for tp in (1, 2, 4, 8) for pp in range(1, 17) for dp in range(1, 17 // (tp * pp) + 1)
               for ep in {1, tp * dp if model.experts and model.experts % (tp * dp) == 0 else 1}
               if tp * pp * dp <= 16 and (dp <= concurrency or ep > 1) and evaluator.refusal(tp, pp, ep) is None
               and evaluator.peak_bytes(tp, pp, dp, ep) <= evaluator.usable]
    plan = plan_from_analysis(analysis(name), {**H200, "nodes": 2}, precision, {"concurrency": concurrency})
    assert plan["minimum_devices"] == min(fitting)
    for layout in plan["layouts"]:
        if layout["pp"] > 1:
            assert evaluator.peak_bytes(layout["tp"], layout["pp"] - 1, layout["dp"], layout["ep"]) > evaluator.usable


# --- no figures for the node ----------------------------------------------------------------------------------------

CPU_NODE = {"devices_per_node": 1, "device_memory_bytes": 64 * 2**30, "device_name": "cpu"}


def test_a_node_with_no_env_check_gets_no_other_devices_peak_but_no_figures():
    """Before any env check a CPU node's plan assumed an A100's 2.039 TB/s: it now says it has no figures, predicts
    no decode rate, and still ranks its layouts (by the bytes a decode step reads)."""
    plan = plans("llama-3.1-8b", CPU_NODE, 1, "bf16", concurrency=4)
    assert plan["memory_bandwidth"]["bytes_per_s"] is None
    assert plan["memory_bandwidth"]["source"].startswith("no figures for this node")
    assert plan["fits"] and plan["layouts"]
    for layout in plan["layouts"] + plan["smallest_layouts"]:
        assert layout["decode_tokens_per_s"] is None and layout["inter_token_latency_ms"] is None
    assert plan["layouts"][0]["reason"].startswith("#1 of") and "no decode rate is predicted" in \
        plan["layouts"][0]["reason"]


def test_a_device_is_not_guessed_from_its_memory_size():
    """141 GB of memory is an H200's size, but a device that does not name itself one gets no H200 figures."""
    plan = plans("llama-3.1-8b", {**H200, "device_name": "Some accelerator"}, 1, "bf16")
    assert plan["memory_bandwidth"]["bytes_per_s"] is None


def test_without_figures_the_layouts_rank_as_any_one_bandwidth_would_rank_them():
    named = plans("deepseek-v3", H200, 2, "bf16")
    unnamed = plans("deepseek-v3", {**H200, "device_name": None}, 2, "bf16")
    split = ("tp", "pp", "dp", "ep")
    assert [[layout[key] for key in split] for layout in unnamed["layouts"]] == \
        [[layout[key] for key in split] for layout in named["layouts"]]
    reads = [sum(layout["decode_step_read_bytes"].values()) for layout in unnamed["layouts"]]
    assert reads == sorted(reads)
    second = unnamed["layouts"][1]
    more = 100 * (reads[1] / reads[0] - 1)
    assert f"reads {more:.1f}% more per decode step than #1" in second["reason"] or "ties with #1" in second["reason"]


def test_a_measured_bandwidth_is_used_as_measured():
    plan = plans("llama-3.1-8b", {**CPU_NODE, "memory_bandwidth_bytes_per_s": 20e9}, 1, "bf16", concurrency=4)
    assert plan["memory_bandwidth"]["bytes_per_s"] == 20e9 and "env check" in plan["memory_bandwidth"]["source"]
    assert plan["layouts"][0]["decode_tokens_per_s"] > 0
