"""The prediction ledger: a serve sweep's trials carry d0's prediction beside the measurement, the errors and the
calibration fitted on them, and a second sweep calibrated on the first predicted closer to what it measured.

The engine is the simulated continuous-batching engine (``serving.simulated``: vLLM's scheduler in outline, in
virtual time) standing in for vLLM where ``run_trials`` would start it; everything else is the serve sweep's own
code (``_lead``: the search, the pick, the recipe, the predictions)."""

import importlib
import json
from pathlib import Path
from statistics import median

import pytest

from workers.engine.serving import ledger
from workers.engine.serving.checkpoint import write_validation_checkpoint
from workers.engine.serving.engines import Engine
from workers.engine.serving.simulated import SimulatedEngine
from workers.engine.sweep.line_fit import least_squares_line
from workers.engine.sweep.metrics import percentile, summarize
from workers.engine.sweep.result import ServeSweepResult
from workers.engine.sweep.trial_row import serve_sweep_table
from workers.engine.sweep.workload import Workload

serve_sweep = importlib.import_module("workers.engine.serving.serve_sweep")

CATALOG = Path(__file__).resolve().parents[2] / "adaptation" / "intake" / "catalog" / "configs"
# Figures of a CPU node's env check (bytes/s, FLOP/s): the roofline they give is far above what the simulated
# engine (a fixed cost per step, as an engine's Python and scheduling are) serves.
HARDWARE = {"memory_bandwidth_bytes_per_s": 20e9, "flops_per_s": {"bf16": 400e9}}
PEAK_MEMORY = 3 * 2**30


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ledger") / "checkpoint"
    write_validation_checkpoint(json.loads((CATALOG / "smollm2-135m-instruct.json").read_text()), folder)
    return folder


def simulated_run_trials(session, settings, clients, workload, startup_timeout_s, first_id, progress):
    """``serve_sweep.run_trials`` with the simulated engine in vLLM's place: the same trial records."""
    engine = SimulatedEngine(max_num_seqs=settings["max_num_seqs"], step_s=0.004, token_s=0.0004,
                             prefill_token_s=0.00002, noise=0.03)
    trials = []
    for offset, client in enumerate(clients):
        trial_workload = Workload.from_dict({**workload.as_dict(), **client})
        in_flight = trial_workload.in_flight_limit(settings["max_num_seqs"])
        records = engine.serve(trial_workload.measured_requests(session.vocab), in_flight=in_flight,
                               seed=first_id + offset)
        trials.append({"id": first_id + offset, "settings": session.settings(settings), "command": "vllm serve",
                       "env": {}, "client": client, "status": "ok", "reason": None, "startup_s": 1.0,
                       "metrics": {**summarize(records), "peak_memory_bytes": PEAK_MEMORY},
                       "workload": {"requests": trial_workload.requests, "arrival": trial_workload.arrival,
                                    "concurrency": in_flight}})
    return trials


def sweep(checkpoint: Path, tmp_path: Path, monkeypatch, workload: dict, grid: dict, calibration=None,
          hardware=HARDWARE) -> dict:
    monkeypatch.setattr(serve_sweep, "run_trials", simulated_run_trials)
    session = serve_sweep.Session(Engine("vllm", "/nowhere/python"), {"name": "vllm", "cpu_build": True},
                                  checkpoint, tmp_path / "logs", max_model_len=256)
    params = {"grid": grid, "configurations": [], "settings": {}, "search": "grid", "startup_timeout_s": 60,
              "correctness": False, "variants": ["as_shipped"], "hardware": hardware, "calibration": calibration}
    result = serve_sweep._lead(session, params, Workload.from_dict(workload),
                               {"kind": "validation checkpoint", "real": False}, lambda fraction, message: None)
    return {**result, "engine": {"name": "vllm"}}


FIRST = ({"requests": 8, "prompt_len": 32, "output_len": 16}, {"max_num_seqs": [2, 4], "concurrency": [1, 2, 4]})
SECOND = ({"requests": 12, "prompt_len": 48, "output_len": 24}, {"max_num_seqs": [4, 8], "concurrency": [3, 6]})


