"""One line per stage run for the top of the job page: what it found, its headline figure and its warnings, read
from the stored result, so a job that "succeeded" says what it succeeded at (and a sweep that was a proxy says so).
"""

from __future__ import annotations

from ..models import StageRun
from ..sweeps.services import over_ceiling


def _percent(value) -> str:
    return f"{value * 100:.0f}%" if isinstance(value, int | float) else "?"


def _env_check(result: dict) -> tuple[str, list[str]]:
    devices = result.get("devices") or []
    kinds = sorted({device.get("kind", "?") for device in devices})
    warnings = [check["message"] for check in result.get("checks", []) if check.get("status") in ("warn", "fail")]
    return (f"{str(result.get('verdict', '?')).upper()}: {len(devices)} device(s) ({', '.join(kinds) or 'none'}), "
            f"{len(result.get('checks', []))} checks", warnings[:3])


def _op_coverage(result: dict) -> tuple[str, list[str]]:
    reports = result.get("reports") or {}
    # Gaps: operators neither native nor composite on the node (some of them decomposable).
    gaps = sorted({str(gap) for report in reports.values() for gap in (report.get("gaps") or [])})
    return (f"coverage {_percent(result.get('coverage'))} over {', '.join(reports) or 'no dtype'}"
            + (f"; {len(result.get('virtual') or {})} virtual backend(s) judged" if result.get("virtual") else ""),
            [f"{len(gaps)} gap(s): {', '.join(gaps[:6])}" + (" …" if len(gaps) > 6 else "")] if gaps else [])


def _sharded_run(result: dict) -> tuple[str, list[str]]:
    layout = result.get("layout") or {}
    shape = " × ".join(f"{axis}{size}" for axis, size in layout.items() if isinstance(size, int) and size > 1)
    verdict = "correct" if result.get("correct") else "NOT correct"
    return f"{verdict} against the fp32 reference ({shape or 'one rank'}, world {result.get('world_size', '?')})", []


def _served(trials: list[dict]) -> str:
    return f"{sum(trial.get('status') == 'ok' for trial in trials)} of {len(trials)} trials served"


def _sweep(result: dict) -> tuple[str, list[str]]:
    trials = result.get("trials") or []
    best = result.get("best") or {}
    metrics = best.get("metrics") or {}
    model = result.get("model") or {}
    warnings = ["a proxy: " + ("a reduced" if model.get("reduced") else "the full")
                + " model with random weights on transformers, not a serving engine"]
    if over_ceiling(result):
        warnings.append("a trial measured faster than its roofline ceiling: the ceiling is suspect")
    headline = (f"best {metrics['output_tokens_per_s']:.1f} output tok/s" if metrics.get("output_tokens_per_s")
                else "no best configuration")
    return f"{headline}; {_served(trials)}", warnings


def _serve_sweep(result: dict) -> tuple[str, list[str]]:
    recipe = result.get("recipe") or {}
    engine = result.get("engine") or {}
    measured = recipe.get("measured") or {}
    warnings = []
    if (result.get("weights") or {}).get("kind") == "validation checkpoint":
        warnings.append("served a validation checkpoint (reduced, random weights), not the release's weights")
    correctness = result.get("correctness") or {}
    if correctness and correctness.get("verdict") not in (None, "agree"):
        warnings.append(f"correctness: {correctness.get('verdict')}")
    return (f"recipe on {engine.get('name', '?')} {engine.get('version') or ''}: "
            f"{measured.get('output_tokens_per_s') or 0:.1f} output tok/s; {_served(result.get('trials') or [])}",
            warnings)


def _endpoint_bench(result: dict) -> tuple[str, list[str]]:
    best = result.get("best") or {}
    metrics = best.get("metrics") or {}
    endpoint = result.get("endpoint") or {}
    return (f"{endpoint.get('served_model', '?')} at {endpoint.get('base_url', '?')}: best "
            f"{metrics.get('output_tokens_per_s') or 0:.1f} output tok/s at concurrency "
            f"{(best.get('client') or {}).get('concurrency', '?')}", [])


def _env_probe(result: dict) -> tuple[str, list[str]]:
    devices = result.get("devices") or []
    return f"{len(devices)} device(s): " + ", ".join(sorted({str(d.get("name") or d.get("kind")) for d in devices})), []


SUMMARIES = {"env_probe": _env_probe, "env_check": _env_check, "op_coverage": _op_coverage,
             "sharded_run": _sharded_run, "sweep": _sweep, "serve_sweep": _serve_sweep,
             "endpoint_bench": _endpoint_bench}


def outcome(run: StageRun) -> dict:
    """``{"kind", "node", "status", "summary", "warnings"}``; a failed or unfinished run says that instead."""
    base = {"kind": run.kind, "node": run.node_name, "status": run.status, "warnings": []}
    if run.status != "succeeded":
        return {**base, "summary": run.error or run.message or run.status}
    if not isinstance(run.result, dict):
        return {**base, "summary": "no result stored", "warnings": ["a succeeded stage without a result"]}
    try:
        summary, warnings = SUMMARIES[run.kind](run.result)
    except (KeyError, TypeError, ValueError, AttributeError) as error:  # an old or odd result: say so, not a 500
        return {**base, "summary": f"result stored ({type(error).__name__} reading it)"}
    return {**base, "summary": summary, "warnings": warnings}
