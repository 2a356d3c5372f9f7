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
        layout = result.get("layout") or {}
        shape = " × ".join(f"{axis}{size}" for axis, size in layout.items() if isinstance(size, int) and size > 1)
        verdict = "correct" if result.get("correct") else "NOT correct"
        return Outcome(f"{verdict} against the fp32 reference ({shape or 'one rank'}, "
                       f"world {result.get('world_size', '?')})")

    def page(self, job, run) -> str | None:
        return reverse("sharded-run", args=[run.pk]) if run.status in ("succeeded", "failed") else None
