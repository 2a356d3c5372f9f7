"""Tuning sweeps (workers/engine/sweep): the metrics against hand-computed values from synthetic timestamps, the
roofline against hand-computed costs, both searches with scripted trials, and real sweeps of a reduced Qwen3 served
on the CPU by transformers' continuous batching. No database: the engine is plain Python."""

import json
import math
import subprocess
import sys

import numpy
import pytest
import torch

from workers.engine.parameters import ParameterError, validate
from workers.engine.sweep import PARAMETERS, SweepFailed, run_sweep, sweep_stage
from workers.engine.sweep import backends
from workers.engine.sweep.backends import BACKENDS, TransformersContinuousBatching, TrialParams
from workers.engine.sweep.metrics import RequestRecord, percentile, summarize
from workers.engine.sweep.benchmark_model import dynamic_int8_unsupported
from workers.engine.sweep.roofline import ModelCost, model_cost, predict
from workers.engine.sweep.search import configurations, grid_search, successive_halving
from workers.engine.sweep.workload import Workload

from .conftest import CONFIGS, ROOT

QWEN3_PATH = CONFIGS / "qwen3-0.6b.json"
QWEN3 = json.loads(QWEN3_PATH.read_text())
TRIAL_KEYS = {"id", "rung", "params", "workload", "status", "reason", "metrics", "roofline", "details", "repeats"}
METRIC_KEYS = {"completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
               "output_tokens_per_s", "requests_per_s", "total_tokens_per_s", "ttft_s", "tpot_s", "itl_s",
               "e2e_latency_s", "e2e_latency_samples_s", "slo", "good_requests", "goodput_requests_per_s",
               "peak_memory_bytes",
               "peak_memory_source", "kv_cache_bytes", "weight_bytes"}
DISTRIBUTION_KEYS = {"mean", "p50", "p90", "p99", "count"}
SLO = {"ttft_s": 30.0, "tpot_s": 10.0}


# Synthetic timestamps (seconds). A: 4 tokens; B: 2 tokens, sent later; C: a single token; D: failed.
SYNTHETIC = [
    RequestRecord(send_time=0.00, token_times=[0.10, 0.12, 0.15, 0.20], prompt_tokens=8),
    RequestRecord(send_time=0.05, token_times=[0.30, 0.31], prompt_tokens=4),
    RequestRecord(send_time=0.10, token_times=[0.20], prompt_tokens=4),
    RequestRecord(send_time=0.00, token_times=[], prompt_tokens=4, error="boom"),
]


def test_ttft_tpot_itl_and_e2e_match_hand_computed_values():
    a, b, c, _ = SYNTHETIC
    assert a.ttft == pytest.approx(0.10) and b.ttft == pytest.approx(0.25) and c.ttft == pytest.approx(0.10)
    # TPOT = (E2E - TTFT) / (output tokens - 1): (0.20 - 0.10) / 3 and (0.26 - 0.25) / 1; none for one token.
    assert a.tpot == pytest.approx(0.1 / 3) and b.tpot == pytest.approx(0.01) and c.tpot is None
    assert a.inter_token_latencies == pytest.approx([0.02, 0.03, 0.05]) and c.inter_token_latencies == []
    assert (a.e2e_latency, b.e2e_latency, c.e2e_latency) == pytest.approx((0.20, 0.26, 0.10))


