"""``manage.py sweep``: a tuning sweep from a terminal. Real (tiny) sweeps of a reduced Qwen3 on the CPU: two
configurations, two requests of three output tokens each, so every sweep here takes about a second."""

import csv
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from adaptation.intake import services as intake
from adaptation.intake.catalog import BY_SLUG
from adaptation.models import ModelSpec

pytestmark = pytest.mark.django_db

TINY = ["--batch-sizes", "1,2", "--precisions", "fp32", "--requests", "2", "--prompt-len", "8", "--output-len", "3",
        "--device", "cpu"]


class Terminal(StringIO):
    def isatty(self):
        return True


def sweep(*args, stderr=None) -> tuple[str, str]:
    stdout, stderr = StringIO(), stderr or StringIO()
    call_command("sweep", *args, stdout=stdout, stderr=stderr)
    return stdout.getvalue(), stderr.getvalue()


def test_a_tiny_sweep_prints_a_line_per_trial_then_the_table_the_best_configuration_and_the_search():
    out, err = sweep("qwen3-0.6b", *TINY)
    lines = out.splitlines()
    assert lines[0].startswith("Sweeping catalog qwen3-0.6b") and "2 configurations" in lines[0]
    finished = [line for line in lines if line.startswith("finished run")]
    assert [line.split()[2] for line in finished] == ["1", "2"]
    assert "fp32 batch 1 page 16" in finished[0] and "fp32 batch 2 page 16" in finished[1]
    header = next(line for line in lines if line.startswith("id "))
    for column in ("precision", "batch", "page", "max tokens", "status", "out tok/s", "TTFT p50", "TPOT p50",
                   "roofline eff", "bound"):
        assert column in header
    rows = lines[lines.index(header) + 2:lines.index(header) + 4]
    assert [row.split()[1:4] for row in rows] == [["fp32", "1", "16"], ["fp32", "2", "16"]]
    assert all(" ok " in row and "ms" in row and "-bound" in row for row in rows)
    assert sum(row.lstrip().startswith("*") for row in rows) == 1
    assert any(line.startswith("Best: trial ") and "output tokens/s" in line for line in lines)
    assert any(line.startswith("Search: grid, 2 trials run of 2 configurations, 4 requests served") for line in lines)
    assert "[###" not in err  # no bar off a terminal


def test_out_writes_the_full_result_as_json_and_one_csv_row_per_trial(tmp_path):
    out, _ = sweep("qwen3-0.6b", *TINY, "--out", str(tmp_path / "results"))
    result = json.loads((tmp_path / "results" / "sweep.json").read_text())
    with open(tmp_path / "results" / "trials.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == len(result["trials"]) == result["search"]["trials_run"] == 2
    assert [row["batch_size"] for row in rows] == ["1", "2"] and {row["status"] for row in rows} == {"ok"}
    assert all(float(row["output_tokens_per_s"]) > 0 and float(row["ttft_p50_s"]) > 0 for row in rows)
    assert [row["best"] for row in rows].count("True") == 1
    assert f"Wrote {tmp_path / 'results' / 'sweep.json'}" in out and "trials.csv (2 trials)" in out


def test_json_prints_the_full_result_as_parseable_json_with_the_bar_on_a_terminals_stderr():
    out, err = sweep("qwen3-0.6b", *TINY, "--json", stderr=Terminal())
    result = json.loads(out)
    assert "\r[" + "#" * 30 + "] 100% done" in err and err.endswith("\n")
    assert {"trials", "best", "search", "roofline", "model", "workload"} <= set(result)
    assert len(result["trials"]) == 2 and result["best"]["id"] in (0, 1)
    assert result["search"]["strategy"] == "grid" and result["search"]["seconds"] > 0


def test_a_model_in_the_database_can_be_named_by_its_id(team, owner):
    spec, _ = intake.add_from_catalog(team=team, user=owner, slug="qwen3-0.6b")
    out, _ = sweep(str(spec.pk), *TINY, "--batch-sizes", "1")
    assert f"Sweeping model {spec.pk} 'Qwen3-0.6B' (team alpha)" in out and "Best: trial 0" in out


def test_an_unknown_model_is_refused_with_how_to_name_one():
    with pytest.raises(CommandError, match=r"unknown model 'no-such-model'.*id.*name.*catalog slug.*config\.json"):
        sweep("no-such-model", *TINY)
    with pytest.raises(CommandError, match="there is no model with id 999999"):
        sweep("999999", *TINY)
    with pytest.raises(CommandError, match="no such config file: missing/config.json"):
        sweep("missing/config.json", *TINY)


def test_a_name_two_teams_share_is_refused_with_the_ids_to_choose_from(team, other_team):
    config = BY_SLUG["qwen3-0.6b"].config()
    ids = [ModelSpec.objects.create(team=each, name="Shared", config=config).pk for each in (team, other_team)]
    with pytest.raises(CommandError, match=rf"2 models are named 'Shared'.*{ids[0]} \(team alpha\), {ids[1]}"):
        sweep("Shared", *TINY)


@pytest.mark.parametrize("option, value, reason", [
    ("--batch-sizes", "0,x", r"--batch-sizes takes comma-separated positive integers .*'0' is not one"),
    ("--batch-sizes", "1,x", r"--batch-sizes takes comma-separated positive integers .*'x' is not one"),
    ("--precisions", "fp64", r"--precisions takes .*fp32.*not fp64"),
    ("--output-len", "0", r"--output-len takes a positive length"),
    ("--requests", "-1", r"--requests takes a positive integer"),
])
def test_a_bad_option_value_is_refused_with_the_reason(option, value, reason):
    with pytest.raises(CommandError, match=reason):
        sweep("qwen3-0.6b", *TINY, option, value)
