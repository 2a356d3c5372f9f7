"""The engine's result schema, without Django: the efficiency rule, results read back (those stored before a key
existed too), and one trial row declaration for the CSV and the terminal."""

import csv
import io
import json
import subprocess
import sys

import pytest

from workers.engine.sweep.result import (OVER_CEILING, OVERHEAD_EXPLAINS_ALL, Efficiency, Roofline, SweepResult,
                                         ServeSweepResult, SweepTrial)
from workers.engine.sweep.trial_row import serve_sweep_table, sweep_table


def stored_sweep() -> dict:
    """A sweep's result as a node stores it: trial 0 within its ceiling, trial 1 faster than it (flagged), trial 2
    out of memory, trial 3 from before flags existed (an efficiency above 1, no flag, no samples)."""
    def trial(number, throughput, ttft, roofline, status="ok"):
        metrics = None if status != "ok" else {
            "completed": 8, "failed": 0, "duration_s": 1.0, "output_tokens_per_s": throughput, "requests_per_s": 8.0,
            "ttft_s": {"mean": ttft, "count": 8, "p50": ttft, "p90": ttft * 1.5, "p99": ttft * 2},
            "tpot_s": {"mean": 0.004, "count": 8, "p50": 0.004, "p90": 0.005, "p99": 0.006},
            "itl_s": {"mean": 0.004, "count": 120, "p50": 0.004, "p90": 0.005, "p99": 0.006},
            "e2e_latency_s": {"mean": 0.1, "count": 8, "p50": 0.1, "p90": 0.12, "p99": 0.13},
            "e2e_latency_samples_s": [0.09, 0.1, 0.13], "goodput_requests_per_s": None,
            "peak_memory_bytes": 3 * 2**30}
        return {"id": number, "rung": 0, "status": status, "reason": None if status == "ok" else "CUDA out of memory",
                "params": {"precision": "bf16", "batch_size": 2 ** number, "page_size": 16, "max_batch_tokens": 256},
                "workload": {"requests": 8, "arrival": "closed"}, "metrics": metrics, "roofline": roofline,
                "details": {}}

    def roofline(**efficiency):
        return {"bound": "memory-bound", "arithmetic_intensity": 2.0, "memory_bandwidth_bytes_per_s": 1e11,
                "flops_per_s": 1e13, "predicted_seconds": 0.4, "measured_seconds": 1.0, "steps": 20,
                "overhead_seconds_per_step": 0.01, "end_to_end_efficiency": 0.4, **efficiency}

    trials = [trial(0, 812.5, 0.0123, roofline(efficiency=0.42, ceiling_ratio=None, flag=None, note=None)),
              trial(1, 1650.25, 0.0101, roofline(efficiency=None, ceiling_ratio=1.37, flag=OVER_CEILING,
                                                 note="measured faster than the predicted ceiling")),
              trial(2, None, None, None, status="oom"),
              trial(3, 900.0, 0.02, {**roofline(efficiency=1.9), "bound": "compute-bound"})]
    del trials[3]["metrics"]["e2e_latency_samples_s"]
    best = {key: trials[0][key] for key in ("id", "params", "metrics", "roofline")}
    return {"model": {"model_type": "qwen3", "reduced": True, "layers": 2, "full_layers": 28},
            "backend": {"name": "transformers", "device": "cpu"}, "trials": trials, "best": best,
            "search": {"strategy": "grid", "configurations": 4, "trials_run": 4, "requests_served": 32,
                       "seconds": 3.5},
            "roofline": {"memory_bandwidth_bytes_per_s": 1e11, "flops_per_s": {"bf16": 1e13}}}


def kept(stored, written) -> bool:
    """Whether ``written`` holds every key and value of ``stored`` (and maybe more keys)."""
    if isinstance(stored, dict):
        return isinstance(written, dict) and all(key in written and kept(value, written[key])
                                                 for key, value in stored.items())
    if isinstance(stored, list):
        return isinstance(written, list) and len(stored) == len(written) and all(
            kept(item, other) for item, other in zip(stored, written, strict=True))
    return stored == written


def test_the_efficiency_rule_flags_a_figure_above_one_and_a_trial_the_overhead_explains():
    within = Efficiency.judge(0.4, 1.0)
    assert (within.figure, within.flag, within.flagged, within.text) == (0.4, None, False, "0.40")
    over = Efficiency.judge(1.37, 1.0)
    assert over.flagged and over.flag == OVER_CEILING and over.figure is None
    assert over.ceiling_ratio == pytest.approx(1.37) and over.text == "ceiling suspect (1.37×)"
    assert "overhead" in over.note and "faster than the predicted ceiling" in over.note
    assert "overhead" not in Efficiency.judge(1.37, 1.0, overhead_out=False).note
    gone = Efficiency.judge(0.4, 0.0)
    assert gone.flag == OVERHEAD_EXPLAINS_ALL and gone.figure is None and gone.overhead_explains_all
    assert gone.text == "overhead explains all of its time"
    assert Efficiency.judge(1.0, 1.0).figure == 1.0  # exactly at the ceiling is possible


