"""The control plane's side of the proxy ``sweep`` stage: the node's measured figures for its roofline, its outcome
(always labelled a proxy, its best figure with its runs' range and the verdict) and its report page."""

from __future__ import annotations

from django.urls import reverse

from workers.engine.sweep.result import SweepResult, served

from ..stages import Outcome, StageHandler, register
from .services import KIND, with_measured_hardware


def proxy_label(model: dict) -> str:
    """What the proxy served, in a few words: never to be read as the release's own figures."""
    if not model.get("reduced"):
        return "proxy (the full architecture, random weights)"
    shape = f"{model['layers']}-layer reduced model" if model.get("layers") else "reduced model"
    if model.get("hidden_size"):
        shape += f", hidden size {model['hidden_size']}"
    return f"proxy ({shape}, random weights)"


def headline(result: SweepResult) -> str:
    """The best figure as the verdict judged it: the re-measured median with the runs' range and the verdict (a
    report stored before verdicts gives its figure and says it was not judged)."""
    label = proxy_label(result.model)
    verdict = result.verdict
    if verdict and verdict.winner:
        winner = verdict.winner
        return (f"{label}: best {winner.median:.1f} output tok/s (median of {winner.count} runs, "
                f"{winner.min:.1f}–{winner.max:.1f}) — {verdict.verdict}")
    throughput = result.best.metrics.output_tokens_per_s if result.best and result.best.metrics else None
    if throughput:
        return f"{label}: best {throughput:.1f} output tok/s, not judged (stored before verdicts)"
    return f"{label}: no best configuration"


@register
class Sweep(StageHandler):
    kind = KIND
    # The job form's name for it: its figures are d0's stand-in's, never an engine's (the whole adaptation ends in
    # the engine's serve sweep instead).
    label = "Proxy sweep (d0's reduced model on transformers, not a serving engine)"

    def prepare(self, job, params: dict, nodes: list) -> dict:
        return with_measured_hardware(params, nodes[0])

    def outcome(self, stored: dict) -> Outcome:
        result = SweepResult.from_dict(stored)
        warnings = ["a proxy: " + ("a reduced" if result.model.get("reduced") else "the full")
                    + " model with random weights on transformers, not a serving engine"]
        if result.verdict and not result.verdict.confirmed and result.verdict.runner_up:
            warnings.append(f"no winner at this noise: {result.verdict.reason} "
                            f"(runner-up {result.verdict.runner_up.label})")
        if result.knobs_not_swept:
            warnings.append(f"not swept: {', '.join(result.knobs_not_swept.get('knobs') or {})}, which the static "
                            "path this architecture is served by does not use")
        if result.over_ceiling:
            warnings.append("a trial measured faster than its roofline ceiling: the ceiling is suspect")
        return Outcome(f"{headline(result)}; {served(result.trials)}", warnings)

    def page(self, job, run) -> str | None:
        return reverse("sweep-report", args=[run.pk]) if run.status == "succeeded" else None