def test_after_a_serve_sweep_every_served_trial_carries_its_prediction_beside_its_measurement(
        checkpoint, tmp_path, monkeypatch):
    result = sweep(checkpoint, tmp_path, monkeypatch, *FIRST)
    served = [trial for trial in result["trials"] if trial["status"] == "ok"]
    assert len(served) == 2 * 3 * 3  # every configuration served three times in its start
    for trial in served:
        prediction = trial["prediction"]
        assert prediction["available"] and prediction["calibration"] is None
        assert prediction["basis"].startswith("roofline from the node's env-check figures, not calibrated")
        assert set(prediction["roofline"]) == set(ledger.METRICS)
        assert all(value > 0 for value in prediction["roofline"].values())
        assert prediction["predicted"] == prediction["roofline"]
        assert prediction["hardware"]["memory_bandwidth_bytes_per_s"] == 20e9
        # The engine batches at most max_num_seqs: more in flight is not more per step.
        assert prediction["concurrency"] == min(trial["client"]["concurrency"], trial["settings"]["max_num_seqs"])
    # One row per trial and metric, the measured figure the trial's own.
    rows = ledger.rows_of(result, source="first")
    assert len(rows) == len(served) * len(ledger.METRICS)
    first = next(row for row in rows if row["trial"] == served[0]["id"] and row["metric"] == "tpot_s")
    assert first["measured"] == served[0]["metrics"]["tpot_s"]["p50"]
    # The report's trial table (page and CSV) shows the prediction beside the measurement.
    table = serve_sweep_table(ServeSweepResult.from_dict(result))
    assert {"predicted tok/s", "predicted TPOT"} <= {column.header for column in table.page_columns}
    record = next(record for record in table.records() if record["id"] == served[0]["id"])
    assert record["predicted_output_tokens_per_s"] == served[0]["prediction"]["predicted"]["output_tokens_per_s"]
    assert record["output_tokens_per_s"] == served[0]["metrics"]["output_tokens_per_s"]
    assert record["prediction_basis"].startswith("roofline from the node's env-check figures")
    # The recipe stores the prediction of its trial beside what it measured.
    assert result["recipe"]["prediction"]["ledger"]["roofline"]["output_tokens_per_s"] > 0
    assert result["recipe"]["trial"] == result["best"]["id"]


def test_a_second_sweep_calibrated_on_the_first_is_predicted_closer_to_what_it_measured(
        checkpoint, tmp_path, monkeypatch):
    first = sweep(checkpoint, tmp_path, monkeypatch, *FIRST)
    calibration = ledger.fit_calibration(ledger.rows_of(first, source="first"), "vllm")
    assert calibration["trials"] == 18 and set(calibration["ratios"]) == set(ledger.METRICS)
    # The simulated engine is far below the roofline: the fitted efficiency says so.
    assert calibration["ratios"]["output_tokens_per_s"] < 0.5 and calibration["ratios"]["tpot_s"] > 2
    second = sweep(checkpoint, tmp_path, monkeypatch, *SECOND, calibration=calibration)
    trial = next(trial for trial in second["trials"] if trial["status"] == "ok")
    # The sentence names the trials behind it and each metric's fit: a line where the time metrics spread.
    assert trial["prediction"]["basis"].startswith("calibrated on 18 trials of this cluster (fixed cost + slope x ")
    # TTFT's roofline spreads with the waves a closed loop waits: a line. The decode step's roofline reads the same
    # weights at every batch (it spreads by less than a fifth): no line of it, but the simulated engine pays a cost
    # per sequence in every step (as a CPU engine samples and detokenises each), which TPOT's fit carries.
    assert "ttft_s" in calibration["lines"] and "per_sequence" not in calibration["lines"]["ttft_s"]
    assert calibration["lines"]["tpot_s"]["per_sequence"] > 0
    assert "a cost per sequence in a step for TPOT (p50)" in trial["prediction"]["basis"]
    rows = ledger.rows_of(second, source="second")
    calibrated = {entry["metric"]: entry for entry in ledger.error_table(rows, "predicted")}
    uncalibrated = {entry["metric"]: entry for entry in ledger.error_table(rows, "roofline")}
    for metric in ledger.METRICS:
        assert calibrated[metric]["median"] < uncalibrated[metric]["median"], metric
    # With the cost per sequence TPOT's median and P90 errors are a third lower at least than with the one ratio it
    # would have had without it (3.4% / 6.7% against 6.3% / 10.9% here).
    ratio_only = {**calibration, "lines": {k: v for k, v in calibration["lines"].items() if k != "tpot_s"}}
    by_ratio = [ledger.relative_error(ledger.calibrate_figure("tpot_s", row["roofline"], ratio_only), row["measured"])
                for row in rows if row["metric"] == "tpot_s"]
    assert calibrated["tpot_s"]["median"] < 0.7 * median(by_ratio)
    assert calibrated["tpot_s"]["p90"] < 0.7 * percentile(by_ratio, ledger.TAIL_PERCENTILE)
    # Closer by far, not by a hair: the roofline alone is off by more than half on throughput and TPOT.
    # TTFT too: a closed loop's TTFT is mostly a wait for a place in the batch, a few steps of the engine's fixed
    # per-step cost, which the line's fixed cost carries from one workload to another (a ratio could not).
    for metric in ("output_tokens_per_s", "ttft_s", "tpot_s"):
        assert uncalibrated[metric]["median"] > 0.5 and calibrated[metric]["median"] < 0.25, metric