def test_the_summary_pools_requests_as_vllm_does():
    metrics = summarize(SYNTHETIC)
    # Duration: first send (0.00) to last token (0.31); the failed request counts as failed, nowhere else.
    assert metrics["completed"] == 3 and metrics["failed"] == 1
    assert metrics["duration_s"] == pytest.approx(0.31)
    assert metrics["total_output_tokens"] == 7 and metrics["total_input_tokens"] == 16
    assert metrics["output_tokens_per_s"] == pytest.approx(7 / 0.31)
    assert metrics["requests_per_s"] == pytest.approx(3 / 0.31)
    assert metrics["total_tokens_per_s"] == pytest.approx(23 / 0.31)
    # TTFT [0.10, 0.25, 0.10] -> sorted [0.10, 0.10, 0.25]; p90 sits at rank 1.8: 0.10 + 0.8 x 0.15.
    assert metrics["ttft_s"] == pytest.approx({"mean": 0.15, "count": 3, "p50": 0.10, "p90": 0.22, "p99": 0.247})
    # TPOT only from requests with more than one token: [1/30, 0.01].
    assert metrics["tpot_s"]["count"] == 2 and metrics["tpot_s"]["mean"] == pytest.approx((1 / 30 + 0.01) / 2)
    # ITL: every gap of every request, [0.02, 0.03, 0.05, 0.01] -> sorted [0.01, 0.02, 0.03, 0.05].
    assert metrics["itl_s"] == pytest.approx({"mean": 0.0275, "count": 4, "p50": 0.025, "p90": 0.044, "p99": 0.0494})
    assert metrics["e2e_latency_s"]["mean"] == pytest.approx(0.56 / 3) and metrics["e2e_latency_s"]["p50"] == 0.20
    assert metrics["goodput_requests_per_s"] is None


def test_goodput_counts_requests_meeting_every_slo_per_second():
    # A misses the TPOT SLO (1/30 > 0.02), B the TTFT SLO (0.25 > 0.2); C has one token, so its TPOT counts as 0.
    metrics = summarize(SYNTHETIC, {"ttft_s": 0.2, "tpot_s": 0.02})
    assert metrics["good_requests"] == 1
    assert metrics["goodput_requests_per_s"] == pytest.approx(1 / 0.31)
    assert summarize(SYNTHETIC, {"ttft_s": 0.3})["goodput_requests_per_s"] == pytest.approx(3 / 0.31)
    assert summarize(SYNTHETIC, {"e2e_latency_s": 0.2})["good_requests"] == 2


def test_percentiles_interpolate_like_numpy():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.05]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(numpy.percentile(values, q))


def test_a_trial_with_no_completed_request_has_no_rates():
    assert summarize([RequestRecord(0.0, [], 4, error="x")]) == {"completed": 0, "failed": 1}


def test_workload_lengths_are_fixed_uniform_or_a_list():
    fixed = Workload.from_dict({"requests": 3, "prompt_len": 5, "output_len": [2, 3]}).measured_requests(100)
    assert [len(request.prompt_ids) for request in fixed] == [5, 5, 5]
    assert [request.output_tokens for request in fixed] == [2, 3, 2]
    uniform = Workload.from_dict({"requests": 50, "prompt_len": {"uniform": [4, 8]}}).measured_requests(100)
    assert {len(request.prompt_ids) for request in uniform} <= set(range(4, 9))
    assert len({len(request.prompt_ids) for request in uniform}) > 1
    assert all(0 <= token < 100 for request in uniform for token in request.prompt_ids)
    assert [r.prompt_ids for r in uniform] == [r.prompt_ids for r in Workload.from_dict(
        {"requests": 50, "prompt_len": {"uniform": [4, 8]}}).measured_requests(100)]


def test_poisson_arrivals_are_seeded_and_spaced_at_the_rate():
    workload = Workload.from_dict({"requests": 400, "arrival": "poisson", "rate": 50.0})
    arrivals = [request.arrival_s for request in workload.measured_requests(100)]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    assert arrivals[-1] / 399 == pytest.approx(1 / 50, rel=0.15)
    assert workload.in_flight_limit(batch_size=4) is None
    assert Workload.from_dict({"concurrency": 3}).in_flight_limit(batch_size=8) == 3


