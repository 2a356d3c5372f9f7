"""One trial, four views: a stored sweep result (a trial within its roofline ceiling, one flagged faster than it, one
stored before flags existed) through the report page, the CSV download, the JSON download and ``manage.py sweep``
gives the same figures everywhere: output tokens/s, TTFT p50, and the efficiency or its flag."""

import csv
import io
import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from adaptation.models import StageRun
from workers.engine.__main__ import main
from workers.engine.sweep.result import SweepResult
from workers.engine.sweep.trial_row import SWEEP_COLUMNS

from .conftest import CONFIGS
from .engine.test_result_schema import stored_sweep
from .test_sweep_reports import stored_sweep as stored_run
from .test_sweep_reports import sweep_result  # noqa: F401 - a real sweep, module-scoped

pytestmark = pytest.mark.django_db
# trial id -> (output tok/s, TTFT p50 as the tables write it, efficiency as the tables write it, flagged)
EXPECTED = {0: ("812.5", "12.3 ms", "0.42", False), 1: ("1650.2", "10.1 ms", "ceiling suspect (1.37×)", True),
            3: ("900.0", "20.0 ms", "ceiling suspect (1.90×)", True)}


def page_rows(page: str) -> dict[str, dict[str, str]]:
    """The page's trial table as {id: {header: the cell's text}}."""
    table = page[page.index('<table class="trials">'):page.index("</table>", page.index('<table class="trials">'))]
    headers = re.findall(r"<th[^>]*>(.*?)</th>", table)
    rows = {}
    for row in re.findall(r"<tr><td>(.*?)</td></tr>", table, re.S):
        cells = [re.sub(r"<small>.*?</small>|<[^>]+>", "", cell).strip() for cell in row.split("</td><td>")]
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows


def test_one_trial_reads_the_same_on_the_page_in_the_csv_the_json_and_the_command(cluster, owner, member, node,
                                                                                    monkeypatch, tmp_path):
    stored = stored_sweep()
    run = stored_run(cluster, owner, node, stored)
    client = Client()
    client.force_login(member)
    page = page_rows(client.get(f"/sweeps/{run.pk}/").content.decode())
    web_csv = client.get(f"/sweeps/{run.pk}/trials.csv").content.decode()
    downloaded = json.loads(client.get(f"/sweeps/{run.pk}/report.json").content)

    monkeypatch.setattr("workers.engine.sweep.run_sweep", lambda *args, **kwargs: stored)
    out = StringIO()
    call_command("sweep", "qwen3-0.6b", "--out", str(tmp_path), stdout=out, stderr=StringIO())
    terminal = {line.split()[0].lstrip("*"): line for line in out.getvalue().splitlines()
                if re.match(r"^\s*\*?\d+\s", line)}
    command_csv = (tmp_path / "trials.csv").read_bytes().decode()
    assert command_csv == web_csv  # the command's CSV is the page's, byte for byte

    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(web_csv))}
    trials = {trial.id: trial for trial in SweepResult.from_dict(downloaded).trials}
    for number, (throughput, ttft, efficiency, flagged) in EXPECTED.items():
        key, trial, row = str(number), trials[number], rows[str(number)]
        assert page[key]["out tok/s"] == throughput and throughput in terminal[key]
        assert page[key]["TTFT p50"] == ttft and ttft in terminal[key]
        assert page[key]["roofline eff"] == efficiency and efficiency in terminal[key]
        assert f"{float(row['output_tokens_per_s']):.1f}" == f"{trial.metrics.output_tokens_per_s:.1f}" == throughput
        assert f"{float(row['ttft_p50_s']) * 1000:.1f} ms" == f"{trial.metrics.ttft_s.p50 * 1000:.1f} ms" == ttft
        assert row["roofline_ceiling_suspect"] == str(flagged) and trial.efficiency.flagged == flagged
        assert row["roofline_efficiency"] == ("" if flagged else efficiency) == (
            "" if flagged else f"{trial.efficiency.figure:.2f}")
    # A flagged trial's figure is nowhere shown as an efficiency; the page counts it among those over the ceiling
    assert "0.42" not in page["1"]["roofline eff"] and "1.37" not in rows["1"]["roofline_efficiency"]
    assert page["2"]["status"] == "oom" and page["2"]["roofline eff"] == "—" and rows["2"]["reason"]
    assert "2 trial(s) measured faster than the roofline's ceiling" in client.get(f"/sweeps/{run.pk}/").content.decode()


