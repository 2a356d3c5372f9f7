"""The sweep's charts from a real sweep of the reduced model: each configuration served three times, its median
with the spread, and a CDF of every request's latency (the sweep itself: tests/engine/test_sweep.py)."""

import pytest

from workers.engine.sweep import run_sweep

from .conftest import load_config

QWEN3 = load_config("qwen3-0.6b.json")


def test_each_configuration_runs_three_times_and_reports_the_median_with_its_spread():
    from adaptation.sweeps.charts import figures

    result = run_sweep(QWEN3, grid={"precision": ["fp32"], "batch_size": [1, 2], "page_size": [16],
                                    "max_batch_tokens": [64]},
                       workload={"requests": 3, "prompt_len": 8, "output_len": 3}, device="cpu",
                       hardware={"memory_bandwidth_bytes_per_s": 2e10, "flops_per_s": {"fp32": 1e11}})
    assert result["repeats"] == 3
    for trial in result["trials"]:
        repeats = trial["repeats"]
        runs = repeats["output_tokens_per_s"]
        assert repeats["count"] == 3 and runs == sorted(runs) and len(repeats["ttft_p50_s"]) == 3
        assert trial["metrics"]["output_tokens_per_s"] == repeats["median"] == runs[1]
        assert repeats["spread"] == pytest.approx((runs[2] - runs[0]) / runs[1])
        # The CDF's points are every request's latency, not three percentiles
        samples = trial["metrics"]["e2e_latency_samples_s"]
        assert len(samples) == trial["metrics"]["completed"] == 3 and samples == sorted(samples)
    cdf = figures(result)["cdf"]
    assert "every request" in cdf.layout.title.text
    assert [len(trace.x) for trace in cdf.data] == [3, 3]
