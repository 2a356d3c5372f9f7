"""The best configuration confirmed, not taken from one pass: the top candidates of the search re-measured.

The highest of many noisy figures overstates its configuration (the winner's curse: a grid pass's
best 6.7% above its own re-measured throughput at the median, 35% at worst), and a configuration that won by noise
beats a better one. So the ``CONFIRM_TOP`` best trials that served the full workload are served again, each
``repeats`` times, and the best is the highest re-measured median: its figures are the re-measurement's, which the
selection did not bias, and the first pass's figure is kept beside them.
"""

from __future__ import annotations

from collections.abc import Callable

from .search import throughput

CONFIRM_TOP = 3


def candidates(trials: list[dict], requests: int, top: int = CONFIRM_TOP) -> list[dict]:
    """The ``top`` highest-throughput trials that served the full workload (``requests`` requests), best first."""
    finished = [trial for trial in trials
                if trial["status"] == "ok" and (trial.get("workload") or {}).get("requests") == requests]
    return sorted(finished, key=throughput, reverse=True)[:top]


def confirm(trials: list[dict], requests: int, remeasure: Callable[[dict], dict], top: int = CONFIRM_TOP) -> dict:
    """Re-measure the top candidates (``remeasure(trial) -> trial``, a fresh repeated trial of the same
    configuration) and pick the highest re-measured median; ``top`` 0 takes the first pass's leader as it is.
    Returns ``picked`` (the original trial's id, or None),
    ``best`` (the re-measured trial of the pick, or None) and ``candidates`` (each: ``id``, ``params``,
    ``first_pass`` and ``remeasured`` output tokens/s, ``status``, ``repeats``)."""
    if top <= 0:  # no confirmation asked for (a benchmark timing the search alone): the first pass's leader
        leader = candidates(trials, requests, 1)
        return {"top": 0, "candidates": [], "picked": leader[0]["id"] if leader else None,
                "best": leader[0] if leader else None, "first_pass_leader": leader[0]["id"] if leader else None}
    chosen = candidates(trials, requests, top)
    rows, best, picked = [], None, None
    for trial in chosen:
        again = remeasure(trial)
        ok = again["status"] == "ok"
        rows.append({"id": trial["id"], "params": trial["params"], "first_pass": throughput(trial),
                     "remeasured": throughput(again) if ok else None, "status": again["status"],
                     "reason": again.get("reason"), "repeats": again.get("repeats")})
        if ok and (best is None or throughput(again) > throughput(best)):
            best, picked = again, trial["id"]
    return {"top": top, "candidates": rows, "picked": picked, "best": best,
            "first_pass_leader": chosen[0]["id"] if chosen else None}
