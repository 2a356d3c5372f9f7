"""One line per stage run for the top of the job page: what it found, its headline figure and its warnings, read
from the stored result by the stage's handler (``adaptation/stages.py``), so a job that "succeeded" says what it
succeeded at (and a sweep that was a proxy says so)."""

from __future__ import annotations

from .. import stages as handlers
from ..models import StageRun


def outcome(run: StageRun) -> dict:
    """``{"kind", "node", "status", "summary", "warnings"}``; a failed or unfinished run says that instead."""
    base = {"kind": run.kind, "node": run.node_name, "status": run.status, "warnings": []}
    if run.status != "succeeded":
        return {**base, "summary": run.error or run.message or run.status}
    if not isinstance(run.result, dict):
        return {**base, "summary": "no result stored", "warnings": ["a succeeded stage without a result"]}
    try:
        found = handlers.handler(run.kind).outcome(run.result)
    except KeyError:  # a kind no longer registered: its result is still shown on the stage run
        return {**base, "summary": "result stored (its stage kind is not registered here)"}
    except (TypeError, ValueError, AttributeError) as error:  # an odd result: say so, not a 500
        return {**base, "summary": f"result stored ({type(error).__name__} reading it)"}
    return {**base, "summary": found.summary, "warnings": list(found.warnings)}