def test_warm_up_prompts_differ_from_measured_ones_and_short_runs_fill_a_batch():
    workload = Workload.from_dict({"requests": 18})
    warmup = workload.warmup(vocab_size=512, batch_size=4)
    assert len(warmup) == 4 and all(request.output_tokens == 2 for request in warmup)
    assert warmup[0].prompt_ids != workload.measured_requests(512)[0].prompt_ids
    assert workload.scaled(1 / 9, min_requests=4).requests == 4
    assert workload.scaled(1 / 3, min_requests=4).requests == 6
    assert workload.scaled(1, min_requests=32).requests == 18


@pytest.mark.parametrize("bad", [{"prompt_len": 0}, {"output_len": {"uniform": [8, 4]}}, {"arrival": "poisson"},
                                 {"rate": 3.0}, {"slo": {"ttft": 1}}, {"requests": 0}, {"prompt": 3}])
def test_it_rejects_a_malformed_workload(bad):
    with pytest.raises(ValueError):
        Workload.from_dict(bad)


def test_the_roofline_matches_hand_computed_costs():
    # 1000 active parameters of 4 bytes; two attention layers of 10 KV bytes per token, the second windowed to 4.
    cost = ModelCost(parameters=1000, active_parameters=1000, dense_weight_bytes=4000, expert_weight_bytes=0,
                     experts=0, experts_per_token=0, kv_layers=((10, None), (10, 4)))
    assert cost.kv_bytes_per_token == 20 and cost.kv_bytes(3) == 60 and cost.kv_bytes(8) == 120
    prediction = predict(cost, [(4, 3), (4, 3)], concurrency=2, max_batch_tokens=8, flops_per_s=1e6,
                         bytes_per_s=1e5)
    prefill, decode = prediction["prefill"], prediction["decode"]
    # Prefill: 8 prompt tokens in one step; 2 x 1000 x 8 FLOPs; weights once + 2 x kv_bytes(4) = 4000 + 160 bytes.
    assert (prefill["steps"], prefill["flops"], prefill["bytes"]) == (1, 16000, 4160)
    assert prefill["seconds"] == pytest.approx(4160 / 1e5) and prefill["bound"] == "memory-bound"
    # Decode: tokens 2 and 3 of each request (4 in all) in 2 steps of 2; each reads its context of 5 then 6 tokens.
    assert (decode["steps"], decode["flops"], decode["bytes"]) == (2, 8000, 2 * 4000 + 2 * (90 + 100))
    assert decode["step_seconds"] == pytest.approx(8380 / 1e5 / 2)
    assert prediction["seconds"] == pytest.approx((4160 + 8380) / 1e5)
    assert prediction["ridge_point"] == 10 and prediction["arithmetic_intensity"] == pytest.approx(24000 / 12540)
    fast_memory = predict(cost, [(4, 3)], concurrency=1, max_batch_tokens=8, flops_per_s=1e6, bytes_per_s=1e9)
    assert fast_memory["prefill"]["bound"] == "compute-bound" and fast_memory["bound"] == "compute-bound"


def test_routed_experts_count_for_the_share_a_step_touches():
    cost = ModelCost(parameters=0, active_parameters=0, dense_weight_bytes=100, expert_weight_bytes=400, experts=4,
                     experts_per_token=1, kv_layers=())
    # Under uniform top-1 routing over 4 experts, t tokens touch 4 x (1 - (3/4)^t) experts on average.
    assert cost.weight_bytes_per_step(1) == pytest.approx(200)
    assert cost.weight_bytes_per_step(2) == pytest.approx(100 + 400 * 1.75 / 4)