def test_a_real_sweeps_result_is_all_declared_by_the_schema(sweep_result):  # noqa: F811
    """The engine writes no key the schema does not name, and the schema writes back exactly what was stored."""
    stored = json.loads(json.dumps(sweep_result))
    result = SweepResult.from_dict(stored)
    records = [result, result.best, *result.trials, *(trial.metrics for trial in result.trials),
               *(trial.roofline for trial in result.trials), *(trial.repeats for trial in result.trials),
               result.verdict, result.verdict.winner, result.verdict.runner_up]
    assert result.verdict.winner.id == result.best.id
    assert [record.extra for record in records if record is not None and record.extra] == []
    assert result.as_dict() == stored


def stored_serve_sweep() -> dict:
    """An engine sweep's result as a node stores it: a trial that ran out of memory, one served; a recipe whose
    prediction was stored before flags existed (faster than its ceiling: no efficiency, the ratio beside it)."""
    served = {"output_tokens_per_s": 431.25, "ttft_s": {"p50": 0.0456, "p99": 0.09}, "tpot_s": {"p50": 0.01},
              "peak_memory_bytes": 5 * 2**30}
    return {"engine": {"name": "vllm", "version": "0.32.0"}, "weights": {"kind": "validation checkpoint"},
            "trials": [{"id": 0, "settings": {"max_num_seqs": 8}, "client": {"concurrency": 8}, "status": "failed",
                        "cause": "out of memory", "reason": "KV cache does not fit", "metrics": None},
                       {"id": 1, "settings": {"max_num_seqs": 4}, "client": {"concurrency": 4}, "status": "ok",
                        "startup_s": 31.5, "metrics": served, "workload": {"requests": 8, "concurrency": 4}}],
            "best": {"id": 1, "settings": {"max_num_seqs": 4}, "client": {"concurrency": 4}, "metrics": served},
            "recipe": {"engine": "vllm", "command": "vllm serve /m --max-num-seqs 4", "env": {}, "trial": 1,
                       "measured": served, "prediction": {"available": True, "efficiency": None,
                                                          "ceiling_ratio": 3.0, "note": "faster than the ceiling"}},
            "engine_starts": 2, "seconds": 80.0}


def test_the_engine_and_endpoint_reports_show_their_trials_through_the_same_row_declaration(job, node, member):
    client = Client()
    client.force_login(member)
    engine = StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                     status="succeeded", result=stored_serve_sweep())
    page = client.get(f"/engines/{engine.pk}/").content.decode()
    rows = page_rows(page)
    assert rows["1"]["out tok/s"] == "431.2" and rows["1"]["TTFT p50"] == "45.6 ms"
    assert rows["1"]["engine settings"] == "max_num_seqs=4" and rows["1"]["start"] == "31.5 s"
    assert rows["0"]["status"] == "failed (out of memory)" and "KV cache does not fit" in page
    assert '<strong class="flag">measured faster than the ceiling (3.00×): faster than the ceiling</strong>' in page
    stored = stored_serve_sweep()
    bench = StageRun.objects.create(job=job, kind="endpoint_bench", node=node, node_name=node.hostname,
                                    status="succeeded", result={
                                        "endpoint": {"base_url": "http://gpu-3:8000", "served_model": "m"},
                                        "trials": [{**stored["trials"][1], "settings": None, "startup_s": None}],
                                        "best": stored["best"], "workload": {"requests": 8}, "seconds": 4.0})
    rows = page_rows(client.get(f"/endpoints/reports/{bench.pk}/").content.decode())
    assert rows["1"]["out tok/s"] == "431.2" and rows["1"]["client"] == "concurrency=4"
    assert "engine settings" not in rows["1"] and "start" not in rows["1"]


def test_the_engines_command_line_prints_the_same_trial_rows(capsys):
    main(["sweep", str(CONFIGS / "qwen3-0.6b.json"), "--batch-sizes", "1,2", "--requests", "2", "--prompt-len", "8",
          "--output-len", "3", "--device", "cpu", "--confirm-top", "2"])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("id "))
    assert all(column.header in header for column in SWEEP_COLUMNS if column.terminal)
    rows = lines[lines.index(header) + 2:lines.index(header) + 4]
    assert [row.split()[1:4] for row in rows] == [["fp32", "1", "16"], ["fp32", "2", "16"]]
    assert any(line.startswith("Best: trial ") for line in lines)
    assert any(line.startswith(("Verdict: confirmed: ", "Verdict: inconclusive at this noise: ")) for line in lines)
    assert any(line.startswith("Search: grid, 2 trials run of 2 configurations") for line in lines)
