"""The serve sweep's quality judgement on real weights (``serving.quality``), without an engine: each numerics' checks
(correctness against the reference, the accuracy gate, a quantized variant's recovery against the checkpoint as
shipped) decide its verdict; a failed numerics' trials are marked with it, kept with their figures, and never the
pick; the per-variant rows give throughput, memory, accuracy and recovery."""

from workers.engine.serving import quality
from workers.engine.serving.quality import QualityCheck, numerics_key, variant_summary
from workers.engine.serving.serve_sweep import best_trial
from workers.engine.sweep.workload import Workload

PASSING = {"verdict": "pass", "reasons": [], "single": {"top1_agreement": 1.0}}
FAILING = {"verdict": "fail", "reasons": ["chat template parity: the engine's tokens differ"],
           "single": {"top1_agreement": 0.4}}
VARIANTS = {"as_shipped": {"name": "as_shipped", "bits": None, "threshold": None},
            "w8a8-int8": {"name": "w8a8-int8", "bits": 8, "threshold": 0.99, "disk_bytes": 170_000_000},
            "w4a8-int": {"name": "w4a8-int", "bits": 4, "threshold": 0.97, "disk_bytes": 110_000_000},
            "broken": {"name": "broken", "bits": 8, "threshold": 0.99}}


def _accuracy(correct: int, n: int = 1000) -> dict:
    from workers.engine.serving.accuracy import wilson_lower

    return {"accuracy": correct / n, "n": n, "correct": correct, "wilson_lower_95": wilson_lower(correct, n)}


def _check(entries: dict, reference_correct: int = 875) -> QualityCheck:
    check = QualityCheck("/nonexistent", tokens=16, variants=VARIANTS,
                         accuracy={"task": "d0_basic_facts", "task_dir": "/x", "max_drop_points": 10.0,
                                   "published": None}, progress=lambda message: None)
    check._measured_reference = lambda: _accuracy(reference_correct)
    for name, (correctness, correct, perplexity) in entries.items():
        numerics = {"variant": name, "dtype": "bfloat16"}
        check.entries[numerics_key(numerics)] = {
            "numerics": numerics, "label": quality.numerics_label(numerics), "variant": VARIANTS[name],
            "correctness": correctness, "accuracy": _accuracy(correct), "perplexity": {"word_perplexity": perplexity}}
    return check


def _trials(names_and_speeds: list[tuple[str, float]]) -> list[dict]:
    trials = []
    for name, speed in names_and_speeds:
        for run in range(3):
            trials.append({"id": len(trials), "status": "ok", "settings": {"variant": name, "dtype": "bfloat16"},
                           "client": {}, "workload": {"requests": 8}, "command": name, "env": {}, "startup_s": 9.0,
                           "metrics": {"output_tokens_per_s": speed + run, "peak_memory_bytes": 10**9}})
    return trials


def test_each_check_decides_its_numerics_and_a_failed_one_is_never_the_pick_however_fast():
    check = _check({"as_shipped": (PASSING, 875, 39.1),
                    "w8a8-int8": (PASSING, 875, 39.3),   # 100% of the shipped accuracy: passes 99%
                    "w4a8-int": (PASSING, 840, 44.0),    # 96.0%: within the gate's 10 points, under its 97%
                    "broken": (FAILING, 870, 39.2)})     # its chat template differs: failed-correctness
    report = check.finish()
    verdicts = {entry["numerics"]["variant"]: entry["verdict"] for entry in report["entries"]}
    assert verdicts == {"as_shipped": "pass", "w8a8-int8": "pass", "w4a8-int": "under-recovery",
                        "broken": "failed-correctness"}
    four_bit = next(entry for entry in report["entries"] if entry["numerics"]["variant"] == "w4a8-int")
    assert round(four_bit["recovery"]["accuracy_pct"], 1) == 96.0 and four_bit["recovery"]["threshold_pct"] == 97
    assert round(four_bit["recovery"]["delta_perplexity"], 1) == 4.9
    assert "keeps 96.0%" in four_bit["reasons"][0] and "threshold is 97%" in four_bit["reasons"][0]
    assert all(entry["gate"]["passed"] for entry in report["entries"])

    # The fastest two failed their checks: the pick is the fastest that passed every one.
    trials = _trials([("as_shipped", 100.0), ("w8a8-int8", 150.0), ("w4a8-int", 300.0), ("broken", 400.0)])
    assert check.mark(trials) == 6
    assert {trial["status"] for trial in trials if trial["settings"]["variant"] == "broken"} == {"failed-correctness"}
    reasons = {trial["settings"]["variant"]: trial["reason"] for trial in trials if trial["status"] != "ok"}
    assert "chat template parity" in reasons["broken"] and "keeps 96.0%" in reasons["w4a8-int"]
    best = best_trial(trials, Workload.from_dict({"requests": 8}))
    assert best["settings"]["variant"] == "w8a8-int8"

    rows = {row["numerics"]["variant"]: row for row in variant_summary(trials, report, VARIANTS)}
    assert rows["w4a8-int"]["output_tokens_per_s"] == 301.0 and not rows["w4a8-int"]["recommended"]
    assert rows["w8a8-int8"]["recommended"] and rows["w8a8-int8"]["disk_bytes"] == 170_000_000
    assert rows["broken"]["verdict"] == "failed-correctness" and rows["broken"]["peak_memory_bytes"] == 10**9


def test_the_gate_fails_a_numerics_whose_accuracy_falls_below_the_reference_by_more_than_x():
    check = _check({"as_shipped": (PASSING, 875, 39.1), "w8a8-int8": (PASSING, 700, 41.0)})
    report = check.finish()
    eight_bit = next(entry for entry in report["entries"] if entry["numerics"]["variant"] == "w8a8-int8")
    assert eight_bit["verdict"] == "failed-accuracy" and not eight_bit["gate"]["passed"]
    assert eight_bit["reasons"][0].startswith("served Wilson 95% lower bound")
    # A published score a team entered replaces the measured reference.
    check = _check({"as_shipped": (PASSING, 875, 39.1)})
    check.accuracy["published"] = {"accuracy": 0.99, "source": "model card"}
    entry = check.finish()["entries"][0]
    assert entry["gate"]["reference_source"] == "published" and entry["verdict"] == "failed-accuracy"


def test_a_reference_that_cannot_be_computed_fails_with_the_folder_and_the_cause(tmp_path):
    import pytest

    from workers.engine.serving.client import Endpoint
    from workers.engine.serving.quality import ReferenceUnavailable

    (tmp_path / "config.json").write_text("{}")
    check = QualityCheck(tmp_path, tokens=4, variants={}, accuracy=None, progress=lambda message: None)
    with pytest.raises(ReferenceUnavailable, match=f"could not be computed from {tmp_path}: "):
        check.check(Endpoint("http://127.0.0.1:9", "d0"), {"dtype": "float32"}, tmp_path)