def test_the_cost_model_counts_the_built_models_parameters():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    cost = model_cost(model, lambda module, parameter: parameter.element_size(), activation_bytes=4)
    total = sum(parameter.numel() for parameter in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert experts > 0 and cost.parameters == total
    # The untied input embedding is a lookup; routed experts count for top-k / experts = 2 / 8.
    assert cost.active_parameters == total - 64 * 32 - experts + experts // 4
    assert cost.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4  # layers x (K and V) x KV heads x head_dim x fp32


def _scripted_trial(out_of_memory_from: int):
    """Trials whose throughput grows with batch and page size, running out of memory at large fp32 batches."""
    calls = []

    def run_trial(params: TrialParams, workload: Workload) -> dict:
        calls.append((params, workload.requests))
        oom = params.precision == "fp32" and params.batch_size >= out_of_memory_from
        return {"params": params.as_dict(), "workload": {"requests": workload.requests, "arrival": "closed"},
                "status": "oom" if oom else "ok", "reason": "CUDA out of memory" if oom else None,
                "metrics": None if oom else {"output_tokens_per_s": 100.0 * params.batch_size + params.page_size},
                "roofline": None, "details": {}}

    return run_trial, calls


GRID = {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4, 8, 16], "page_size": [16, 32],
        "max_batch_tokens": [256]}


def test_the_grid_runs_every_configuration_and_records_out_of_memory():
    run_trial, calls = _scripted_trial(out_of_memory_from=8)
    workload = Workload.from_dict({"requests": 18})
    outcome = grid_search(configurations(GRID), workload, run_trial, lambda fraction, message: None)
    assert outcome["trials_run"] == len(calls) == 20 and outcome["requests_served"] == 20 * 18
    assert sum(trial["status"] == "oom" for trial in outcome["trials"]) == 4
    assert all(requests == 18 for _, requests in calls) and outcome["seconds"] >= 0


def test_successive_halving_finds_the_grids_best_serving_fewer_requests_and_skips_what_would_run_out_of_memory():
    run_trial, calls = _scripted_trial(out_of_memory_from=8)
    workload = Workload.from_dict({"requests": 18})
    progress = []
    outcome = successive_halving(configurations(GRID), workload, run_trial, lambda f, m: progress.append(f))
    trials = {trial["id"]: trial for trial in outcome["trials"]}
    oom = [trial for trial in trials.values() if trial["status"] == "oom"]
    skipped = [trial for trial in trials.values() if trial["status"] == "skipped"]
    # fp32 batch 8 page 16 runs out of memory; batch 8 page 32 and batch 16 (both pages) are at least as large.
    assert [trial["params"]["batch_size"] for trial in oom] == [8]
    assert sorted((t["params"]["batch_size"], t["params"]["page_size"]) for t in skipped) == [(8, 32), (16, 16),
                                                                                              (16, 32)]
    assert all(f"trial {oom[0]['id']}" in trial["reason"] for trial in skipped)
    assert outcome["trials_run"] == len(calls) and outcome["requests_served"] < 20 * 18
    # Rung 0 serves 1/9 of the workload, but at least one full batch; the last rung the full workload.
    first_rung = [requests for params, requests in calls[:4]]
    assert first_rung == [max(2, params.batch_size) for params, _ in calls[:4]]
    last = [trial for trial in trials.values() if trial["rung"] == outcome["rungs"][-1]["rung"]]
    assert all(trial["workload"]["requests"] == 18 for trial in last if trial["status"] == "ok")
    best = max((t for t in last if t["status"] == "ok"), key=lambda t: t["metrics"]["output_tokens_per_s"])
    assert best["params"] == {"precision": "bf16", "batch_size": 16, "page_size": 32, "max_batch_tokens": 256}
    assert progress == sorted(progress) and progress[-1] < 1


def test_it_rejects_an_unknown_grid_key_or_empty_values():
    with pytest.raises(ValueError, match="unknown grid keys"):
        configurations({"block_size": [16]})
    with pytest.raises(ValueError):
        configurations({"batch_size": []})


def test_a_real_engine_as_the_proxy_backend_is_refused_pointing_to_serve_sweep():
    for name in ("vllm", "sglang"):
        with pytest.raises(ParameterError, match=f"serve_sweep stage on a node started with --engine {name}=PYTHON"):
            validate("sweep", PARAMETERS, {"backend": name})
    with pytest.raises(ParameterError, match="one of transformers"):
        validate("sweep", PARAMETERS, {"backend": "tgi"})
    assert list(BACKENDS) == ["transformers"] and BACKENDS["transformers"].available()
    assert "CPU kernels only" in dynamic_int8_unsupported(torch.device("cuda"))


