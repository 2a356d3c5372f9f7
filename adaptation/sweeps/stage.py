"""The control plane's side of the proxy ``sweep`` stage: the node's measured figures for its roofline, its outcome
(always labelled a proxy) and its report page."""

from __future__ import annotations

from django.urls import reverse

from workers.engine.sweep.result import SweepResult, served

from ..stages import Outcome, StageHandler, register
from .services import KIND, with_measured_hardware


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
        throughput = result.best.metrics.output_tokens_per_s if result.best and result.best.metrics else None
        warnings = ["a proxy: " + ("a reduced" if result.model.get("reduced") else "the full")
                    + " model with random weights on transformers, not a serving engine"]
        if result.over_ceiling:
            warnings.append("a trial measured faster than its roofline ceiling: the ceiling is suspect")
        headline = f"best {throughput:.1f} output tok/s" if throughput else "no best configuration"
        return Outcome(f"{headline}; {served(result.trials)}", warnings)

    def page(self, job, run) -> str | None:
        return reverse("sweep-report", args=[run.pk]) if run.status == "succeeded" else None
