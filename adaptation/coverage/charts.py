"""The models × backends coverage heatmap's data (``static/js/coverage.js`` draws it with plotly)."""

from __future__ import annotations

from ..models import CoverageReport
from .services import latest_reports


def heatmap(user) -> dict:
    """Models × backends, each cell the lowest coverage over dtypes of the newest reports."""
    reports = CoverageReport.objects.for_user(user).select_related("model").defer("report")
    cells: dict[tuple[str, str], float] = {}
    models: dict[int, str] = {}
    for (model_id, backend, _), report in latest_reports(reports).items():
        models[model_id] = report.model.name
        key = (report.model.name, backend)
        cells[key] = min(cells.get(key, 1.0), report.coverage)
    backends = sorted({backend for _, backend in cells})
    names = sorted(models.values())
    return {"models": names, "backends": backends,
            "coverage": [[cells.get((name, backend)) for backend in backends] for name in names],
            "model_ids": {name: model_id for model_id, name in models.items()}}