def _assert_complete_trial(trial: dict, slo: dict) -> None:
    assert set(trial) == TRIAL_KEYS and trial["status"] == "ok", trial["reason"]
    metrics = trial["metrics"]
    assert set(metrics) == METRIC_KEYS and metrics["failed"] == 0
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_latency_s"):
        assert set(metrics[key]) == DISTRIBUTION_KEYS and metrics[key]["mean"] > 0
    assert metrics["slo"] == slo and metrics["goodput_requests_per_s"] > 0
    assert metrics["output_tokens_per_s"] > 0 and metrics["peak_memory_bytes"] > 0 and metrics["kv_cache_bytes"] > 0
    roofline = trial["roofline"]
    assert roofline["predicted_seconds"] > 0 and roofline["steps"] > 0 and roofline["end_to_end_efficiency"] > 0
    # An efficiency is a figure at most 1, or absent and the trial flagged
    assert 0 < roofline["efficiency"] <= 1 if roofline["flag"] is None else roofline["efficiency"] is None
    assert roofline["bound"] in ("memory-bound", "compute-bound")
    assert {roofline["prefill"]["bound"], roofline["decode"]["bound"]} <= {"memory-bound", "compute-bound"}


@pytest.fixture(scope="module")
def twelve_configuration_sweep():
    grid = {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16, 32], "max_batch_tokens": [32]}
    workload = {"requests": 4, "prompt_len": {"uniform": [8, 16]}, "output_len": 5, "slo": SLO}
    return run_sweep(QWEN3, grid=grid, workload=workload, search="grid", device="cpu")


@pytest.mark.slow
def test_a_twelve_configuration_sweep_of_the_reduced_model_stores_every_metric_per_trial(twelve_configuration_sweep):
    result = twelve_configuration_sweep
    assert result["model"]["reduced"] and result["model"]["layers"] == 2 and result["model"]["model_type"] == "qwen3"
    assert result["search"]["trials_run"] == len(result["trials"]) == 12
    for trial in result["trials"]:
        _assert_complete_trial(trial, SLO)
        assert trial["metrics"]["completed"] == 4 and trial["metrics"]["total_output_tokens"] == 4 * 5
        assert trial["details"]["max_requests_per_batch"] == trial["params"]["batch_size"]
    seen = {(t["params"]["precision"], t["params"]["batch_size"], t["params"]["page_size"]) for t in result["trials"]}
    assert len(seen) == 12
    # The best is picked among the first pass's top three by serving them again, its figures the re-measured ones
    top = sorted(result["trials"], key=lambda trial: -trial["metrics"]["output_tokens_per_s"])[:3]
    confirmation = result["confirmation"]
    assert [row["id"] for row in confirmation["candidates"]] == [trial["id"] for trial in top]
    picked = max(confirmation["candidates"], key=lambda row: row["remeasured"])
    assert result["best"]["id"] == confirmation["picked"] == picked["id"] and result["best"]["remeasured"]
    # Judged on the re-measured runs: confirmed only when they all beat the runner-up's
    verdict = result["verdict"]
    assert verdict["winner"]["id"] == picked["id"] and verdict["winner"]["runs"] == picked["repeats"][
        "output_tokens_per_s"]
    assert result["best"]["confirmed"] == (verdict["verdict"] == "confirmed") == (
        verdict["winner"]["min"] > verdict["runner_up"]["max"])
    assert result["knobs_not_swept"] is None  # Qwen3 pages: its two page sizes were swept
    assert result["best"]["metrics"]["output_tokens_per_s"] == picked["remeasured"]
    assert result["best"]["first_pass_output_tokens_per_s"] == picked["first_pass"]
    assert result["best"]["repeats"]["count"] == 3


