"""The control plane's side of the ``op_coverage`` stage: the team's virtual backends as operator lists for the
node, each report kept per backend and dtype (and the team's operator library grown), its outcome and its page."""

from __future__ import annotations

from django import forms
from django.urls import reverse

from workers.engine.parameters import ParameterError

from ..stages import Outcome, StageHandler, register
from ..models import VirtualBackend
from .services import operator_lists, store_op_coverage

KEY = "virtual_backends"


def _percent(value) -> str:
    return f"{value * 100:.0f}%" if isinstance(value, int | float) else "?"


@register
class OpCoverage(StageHandler):
    kind = "op_coverage"

    def check(self, job) -> None:
        ids = (job.parameters.get(self.kind) or {}).get(KEY) or []
        if ids and job.team_id:
            known = set(VirtualBackend.objects.filter(team_id=job.team_id, pk__in=ids).values_list("pk", flat=True))
            missing = [backend for backend in ids if backend not in known]
            if missing:
                raise ParameterError(f"{self.kind}.{KEY}", f"no virtual backend {missing[0]} in this team")

    def form_field(self, parameter, user):
        if parameter.name != KEY:
            return None
        return forms.ModelMultipleChoiceField(queryset=VirtualBackend.objects.for_user(user), required=False,
                                              widget=forms.CheckboxSelectMultiple, label=parameter.name,
                                              help_text=parameter.help + ".")

    def prepare(self, job, params: dict, nodes: list) -> dict:
        if KEY not in params:
            return params
        # Ids of the team's virtual backends become the operator lists the node judges against.
        params = dict(params)
        params["virtual_backend_lists"] = operator_lists(job.team, params.pop(KEY))
        return params

    def store(self, run) -> None:
        store_op_coverage(run)

    def outcome(self, result: dict) -> Outcome:
        reports = result.get("reports") or {}
        # Gaps: operators neither native nor composite on the node (some of them decomposable).
        gaps = sorted({str(gap) for report in reports.values() for gap in (report.get("gaps") or [])})
        virtual = f"; {len(result.get('virtual') or {})} virtual backend(s) judged" if result.get("virtual") else ""
        return Outcome(f"coverage {_percent(result.get('coverage'))} over {', '.join(reports) or 'no dtype'}{virtual}",
                       [f"{len(gaps)} gap(s): {', '.join(gaps[:6])}" + (" …" if len(gaps) > 6 else "")] if gaps else [])

    def page(self, job, run) -> str | None:
        return reverse("model-coverage", args=[job.model_id]) if run.status == "succeeded" else None
