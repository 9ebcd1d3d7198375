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
                 target: float = 0.99) -> tuple[int | None, dict[int, float]]:
    """Bisection over a sorted grid for the smallest ``d`` with ``evaluate(d) >= target``.

    Assumes accuracy grows with ``d`` (it does in expectation; a single seed may
    wobble near the threshold). Evaluates O(log len(grid)) points.

    Returns:
      ``(d_star or None if even the largest grid point misses, {d: accuracy evaluated})``.
    """
    grid = sorted(int(g) for g in grid)
    if not grid or grid[0] <= 0:
        raise ValueError(f"grid={grid!r}; expected positive dimensions")
    seen: dict[int, float] = {}

    def ok(i):
        d = grid[i]
        if d not in seen:
            seen[d] = float(evaluate(d))
        return seen[d] >= target

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


def log_fit(ns: Sequence[int], dims: Sequence[float], *, linear: bool = False) -> dict:
    """Least-squares fit ``d = a + c ln N`` (``d = a + c N`` with ``linear``).

    Returns ``{"a", "c", "r2"}`` (NaN with fewer than 3 points; R^2 = 1 for a flat d).
    """
    pts = [(n if linear else math.log(n), d) for n, d in zip(ns, dims, strict=True)
           if d is not None]
    if len(pts) < 3:
        return {"a": float("nan"), "c": float("nan"), "r2": float("nan")}
    x, y = np.array(pts).T
    c, a = np.polyfit(x, y, 1)
    pred = a + c * x
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return {"a": float(a), "c": float(c), "r2": r2}


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