@pytest.mark.slow
def test_the_sweep_states_the_bandwidth_and_flops_it_used_and_where_they_came_from(twelve_configuration_sweep):
    roofline = twelve_configuration_sweep["roofline"]
    assert roofline["memory_bandwidth_bytes_per_s"] > 0
    assert set(roofline["flops_per_s"]) == {"fp32", "bf16"} and all(roofline["flops_per_s"].values())
    assert roofline["source"]["memory_bandwidth_bytes_per_s"].startswith("measured by the sweep on cpu")
    assert all(source.startswith("measured") for source in roofline["source"]["flops_per_s"].values())
    # Measured the env check's way: medians of repetitions, with their spread, never a 0.1 s probe
    assert "median of 5" in roofline["source"]["memory_bandwidth_bytes_per_s"]
    for name in ("memory_bandwidth_bytes_per_s", "fp32", "bf16"):
        spread = roofline["spread"][name]
        assert len(spread["samples"]) == 5 and spread["min"] <= spread["median"] <= spread["max"]
    assert roofline["memory_bandwidth_bytes_per_s"] == roofline["spread"]["memory_bandwidth_bytes_per_s"]["median"]
    # The per-step overhead is fitted over the smallest trials and reported, and taken out of every trial
    overhead = roofline["overhead"]
    assert overhead["seconds_per_step"] >= 0 and overhead["fitted_trials"] >= 3
    for trial in twelve_configuration_sweep["trials"]:
        assert trial["roofline"]["overhead_seconds_per_step"] == overhead["seconds_per_step"]
        assert trial["roofline"]["steps"] == trial["details"]["generation_steps"]
    assert {"flops", "bytes", "time", "efficiency", "bound"} <= set(roofline["formulas"])
    first = twelve_configuration_sweep["trials"][0]["roofline"]
    assert first["memory_bandwidth_bytes_per_s"] == roofline["memory_bandwidth_bytes_per_s"]
    assert first["model"]["kv_bytes_per_token"] == 2 * 2 * 2 * 128 * 4  # layers x K,V x KV heads x head_dim x fp32


def test_the_stage_serves_poisson_arrivals_in_int8_and_fp16_with_the_nodes_hardware_figures():
    hardware = {"memory_bandwidth_bytes_per_s": 2e10, "flops_per_s": {"fp16": 1e11}}
    progress = []
    result = sweep_stage({"config": QWEN3, "grid": {"precision": ["int8", "fp16"], "batch_size": [2],
                                                    "page_size": [8], "max_batch_tokens": [64]},
                          "workload": {"requests": 3, "prompt_len": [6, 10], "output_len": {"uniform": [3, 5]},
                                       "arrival": "poisson", "rate": 100.0, "slo": SLO},
                          "hardware": hardware, "device": "cpu"},
                         lambda fraction, message: progress.append(fraction))
    for trial in result["trials"]:
        _assert_complete_trial(trial, SLO)
        assert trial["workload"]["arrival"] == "poisson" and trial["details"]["in_flight_limit"] is None
    int8 = result["trials"][0]["roofline"]["model"]
    # Dynamic int8 stores linear weights in 1 byte: fewer weight bytes than parameters x 4.
    assert int8["dense_weight_bytes"] < 4 * int8["parameters"]
    source = result["roofline"]["source"]
    assert source["memory_bandwidth_bytes_per_s"].startswith("hardware parameter")
    assert source["flops_per_s"]["fp16"].startswith("hardware parameter")
    assert source["flops_per_s"]["int8"].startswith("measured")
    assert result["roofline"]["flops_per_s"]["fp16"] == 1e11
    assert progress[0] == 0 and progress[-1] == 1 and progress == sorted(progress)