def test_a_stored_efficiency_reads_as_the_rule_has_it_whenever_it_was_stored():
    assert Efficiency.read({"efficiency": 0.42, "flag": None}).figure == 0.42
    before_flags = Efficiency.read({"efficiency": 1.9})
    assert before_flags.flagged and before_flags.ceiling_ratio == 1.9 and before_flags.figure is None
    # A recipe's prediction kept the ratio beside its efficiency, flagged only by a missing efficiency and a note
    old_prediction = Efficiency.read({"efficiency": None, "ceiling_ratio": 3.0, "note": "faster"})
    assert old_prediction.flagged and old_prediction.ceiling_ratio == 3.0 and old_prediction.note == "faster"
    assert Efficiency.read({"efficiency": 0.3, "ceiling_ratio": 0.3}).figure == 0.3
    assert not Efficiency.read({}).flagged and Efficiency.read({}).text == "—"


def test_a_stored_result_reads_back_as_it_was_stored_and_tolerates_missing_keys():
    stored = stored_sweep()
    result = SweepResult.from_dict(stored)
    assert [trial.efficiency.flagged if trial.roofline else None for trial in result.trials] == [
        False, True, None, True]
    assert result.over_ceiling == 2 and [trial.id for trial in result.ok_trials] == [0, 1, 3]
    assert result.trials[0].metrics.ttft_s.p50 == 0.0123 and result.trials[3].metrics.e2e_latency_samples_s is None
    assert result.best.efficiency.figure == 0.42 and result.confirmation is None
    # Written back, it holds everything stored (the rule's reading of the trial from before flags aside), and the
    # keys it lacked with their defaults
    again = result.as_dict()
    assert kept(stored["trials"][:3], again["trials"][:3]) and kept(stored["best"], again["best"])
    assert again["trials"][3]["roofline"]["flag"] == OVER_CEILING and again["trials"][0]["repeats"] is None
    assert SweepResult.from_dict(again).as_dict() == again
    # What the schema does not declare is kept, and an empty or odd result reads as an empty one
    assert SweepTrial.from_dict({"id": 1, "added_later": [1]}).as_dict()["added_later"] == [1]
    assert SweepResult.from_dict({"trials": None, "model": None}).trials == []
    assert SweepResult.from_dict("not a result") is None and Roofline.from_dict(None) is None


def test_the_csv_and_the_terminal_table_write_the_same_trial_figures():
    result = SweepResult.from_dict(stored_sweep())
    table = sweep_table(result)
    rows = list(csv.DictReader(io.StringIO(table.csv())))
    assert [row["id"] for row in rows] == ["0", "1", "2", "3"] and [row["best"] for row in rows].count("True") == 1
    assert rows[0]["output_tokens_per_s"] == "812.5" and rows[0]["ttft_p50_s"] == "0.0123"
    assert [row["roofline_efficiency"] for row in rows] == ["0.42", "", "", ""]
    assert [row["roofline_ceiling_suspect"] for row in rows] == ["False", "True", "", "True"]
    lines = table.terminal_lines()
    header, first, second = lines[0], lines[2], lines[3]
    for text in ("*0", "812.5", "12.3 ms", "0.42", "memory-bound"):
        assert text in first
    assert "1650.2" in second and "ceiling suspect (1.37×)" in second and "0.42" not in second
    assert header.split()[:4] == ["id", "precision", "batch", "page"]
    assert lines[-1] == "  trial 2 oom: CUDA out of memory"


def test_a_serving_trial_row_reads_settings_client_and_cause():
    stored = {"engine": {"name": "vllm"}, "trials": [
        {"id": 0, "settings": {"max_num_seqs": 4}, "client": {"concurrency": 2}, "status": "failed",
         "cause": "out of memory", "reason": "x" * 500, "metrics": None, "workload": {"requests": 8}},
        {"id": 1, "settings": {"max_num_seqs": 2}, "client": {}, "status": "ok", "startup_s": 31.0,
         "metrics": {"output_tokens_per_s": 99.0, "ttft_s": {"p50": 0.5}}, "workload": {"requests": 8}}],
        "best": {"id": 1, "settings": {"max_num_seqs": 2}, "client": {}, "metrics": {"output_tokens_per_s": 99.0}}}
    table = serve_sweep_table(ServeSweepResult.from_dict(stored))
    failed, served = (dict(zip((column.name for column in table.page_columns), row.cells, strict=True))
                      for row in table.page_rows)
    assert failed["status"].text == "failed (out of memory)" and len(failed["status"].note) == 120
    assert failed["settings"].text == "max_num_seqs=4" and failed["settings"].verbatim
    assert served["output_tokens_per_s"].text == "99.0" and served["ttft_p50_s"].text == "500.0 ms"
    assert served["startup_s"].text == "31.0 s" and served["client"].text == "—"


def test_the_schema_and_the_rows_import_without_django_or_torch():
    code = ("import sys, workers.engine.sweep.result, workers.engine.sweep.trial_row; "
            "print(sorted({name.split('.')[0] for name in sys.modules} & {'django', 'torch', 'transformers'}))")
    assert json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     check=True).stdout.replace("'", '"')) == []
