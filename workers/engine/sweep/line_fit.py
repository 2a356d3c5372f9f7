"""Straight lines fitted to (x, y) points: one place for the fits that find an engine's fixed cost per step beside
its cost per unit of roofline work (``roofline.step_overhead`` for the proxy sweep, ``serving.ledger`` for the
prediction ledger's calibration).

- ``least_squares_line``: ordinary least squares; exact on clean points, but one run slowed 3x by another job on
  the node pulls the whole line.
- ``theil_sen_line``: Theil (1950) and Sen (1968): the slope is the median of the slopes of every pair of points
  with different x, the intercept the median of y - slope x. Up to ~29% of the points can be arbitrarily wrong
  without moving it far, which is what a loaded machine's 2-4x outlier runs need.
"""

from __future__ import annotations

from itertools import combinations
from statistics import median


def least_squares_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through ``points``; None without two distinct x."""
    if len(points) < 2:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread_x = sum((x - mean_x) ** 2 for x in xs)
    if spread_x <= 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread_x
    return mean_y - slope * mean_x, slope


def theil_sen_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the Theil-Sen line through ``points``; None without two distinct x."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in combinations(points, 2) if x2 != x1]
    if not slopes:
        return None
    slope = median(slopes)
    return median(y - slope * x for x, y in points), slope