@pytest.mark.slow
def test_a_trial_that_runs_out_of_memory_is_recorded_and_larger_ones_are_skipped(monkeypatch):
    original = TransformersContinuousBatching._model

    def model_with_a_memory_limit(self, precision):
        model, cost = original(self, precision)
        forward = type(model).forward

        def forward_or_run_out_of_memory(*args, **kwargs):
            # Memory grows with the tokens in a step: more than 40 (the batch of 4 prompts of 16) does not fit.
            if kwargs["input_ids"].numel() > 40:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
            return forward(model, *args, **kwargs)

        monkeypatch.setattr(model, "forward", forward_or_run_out_of_memory)
        return model, cost

    monkeypatch.setattr(TransformersContinuousBatching, "_model", model_with_a_memory_limit)
    result = run_sweep(QWEN3, grid={"batch_size": [1, 2, 4, 8], "page_size": [16], "max_batch_tokens": [128]},
                       workload={"requests": 4, "prompt_len": 16, "output_len": 3}, search="smart", device="cpu",
                       hardware={"memory_bandwidth_bytes_per_s": 1e10, "flops_per_s": {"fp32": 1e11}})
    by_batch = {trial["params"]["batch_size"]: trial for trial in result["trials"] if trial["rung"] == 0}
    assert by_batch[4]["status"] == "oom" and "out of memory" in by_batch[4]["reason"]
    assert by_batch[4]["metrics"] is None
    assert by_batch[8]["status"] == "skipped" and f"trial {by_batch[4]['id']}" in by_batch[8]["reason"]
    assert by_batch[1]["status"] == by_batch[2]["status"] == "ok"
    assert result["best"]["params"]["batch_size"] in (1, 2)


