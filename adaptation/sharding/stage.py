"""The control plane's side of the ``sharded_run`` stage: the size of its torch.distributed world (placed on a group
of nodes), its outcome and its page (a failed run's page too: it says which rank broke)."""

from __future__ import annotations

from django.urls import reverse

from workers.engine.sharding.layout import Layout

from ..stages import Outcome, StageHandler, register
from .services import KIND


@register
class ShardedRun(StageHandler):
    kind = KIND

    def world_size(self, params: dict) -> int:
        return Layout(**{axis: int(params.get(axis, 1)) for axis in ("tp", "pp", "ep")}).world_size

    def outcome(self, result: dict) -> Outcome:
        """The engine's summary line ("EP2 × TP1 on 2 ranks (plan DP16 + EP16 on 16 devices): matched the
        reference, ..."), warnings for a rank holding more than its layout should or an axis not exercised; a report
        from before the summary existed is worded from its layout."""
        summary = result.get("summary") or _summary_of_an_older_report(result)
        warnings = []
        split = result.get("split") or {}
        if split.get("weakly_sharded"):
            warnings.append(f"weakly sharded: a rank holds {split['largest_share'] * 100:.1f} % of its stage's "
                            f"weights, the layout's ideal is {split['ideal_share'] * 100:.1f} %")
        for axis, figures in (result.get("axes") or {}).items():
            if not figures.get("exercised"):
                warnings.append(f"{axis.upper()}{figures['size']} was not exercised")
        return Outcome(summary, warnings)

    def page(self, job, run) -> str | None:
        return reverse("sharded-run", args=[run.pk]) if run.status in ("succeeded", "failed") else None


def _summary_of_an_older_report(result: dict) -> str:
    layout = Layout(**{axis: int((result.get("layout") or {}).get(axis, 1)) for axis in ("tp", "pp", "ep")})
    verdict = "matched the reference" if result.get("correct") else "did NOT match the reference"
    return f"{layout.label()} on {result.get('world_size', layout.world_size)} ranks: {verdict}"
