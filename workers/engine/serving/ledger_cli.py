"""``python -m workers.engine ledger RESULT.json [...]``: the prediction ledger of stored serve sweep results (the
JSON ``serve --json`` prints, or a stage run's stored result): per engine and metric, the median and P90 relative
error of what d0 predicted and of the roofline alone, and the calibration fitted on them (``ledger``), as the
cluster page shows them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import ledger


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser("ledger", help="prediction against measurement over stored serve sweep results",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="serve sweep results (JSON files)")
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")
    return parser


def run(args: argparse.Namespace) -> dict:
    rows = []
    for path in args.results:
        result = json.loads(path.read_text())
        if not isinstance(result, dict):
            raise ValueError(f"{path} holds no serve sweep result (a JSON object)")
        rows += ledger.rows_of(result, source=str(path))
    engines = sorted({row["engine"] for row in rows})
    return {"rows": len(rows), "errors": ledger.error_table(rows, "predicted"),
            "roofline_errors": ledger.error_table(rows, "roofline"),
            "calibrations": {engine: ledger.fit_calibration(rows, engine) for engine in engines}}


def format_summary(report: dict) -> str:
    if not report["errors"]:
        return "no trial of these results carries a prediction beside its measurement"
    roofline = {(entry["engine"], entry["metric"]): entry for entry in report["roofline_errors"]}
    lines = [f"{'engine':8s} {'metric':14s} {'trials':>6s} {'median':>8s} {'P90':>8s}   roofline alone"]
    for entry in report["errors"]:
        alone = roofline[entry["engine"], entry["metric"]]
        lines.append(f"{entry['engine']:8s} {entry['label']:14s} {entry['trials']:6d} {entry['median']:8.1%} "
                     f"{entry['p90']:8.1%}   {alone['median']:.1%} / {alone['p90']:.1%}")
    for engine, fitted in report["calibrations"].items():
        lines.append(f"{engine}: calibrated on {fitted['trials']} trials: " + "; ".join(
            f"{shown['label']} {shown['fit']}" for shown in ledger.describe_fits(fitted)))
    return "\n".join(lines)
