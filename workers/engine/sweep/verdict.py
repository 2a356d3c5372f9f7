"""Whether a sweep's winner is a winner: from each finalist's repeated measurements of the deciding figure (output
tokens/s, or goodput under SLOs), its median and range, and a verdict. The proxy sweep (``confirm``) and a real
engine's sweep (``serving.serve_sweep.best_trial``) both judge their finalists here.

The rule: each candidate is measured ``MIN_RUNS`` (3) times at least; the winner is the highest median; it is
``confirmed`` only when its interval lies wholly above the runner-up's, else the two are a tie, "inconclusive at
this noise", and the report says so instead of naming a winner as settled.

The interval is the **range of the runs** (min to max), not a 95% t-interval of the mean. Why:
- For 3 runs against 3, ranges that do not overlap (every run of the winner above every run of the runner-up) is
  exactly the exact Mann-Whitney rank test at one-sided p = 1 / C(6, 3) = 0.05, and with more runs it is stricter
  (4 against 4: 1/70). It needs no assumption about the noise's shape, which on a busy node is not normal: one slow
  spell makes a run of 54 tok/s among runs near 300.
- A t-interval of 3 runs is the mean ± 4.30 s/sqrt(3), and it assumes normal noise; non-overlap of two 95%
  intervals is a test at about p < 0.006, so it would call nearly every proxy comparison a tie, and a single
  outlier's pull on the mean and s would decide it.
- The range is what a reader sees in the table (every run's figure), so the verdict can be checked by eye.
The centre is the median, robust to one outlier, taken as the figure of a real run (the lower middle of an even
count, as a trial's reported run is its median one: ``runner.repeated``); the mean is reported beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

MIN_RUNS = 3
CONFIRMED = "confirmed"
INCONCLUSIVE = "inconclusive at this noise"
# One configuration reached the finals (the others failed or the grid had one): nothing to beat, nothing confirmed.
UNCONTESTED = "uncontested"
VERDICTS = (CONFIRMED, INCONCLUSIVE, UNCONTESTED)
INTERVAL = "min-max of the runs"


def median_run(values: Iterable[float]) -> float:
    """The median as one run's figure: the middle run, the lower middle of an even count."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def summary(runs: Iterable[float]) -> dict:
    """A candidate's runs of the deciding figure: each run's value, their count, median, mean, range, and the
    relative spread ((max - min) / median)."""
    values = [float(value) for value in runs]
    if not values:
        raise ValueError("a candidate needs at least one run")
    median = median_run(values)
    low, high = min(values), max(values)
    return {"runs": values, "count": len(values), "median": median, "mean": statistics.fmean(values),
            "min": low, "max": high, "spread": (high - low) / median if median else None}


def judge(candidates: list[dict], figure: str) -> dict | None:
    """The verdict over ``candidates`` (each a dict with ``runs``, the deciding figure's values, higher better, and
    whatever names it: an id, params, settings), ranked by median. Returns ``verdict`` (one of ``VERDICTS``),
    ``figure``, ``interval`` (how the interval is drawn), ``winner`` and ``runner_up`` (each the candidate's
    names with its ``summary``; runner_up None when uncontested) and ``reason``, a sentence; None without
    candidates."""
    if not candidates:
        return None
    ranked = sorted(({**candidate, **summary(candidate["runs"])} for candidate in candidates),
                    key=lambda candidate: candidate["median"], reverse=True)
    winner = ranked[0]
    runner_up = ranked[1] if len(ranked) > 1 else None
    if runner_up is None:
        verdict, reason = UNCONTESTED, "the only configuration that served the full workload"
    elif min(winner["count"], runner_up["count"]) < MIN_RUNS:
        verdict = INCONCLUSIVE
        reason = (f"too few runs to judge: {winner['count']} and {runner_up['count']}, at least {MIN_RUNS} each "
                  "are needed")
    elif winner["min"] > runner_up["max"]:
        verdict = CONFIRMED
        reason = (f"every run of the winner ({_range(winner)}) is above every run of the runner-up "
                  f"({_range(runner_up)})")
    else:
        verdict = INCONCLUSIVE
        reason = (f"the winner's runs ({_range(winner)}) overlap the runner-up's ({_range(runner_up)}): "
                  "the difference is within the noise")
    return {"verdict": verdict, "figure": figure, "interval": INTERVAL, "winner": winner, "runner_up": runner_up,
            "reason": reason}


def _range(candidate: dict) -> str:
    return f"{candidate['min']:.4g}–{candidate['max']:.4g} over {candidate['count']} runs"