@pytest.mark.slow
def test_the_cli_prints_the_report_as_json_without_django(tmp_path):
    hardware = tmp_path / "hardware.json"
    hardware.write_text(json.dumps({"memory_bandwidth_bytes_per_s": 1e10, "flops_per_s": {"fp32": 5e10}}))
    code = ("import sys; [sys.modules.__setitem__(n, None) for n in ('django', 'adaptation', 'd0web')]; "
            "import runpy; runpy.run_module('workers.engine', run_name='__main__')")
    completed = subprocess.run(
        [sys.executable, "-c", code, "sweep", str(QWEN3_PATH), "--json", "--batch-sizes", "1,2", "--page-sizes", "16",
         "--precisions", "fp32", "--max-batch-tokens", "64", "--prompt-len", "8-12", "--output-len", "3",
         "--requests", "2", "--search", "smart", "--hardware", str(hardware), "--slo-ttft-ms", "30000"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    assert {"trials", "best", "search", "roofline"} <= set(report)
    assert report["search"]["strategy"] == "smart" and report["search"]["trials_run"] >= 2
    assert math.isfinite(report["search"]["seconds"])
    assert report["roofline"]["memory_bandwidth_bytes_per_s"] == 1e10 and report["roofline"]["flops_per_s"]["fp32"]
    assert report["best"]["params"]["batch_size"] in (1, 2)
    assert all(trial["status"] == "ok" and trial["roofline"]["bound"] for trial in report["trials"])
    assert report["workload"]["slo"] == {"ttft_s": 30.0}


def test_the_stage_rejects_unknown_parameters_and_a_missing_config():
    with pytest.raises(ValueError, match="grdi: sweep takes no such parameter; it takes: grid, workload"):
        sweep_stage({"config": QWEN3, "grdi": {}}, lambda fraction, message: None)
    with pytest.raises(ValueError, match="config"):
        sweep_stage({"grid": {}}, lambda fraction, message: None)
    with pytest.raises(ValueError, match="search"):
        run_sweep(QWEN3, grid={}, workload={}, search="bayes")


def test_a_sweep_stage_in_which_no_trial_completes_fails_with_the_trials_reasons(monkeypatch):
    """A stage that produced no result has failed: the whole adaptation once showed Succeeded for a DeepSeek-V3
    whose sweep completed 0 of 12 trials (MLA did not fit the paged cache)."""
    def refuse(*args):
        raise RuntimeError("index_copy_(): neither the paged cache nor the model's own can hold this attention")

    monkeypatch.setattr(TransformersContinuousBatching, "_serve", refuse)
    monkeypatch.setattr(backends, "_serve_static", refuse)
    with pytest.raises(SweepFailed, match=r"^no trial of 2 completed: 2 × failed: RuntimeError: index_copy_"):
        sweep_stage({"config": QWEN3, "grid": {"precision": ["fp32"], "batch_size": [1, 2], "page_size": [16],
                                               "max_batch_tokens": [64]},
                     "workload": {"requests": 2, "prompt_len": 8, "output_len": 2}, "device": "cpu",
                     "hardware": {"memory_bandwidth_bytes_per_s": 2e10, "flops_per_s": {"fp32": 1e11}}},
                    lambda fraction, message: None)


@pytest.mark.slow
def test_an_architecture_the_paged_cache_cannot_hold_is_served_by_static_batches_and_says_so():
    """DeepSeek-V3's MLA does not fit transformers' paged cache; its trials are served by the model's own cache in
    static batches, marked as such with the reason, instead of all failing."""
    config = json.loads((QWEN3_PATH.parent / "deepseek-v3.json").read_text())
    result = run_sweep(config, grid={"precision": ["fp32"], "batch_size": [1, 2], "page_size": [16, 32],
                                     "max_batch_tokens": [64, 128]},
                       workload={"requests": 4, "prompt_len": 8, "output_len": 4}, device="cpu",
                       hardware={"memory_bandwidth_bytes_per_s": 2e10, "flops_per_s": {"fp32": 1e11}})
    # Page size and max batch tokens do nothing there: not swept (8 configurations would be 2 measured 4 times
    # each, their differences noise a pick could be made of), and the result says so
    assert [trial["status"] for trial in result["trials"]] == ["ok", "ok"]
    assert [(t["params"]["page_size"], t["params"]["max_batch_tokens"]) for t in result["trials"]] == [(16, 64)] * 2
    assert result["grid"]["page_size"] == [16] and result["grid"]["max_batch_tokens"] == [64]
    assert result["knobs_not_swept"]["knobs"] == {"page_size": {"given": [16, 32], "served_at": 16},
                                                  "max_batch_tokens": {"given": [64, 128], "served_at": 64}}
    # Why: the paged cache's own error, the one every trial's fallback names
    assert result["knobs_not_swept"]["why"] == result["trials"][0]["details"]["paged_cache_error"]
    assert "not swept" in result["knobs_not_swept"]["note"]
    for trial in result["trials"]:
        assert trial["details"]["serving_path"].startswith("static batches") and trial["details"]["paged_cache_error"]
        assert trial["metrics"]["output_tokens_per_s"] > 0 and trial["metrics"]["ttft_s"]["p50"] > 0
    [(path, served)] = result["serving_paths"].items()
    assert "page_size and max_batch_tokens are not knobs" in path and served["trials"] == 2 and served["why"]
    assert result["best"] is not None
    plain = run_sweep(QWEN3, grid={"precision": ["fp32"], "batch_size": [2], "page_size": [16, 32],
                                   "max_batch_tokens": [64]},
                      workload={"requests": 2, "prompt_len": 8, "output_len": 2}, device="cpu",
                      hardware={"memory_bandwidth_bytes_per_s": 2e10, "flops_per_s": {"fp32": 1e11}})
    assert list(plain["serving_paths"]) == ["continuous batching with a paged KV cache"]
    assert plain["knobs_not_swept"] is None and len(plain["trials"]) == 2  # the paged cache pages: both swept


def test_a_failing_configuration_is_not_repeated(monkeypatch):
    from workers.engine.sweep import repeated

    calls = []

    def failing():
        calls.append(1)
        return {"status": "oom", "metrics": None}

    assert repeated(failing, 3)["status"] == "oom" and len(calls) == 1
