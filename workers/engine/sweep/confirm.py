"""The best configuration judged, not taken from one pass: the top candidates of the search re-measured, and the
winner named only when its runs stand clear of the runner-up's (``verdict``).

The highest of many noisy figures overstates its configuration (the winner's curse: a grid pass's
best 6.7% above its own re-measured throughput at the median, 35% at worst), and a configuration that won by noise
beats a better one. So the ``CONFIRM_TOP`` best trials that served the full workload are served again, each
``repeats`` (>= 3) times, and the judgement is made on the re-measured runs alone, which the selection did not
bias: the best is the highest re-measured median, confirmed when its runs are all above the runner-up's, else a
tie at this noise. The first pass's figure is kept beside them, never shown as the pick's.
"""

from __future__ import annotations

from collections.abc import Callable

from .search import OBJECTIVE, throughput
from .verdict import judge

# At least the winner and a runner-up: a verdict needs someone to beat.
CONFIRM_TOP = 3
MIN_CONFIRM_TOP = 2


def candidates(trials: list[dict], requests: int, top: int = CONFIRM_TOP) -> list[dict]:
    """The ``top`` highest-throughput trials that served the full workload (``requests`` requests), best first."""
    finished = [trial for trial in trials
                if trial["status"] == "ok" and (trial.get("workload") or {}).get("requests") == requests]
    return sorted(finished, key=throughput, reverse=True)[:top]


def runs(trial: dict) -> list[float]:
    """A trial's runs of the deciding figure: every repeat's output tokens/s (its own figure when not repeated)."""
    repeats = trial.get("repeats") or {}
    return list(repeats.get(OBJECTIVE) or [throughput(trial)])


def confirm(trials: list[dict], requests: int, remeasure: Callable[[dict], dict], top: int = CONFIRM_TOP) -> dict:
    """Re-measure the top candidates (``remeasure(trial) -> trial``, a fresh repeated trial of the same
    configuration) and judge them on the re-measured runs; ``top`` 0 takes the first pass's leader as it is,
    unjudged. Returns ``picked`` (the original trial's id, or None), ``best`` (the re-measured trial of the pick,
    or None), ``verdict`` (``verdict.judge`` over the re-measured runs, or None) and ``candidates`` (each: ``id``,
    ``params``, ``first_pass`` and ``remeasured`` output tokens/s, ``status``, ``repeats``)."""
    if top <= 0:  # no confirmation asked for (a benchmark timing the search alone): the first pass's leader
        leader = candidates(trials, requests, 1)
        return {"top": 0, "candidates": [], "picked": leader[0]["id"] if leader else None,
                "best": leader[0] if leader else None, "first_pass_leader": leader[0]["id"] if leader else None,
                "verdict": None}
    chosen = candidates(trials, requests, top)
    rows, remeasured = [], {}
    for trial in chosen:
        again = remeasure(trial)
        ok = again["status"] == "ok"
        if ok:
            remeasured[trial["id"]] = (trial, again)
        rows.append({"id": trial["id"], "params": trial["params"], "first_pass": throughput(trial),
                     "remeasured": throughput(again) if ok else None, "status": again["status"],
                     "reason": again.get("reason"), "repeats": again.get("repeats")})
    verdict = judge([{"id": trial["id"], "params": trial["params"], "runs": runs(again)}
                     for trial, again in remeasured.values()], OBJECTIVE)
    picked = verdict["winner"]["id"] if verdict else None
    return {"top": top, "candidates": rows, "picked": picked, "best": remeasured[picked][1] if verdict else None,
            "first_pass_leader": chosen[0]["id"] if chosen else None, "verdict": verdict}
