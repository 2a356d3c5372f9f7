"""The analysis process the web tier asks for a model's analysis (workers/engine/analysis/worker.py), and the plans
made later from what it stored (the web tier's own side, without torch: tests/test_web_without_torch.py)."""

import json

import pytest

from workers.engine.analysis import ConfigError, analyze, plan_from_analysis
from workers.engine.analysis.worker import AnalysisFailed, AnalysisProcess

from .conftest import load_config


def test_a_plan_from_the_stored_analysis_is_the_plan_of_the_config():
    config = load_config("deepseek-v3.json")
    devices = {"devices_per_node": 8, "nodes": 2, "device_memory_bytes": 141 * 10**9, "device_name": "NVIDIA H200"}
    stored = json.loads(json.dumps(analyze(config)))  # as jsonb gives it back
    workload = {"concurrency": 64, "context_tokens": 4096}
    for precision in ("bf16", "fp8", "int4"):
        assert plan_from_analysis(stored, devices, precision, workload) == analyze(
            config, devices=devices, precision=precision, workload=workload)["plans"]


@pytest.mark.slow
def test_the_analysis_process_answers_refuses_gives_up_at_its_deadline_and_exits_when_idle():
    process = AnalysisProcess()
    try:
        # Its first answer includes importing torch and transformers: far past a 10 ms deadline.
        with pytest.raises(AnalysisFailed, match="took longer than 0.01 s"):
            process.analyze(load_config("qwen3-0.6b.json"), timeout_s=0.01, idle_s=60)
        assert process._child is None  # killed, not left running
        report = process.analyze(load_config("qwen3-0.6b.json"), timeout_s=120, idle_s=1)
        assert report["method"] == "exact" and report["total_params"] == 596049920
        with pytest.raises(ConfigError, match="hidden_size"):
            process.analyze({"model_type": "llama"}, timeout_s=120, idle_s=1)
        child = process._child
        assert child.wait(timeout=30) == 0  # a second without a request
    finally:
        process.close()