def test_a_node_without_env_check_figures_gets_no_prediction_but_says_why(checkpoint, tmp_path, monkeypatch):
    result = sweep(checkpoint, tmp_path, monkeypatch, {"requests": 4, "prompt_len": 16, "output_len": 8},
                   {"max_num_seqs": [2]}, hardware=None)
    trial = next(trial for trial in result["trials"] if trial["status"] == "ok")
    assert not trial["prediction"]["available"]
    assert trial["prediction"]["reason"].startswith("no figures for this node")
    assert ledger.rows_of(result) == []


def test_the_error_distribution_is_the_median_and_p90_per_engine_and_metric():
    rows = [{"engine": "vllm", "metric": "tpot_s", "roofline": 1.0, "predicted": predicted, "measured": 1.0,
             "trial": index} for index, predicted in enumerate([1.1, 0.8, 1.0, 1.5, 0.95])]
    [entry] = ledger.error_table(rows)
    assert entry["trials"] == 5 and entry["median"] == pytest.approx(0.1)
    # errors 0, .05, .1, .2, .5: the 90th percentile between the last two (numpy's linear interpolation)
    assert entry["p90"] == pytest.approx(0.2 + 0.6 * 0.3)


@pytest.mark.parametrize("calibration, message", [
    ({"trials": 0, "ratios": {"tpot_s": 2.0}}, "trials must be a positive int"),
    ({"trials": 3, "ratios": {"latency": 2.0}}, "unknown calibration metric"),
    ({"trials": 3, "ratios": {"tpot_s": -1}}, "must be a positive number"),
    ({"trials": 3, "ratios": {"tpot_s": 2.0}, "lines": {"peak_memory_bytes": {"fixed": 0, "slope": 1}}},
     "no calibration line for 'peak_memory_bytes'"),
    ({"trials": 3, "ratios": {"tpot_s": 2.0}, "lines": {"tpot_s": {"fixed": -0.1, "slope": 1}}},
     "positive slope and a fixed cost >= 0"),
    ({"trials": 3, "ratios": {"tpot_s": 2.0}, "lines": {"tpot_s": {"fixed": 0.1, "slope": 1, "per_sequence": -1}}},
     "its cost per sequence must be a positive number"),
])
def test_a_malformed_calibration_is_refused_naming_what_is_wrong(calibration, message):
    with pytest.raises(ValueError, match=message):
        ledger.check_calibration(calibration)


