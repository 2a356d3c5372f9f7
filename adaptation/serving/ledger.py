"""A cluster's prediction ledger: the serve sweep trials its nodes ran, what d0 predicted for each beside what was
measured (``workers.engine.serving.ledger``), the error distribution the cluster page shows, and the calibration
its next serve sweep is given (``serving.stage.ServeSweep.prepare``)."""

from __future__ import annotations

from workers.engine.serving import ledger

from ..choices import JobStatus
from ..models import Cluster, StageRun
from .services import ENGINE_REPORT_KIND

# The latest serve sweeps read: a cluster's recent history is what describes its nodes now (a node's software and
# load change), and it keeps the page's read bounded.
HISTORY_RUNS = 50


def ledger_rows(cluster: Cluster) -> list[dict]:
    """Every ledger row of the cluster's latest ``HISTORY_RUNS`` successful serve sweeps (one query)."""
    runs = (StageRun.objects.filter(job__cluster=cluster, kind=ENGINE_REPORT_KIND, status=JobStatus.SUCCEEDED)
            .order_by("-id").values_list("pk", "result")[:HISTORY_RUNS])
    return [row for pk, result in runs if isinstance(result, dict)
            for row in ledger.rows_of(result, source=f"stage run {pk}")]


def error_distribution(cluster: Cluster) -> dict:
    """What the cluster page shows: per engine and metric, the median and P90 relative error of what d0 predicted
    at the time (calibrated or not) and of the roofline alone, and each engine's calibration now."""
    rows = ledger_rows(cluster)
    roofline = {(entry["engine"], entry["metric"]): entry for entry in ledger.error_table(rows, "roofline")}
    table = [{**entry, "roofline": roofline.get((entry["engine"], entry["metric"]))}
             for entry in ledger.error_table(rows, "predicted")]
    engines = sorted({row["engine"] for row in rows})
    calibrations = [ledger.fit_calibration(rows, engine) for engine in engines]
    return {"table": table, "metrics": ledger.METRICS,
            "calibrations": [{**fitted, "shown": ledger.describe_fits(fitted)} for fitted in calibrations if fitted]}


def calibration(cluster: Cluster, engine: str) -> dict | None:
    """The calibration of ``engine``'s predictions on this cluster, fitted on its measured trials; None (the
    roofline alone) until it has some."""
    return ledger.fit_calibration(ledger_rows(cluster), engine)
