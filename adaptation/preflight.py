"""The pre-flight gate: gated stages run only on nodes whose latest env check passed (or only warned) and is
recent enough. A refused node is named in the job's log with the reason, so the fix is obvious."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from workers.engine.stages import STAGES

from .choices import CheckVerdict
from .models import EnvReport, Node


def refusals(kind: str, nodes: list[Node], now=None) -> dict[int, str]:
    """Node id → why the gate refuses it for a stage of ``kind`` (empty when the stage is not gated)."""
    if not STAGES[kind].gated:
        return {}
    now = now or timezone.now()
    max_age = timedelta(hours=settings.D0_PREFLIGHT_MAX_AGE_HOURS)
    latest = EnvReport.objects.latest_per_node(nodes)
    reasons = {}
    for node in nodes:
        report = latest.get(node.pk)
        if report is None:
            reasons[node.pk] = f"node {node.hostname} has no env check yet: run an env_check job first"
        elif report.verdict == CheckVerdict.FAIL:
            failed = "; ".join(check["message"] for check in report.failed_checks) or "see its report"
            reasons[node.pk] = f"node {node.hostname} failed its latest env check ({report.created:%Y-%m-%d %H:%M}" \
                               f" UTC): {failed}"
        elif now - report.created > max_age:
            reasons[node.pk] = (f"node {node.hostname}'s latest env check is from {report.created:%Y-%m-%d %H:%M} "
                                f"UTC, older than {settings.D0_PREFLIGHT_MAX_AGE_HOURS:g} h: run env_check again")
    return reasons