def test_the_ledger_verb_prints_the_error_distribution_of_stored_results(checkpoint, tmp_path, monkeypatch, capsys):
    from workers.engine.__main__ import main

    result = sweep(checkpoint, tmp_path, monkeypatch, {"requests": 4, "prompt_len": 16, "output_len": 8},
                   {"max_num_seqs": [2], "concurrency": [1, 2]})
    stored = tmp_path / "result.json"
    stored.write_text(json.dumps(result))
    assert main(["ledger", str(stored), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = ledger.rows_of(result, source=str(stored))
    assert report["rows"] == len(rows) == 6 * len(ledger.METRICS)
    assert report["errors"] == json.loads(json.dumps(ledger.error_table(rows)))
    assert report["calibrations"]["vllm"]["trials"] == 6
    assert main(["ledger", str(stored)]) == 0
    assert "calibrated on 6 trials" in capsys.readouterr().out
    (tmp_path / "list.json").write_text("[]")
    assert main(["ledger", str(tmp_path / "list.json")]) == 2
    assert "holds no serve sweep result" in capsys.readouterr().err


def steps(rooflines, fixed=0.004, slope=3.0, slowed=()):
    """Rows of trials on an engine that pays ``fixed`` seconds every step beside ``slope`` x the roofline's step,
    the trials at ``slowed`` indices 3x slower (another job on the node)."""
    return [{"engine": "vllm", "metric": "tpot_s", "trial": index, "source": "s", "roofline": roofline,
             "measured": (fixed + slope * roofline) * (3 if index in slowed else 1)}
            for index, roofline in enumerate(rooflines)]


def test_a_fixed_cost_per_step_is_fitted_by_a_line_that_predicts_other_batches_better_than_one_ratio():
    # Small batches (short roofline steps) are mostly the fixed cost: measured / roofline falls from 43 to 5.
    history = steps([0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.002])
    calibration = ledger.fit_calibration(history, "vllm")
    line = calibration["lines"]["tpot_s"]
    assert line["fixed"] == pytest.approx(0.004) and line["slope"] == pytest.approx(3.0)
    held_out = steps([0.00005, 0.005])  # a smaller and a larger step than any calibrated on
    fitted = [ledger.calibrate_figure("tpot_s", row["roofline"], calibration) for row in held_out]
    one_ratio = [row["roofline"] * calibration["ratios"]["tpot_s"] for row in held_out]
    for row, by_line, by_ratio in zip(held_out, fitted, one_ratio, strict=True):
        assert ledger.relative_error(by_line, row["measured"]) < 1e-9
        assert ledger.relative_error(by_ratio, row["measured"]) > 0.8  # the ratio is off by 80% or more
    # Two runs of eight slowed 3x by a loaded machine leave the line close (a least-squares line would not be).
    slowed = steps([0.0001 * 2**k for k in range(8)], slowed={1, 6})
    noisy = ledger.fit_calibration(slowed, "vllm")
    assert noisy["lines"]["tpot_s"]["fixed"] == pytest.approx(0.004, rel=0.1)
    assert noisy["lines"]["tpot_s"]["slope"] == pytest.approx(3.0, rel=0.1)
    _, slope = least_squares_line([(row["roofline"], row["measured"]) for row in slowed])
    assert abs(slope - 3.0) > 0.75  # least squares: a quarter off or more


def test_throughput_is_fitted_in_seconds_per_token_and_predicted_back_as_tokens_per_second():
    # 1 / tok/s = 0.002 + 2 x roofline's 1 / tok/s
    history = [{"engine": "vllm", "metric": "output_tokens_per_s", "trial": index, "roofline": roofline,
                "measured": 1 / (0.002 + 2 / roofline)} for index, roofline in enumerate([100, 400, 1600, 6400])]
    calibration = ledger.fit_calibration(history, "vllm")
    assert calibration["lines"]["output_tokens_per_s"]["unit"] == "s per output token"
    assert ledger.calibrate_figure("output_tokens_per_s", 800, calibration) == pytest.approx(1 / (0.002 + 2 / 800))


def per_sequence_rows(counts, per_sequence=0.001, roofline=0.002, ratio=4.0, wobble=()):
    """TPOT rows of a small model: the roofline flat over the batch (the same weights read every step), the
    measured step ``ratio`` x it + ``per_sequence`` s for each sequence the step carries; ``wobble`` scales them."""
    wobble = list(wobble) or [1.0] * len(counts)
    return [{"engine": "vllm", "metric": "tpot_s", "trial": index, "source": "s", "sequences": count,
             "roofline": roofline * (1 + 0.01 * (index % 3)), "measured": (ratio * roofline + per_sequence * count)
             * wobble[index]} for index, count in enumerate(counts)]


def test_a_cost_per_sequence_is_fitted_where_the_roofline_is_flat_and_predicts_a_larger_batch():
    calibration = ledger.fit_calibration(per_sequence_rows([1, 2, 4, 8, 1, 2, 4, 8]), "vllm")
    line = calibration["lines"]["tpot_s"]
    assert line["per_sequence"] == pytest.approx(0.001, rel=0.05) and line["slope"] == pytest.approx(4.0, rel=0.05)
    [held_out] = per_sequence_rows([16])
    predicted = ledger.calibrate_figure("tpot_s", held_out["roofline"], calibration, sequences=16)
    assert ledger.relative_error(predicted, held_out["measured"]) < 0.03
    # The one ratio would be off by a third on it; without the sequences given the ratio is what is left.
    assert ledger.relative_error(held_out["roofline"] * calibration["ratios"]["tpot_s"], held_out["measured"]) > 0.3
    ratio = calibration["ratios"]["tpot_s"]
    assert ledger.calibrate_figure("tpot_s", 0.002, calibration) == pytest.approx(0.002 * ratio)
    assert "+ 0.001 s × sequences a step carries" in ledger.describe_fits(calibration)[0]["fit"]
    assert ledger.check_calibration(calibration) is calibration


@pytest.mark.parametrize("counts, wobble", [([4, 4, 4, 4, 4], ()), ([1, 2, 4, 8, 1, 2, 4, 8], (1.1, 0.9, 1.05, 0.95,
                                                                                              0.9, 1.1, 0.95, 1.05))],
                         ids=["one batch size", "time that does not grow with the batch"])
def test_a_cost_per_sequence_is_left_out_where_it_would_not_predict_better(counts, wobble):
    rows = per_sequence_rows(counts, per_sequence=0.0, wobble=wobble)
    assert "tpot_s" not in ledger.fit_calibration(rows, "vllm")["lines"]


@pytest.mark.parametrize("rooflines", [[0.001, 0.002], [0.001, 0.0011, 0.00105]],
                         ids=["fewer than three trials", "rooflines that do not spread"])
def test_without_enough_spread_trials_the_single_ratio_stays(rooflines):
    calibration = ledger.fit_calibration(steps(rooflines), "vllm")
    assert calibration["lines"] == {}
    ratio = calibration["ratios"]["tpot_s"]
    assert ledger.calibrate_figure("tpot_s", 0.001, calibration) == pytest.approx(0.001 * ratio)
    _, basis = ledger.calibrated({"tpot_s": 0.001}, calibration)
    assert basis == f"calibrated on {len(rooflines)} trials of this cluster (median measured / roofline for TPOT (p50))"


def test_a_calibration_stored_before_the_lines_still_reads_as_ratios():
    old = {"engine": "vllm", "trials": 4, "ratios": {"tpot_s": 4.0, "output_tokens_per_s": 0.25}, "method": "median"}
    assert ledger.check_calibration(old) is old
    figures, basis = ledger.calibrated({"tpot_s": 0.001, "output_tokens_per_s": 1000.0, "ttft_s": 0.01}, old)
    assert figures == {"tpot_s": 0.004, "output_tokens_per_s": 250.0, "ttft_s": 0.01}
    assert basis.startswith("calibrated on 4 trials of this cluster (median measured / roofline for output tok/s")


def test_where_no_line_fits_a_power_law_does_if_it_predicts_left_out_trials_closer_than_the_ratio():
    # measured / roofline grows with the roofline (1 / tok/s = 5 x roofline's ^ 1.2): a line through it would have a
    # negative fixed cost, so no line; the power law is positive everywhere and follows it.
    rooflines = [70, 140, 240, 360, 75, 145, 235, 365]
    history = [{"engine": "vllm", "metric": "output_tokens_per_s", "trial": index, "roofline": roofline,
                "measured": 1 / (5 * (1 / roofline) ** 1.2)} for index, roofline in enumerate(rooflines)]
    calibration = ledger.fit_calibration(history, "vllm")
    assert "output_tokens_per_s" not in calibration["lines"]
    power = calibration["powers"]["output_tokens_per_s"]
    assert power["exponent"] == pytest.approx(1.2) and power["scale"] == pytest.approx(5)
    for roofline in (50, 500):  # beyond the trials on both sides
        expected = 1 / (5 * (1 / roofline) ** 1.2)
        assert ledger.calibrate_figure("output_tokens_per_s", roofline, calibration) == pytest.approx(expected)
    assert ledger.check_calibration(calibration) is calibration
    assert "a power law of the roofline for output tok/s" in ledger.calibrated({"output_tokens_per_s": 100.0},
                                                                             calibration)[1]
    # Measured in proportion to the roofline, with noise: whatever is kept predicts as the ratio does.
    wobbly = [{**row, "measured": row["roofline"] * 0.4 * (1.05 if index % 2 else 0.95)}
              for index, row in enumerate(history)]
    fitted = ledger.fit_calibration(wobbly, "vllm")
    for roofline in (50, 500):
        assert ledger.calibrate_figure("output_tokens_per_s", roofline, fitted) == pytest.approx(0.4 * roofline,
                                                                                                rel=0.02)
    with pytest.raises(ValueError, match="exponent in"):
        ledger.check_calibration({**calibration, "powers": {"output_tokens_per_s": {"scale": 1, "exponent": 9}}})
