"""Dimension search, the ``d = a + c log N`` fit, and the information-theoretic bound.

The abstract's claims are about scaling: a logarithmic embedding dimension
suffices to memorise ``R`` bijections over ``N`` entities, and multi-hop
queries trade depth (chain-of-thought steps) for capacity. This module finds
the smallest dimension reaching a target accuracy, fits it against ``log N``,
and counts the information the facts carry: ``R log2(N!)`` bits for ``R``
random bijections (every bijection is one of ``N!`` equally likely).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def smallest_dim(evaluate: Callable[[int], float], grid: Sequence[int],
                 target: float = 0.99, start: int | None = None
                 ) -> tuple[int | None, dict[int, float]]:
    """The smallest ``d`` of a sorted grid with ``evaluate(d) >= target``.

    Without ``start``: bisection, O(log len(grid)) evaluations (the largest point first).
    With ``start`` (a guess on the grid, e.g. the answer at a smaller N): a walk from it,
    down while points pass and up while they fail, so that a good guess costs two
    evaluations (the answer and the point below it). Both assume accuracy grows with
    ``d`` (it does in expectation; a single seed may wobble near the threshold), and both
    evaluate the grid point just below the answer unless the answer is the grid's first.

    Returns:
      ``(d_star or None if even the largest grid point misses, {d: accuracy evaluated})``.
    """
    grid = sorted(int(g) for g in grid)
    if not grid or grid[0] <= 0:
        raise ValueError(f"grid={grid!r}; expected positive dimensions")
    if start is not None and int(start) not in grid:
        raise ValueError(f"start={start!r}; expected a point of the grid {grid}")
    seen: dict[int, float] = {}

    def ok(i):
        d = grid[i]
        if d not in seen:
            seen[d] = float(evaluate(d))
        return seen[d] >= target

    if start is not None:
        i = grid.index(int(start))
        if ok(i):
            while i > 0 and ok(i - 1):
                i -= 1
            return grid[i], dict(sorted(seen.items()))
        while i < len(grid) - 1:
            i += 1
            if ok(i):
                return grid[i], dict(sorted(seen.items()))
        return None, dict(sorted(seen.items()))
    if not ok(len(grid) - 1):
        return None, seen
    lo, hi = -1, len(grid) - 1  # invariant: grid[hi] passes, grid[lo] fails (or lo = -1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return grid[hi], dict(sorted(seen.items()))


def log_fit(ns: Sequence[int], dims: Sequence[float], *, linear: bool = False,
            level: float = 0.95) -> dict:
    """Ordinary least squares ``d = a + c ln N`` (``d = a + c N`` with ``linear``).

    Points whose ``d`` is None (no dimension reached the target) are dropped. The slope's
    two-sided ``level`` confidence interval is the textbook OLS t-interval
    ``c +- t_{(1+level)/2, k-2} * se(c)``, ``se(c)^2 = (SSR / (k-2)) / sum (x - xbar)^2``
    over the ``k`` points kept.

    Returns ``{"a", "c", "r2", "c_low", "c_high", "points"}`` (NaN fit with fewer than 3
    points; R^2 = 1 for a flat d, whose interval is then the single point ``c = 0``).
    """
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}; expected a confidence level in (0, 1)")
    pts = [(n if linear else math.log(n), d) for n, d in zip(ns, dims, strict=True)
           if d is not None]
    nan = float("nan")
    if len(pts) < 3:
        return {"a": nan, "c": nan, "r2": nan, "c_low": nan, "c_high": nan, "points": len(pts)}
    x, y = np.array(pts, dtype=float).T
    if float(np.ptp(y)) == 0.0:  # flat: slope exactly 0 (polyfit leaves rounding noise)
        c, a = 0.0, float(y[0])
    else:
        c, a = np.polyfit(x, y, 1)
    pred = a + c * x
    ssr = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ssr / ss_tot if ss_tot > 0 else 1.0
    from scipy import stats

    se = math.sqrt(ssr / (len(x) - 2) / float(np.sum((x - x.mean()) ** 2)))
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 2)) * se
    return {"a": float(a), "c": float(c), "r2": r2, "c_low": float(c) - half,
            "c_high": float(c) + half, "points": len(pts)}


def log_rule(ns: Sequence[int], dims: Sequence[float | None], *, min_points: int = 5,
             min_r2: float = 0.9, level: float = 0.95) -> dict:
    """The "d grows like log N" rule on measured smallest dimensions.

    Holds when every ``N`` reached the target (no None), there are at least
    ``min_points`` distinct ``N``, the slope of ``d = a + c ln N`` is positive with its
    ``level`` t-interval excluding 0 (``c_low > 0``: a flat or falling ``d`` fails), the
    log fit's R^2 is at least ``min_r2`` and at least the R^2 of ``d = a + c N``
    (growth is logarithmic rather than linear in ``N``).

    Returns the log fit's fields, ``"r2_linear"``, ``"n_values"`` and ``"holds"``.
    """
    fit = log_fit(ns, dims, level=level)
    lin = log_fit(ns, dims, linear=True, level=level)
    n_values = len({int(n) for n, d in zip(ns, dims, strict=True) if d is not None})
    holds = (all(d is not None for d in dims) and n_values >= min_points
             and fit["c_low"] > 0 and fit["r2"] >= min_r2 and fit["r2"] >= lin["r2"])
    return dict(fit, r2_linear=lin["r2"], n_values=n_values, holds=bool(holds))


def fact_bits(n: int, n_maps: int) -> float:
    """Bits in ``n_maps`` independent uniformly random bijections of ``[n]``: ``n_maps log2 n!``."""
    return n_maps * math.lgamma(n + 1) / math.log(2)


def bits_per_coordinate(n: int, n_maps: int, d: int | None) -> float:
    """Bits each subject-embedding coordinate must carry at dimension ``d``: ``bits / (N d)``.

    This is the information-theoretic bound read the other way: a table of
    ``N x d`` coordinates of ``b`` bits can only hold the facts if
    ``N d b >= n_maps log2 N!``, i.e. ``d >= n_maps log2(N!) / (N b) ~ n_maps log2(N) / b``.
    """
    if d is None or d <= 0:
        return float("nan")
    return fact_bits(n, n_maps) / (n * d)


def bound_dim(n: int, n_maps: int, bits: float) -> float:
    """Smallest ``d`` the counting bound allows with ``bits`` bits per coordinate."""
    return fact_bits(n, n_maps) / (n * bits)
