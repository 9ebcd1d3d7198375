"""Connectivity scaffolds for S²-Net: grid neighbourhoods and arbitrary adjacencies.

A scaffold says which neuron may act on which (``[N, N]``, ``[pre, post]``,
no self-loops). On a grid, couplings are shared across positions and depend
only on the offset ``post - pre`` (a convolution written as a matrix), so a
model trained on one image size reads the same way on another.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def grid_offsets(radius: int) -> list[tuple[int, int]]:
    """The ``(drow, dcol)`` offsets of a ``(2r+1)^2`` neighbourhood without the centre."""
    if radius < 1:
        raise ValueError(f"radius={radius} must be >= 1")
    return [(dr, dc) for dr in range(-radius, radius + 1) for dc in range(-radius, radius + 1)
            if (dr, dc) != (0, 0)]


def grid_offset_index(height: int, width: int, radius: int) -> np.ndarray:
    """``[N, N]`` int array: the offset id of ``post - pre`` or ``-1`` outside the
    neighbourhood, for ``N = height * width`` neurons in row-major order."""
    offsets = {o: k for k, o in enumerate(grid_offsets(radius))}
    rows, cols = np.divmod(np.arange(height * width), width)
    dr = rows[None, :] - rows[:, None]
    dc = cols[None, :] - cols[:, None]
    idx = np.full((height * width, height * width), -1, np.int32)
    for (orow, ocol), k in offsets.items():
        idx[(dr == orow) & (dc == ocol)] = k
    return idx


def grid_adjacency(height: int, width: int, radius: int) -> np.ndarray:
    """``[N, N]`` 0/1 float32: neurons within Chebyshev distance ``radius``, no self-loops."""
    return (grid_offset_index(height, width, radius) >= 0).astype(np.float32)


def offsets_to_matrix(kernel: jnp.ndarray, index: np.ndarray) -> jnp.ndarray:
    """Expands per-offset weights ``[n_offsets]`` into an ``[N, N]`` matrix via ``index``."""
    safe = np.maximum(index, 0)
    return jnp.where(index >= 0, kernel[safe], 0.0)


def ring_adjacency(n: int, k: int) -> np.ndarray:
    """``[n, n]`` 0/1 float32: each neuron linked to its ``k`` nearest neighbours on
    each side of a ring (a Watts-Strogatz lattice before rewiring)."""
    if not 1 <= k < n / 2:
        raise ValueError(f"k={k} must lie in [1, n/2) for n={n}")
    d = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    d = np.minimum(d, n - d)
    return ((d >= 1) & (d <= k)).astype(np.float32)


def random_adjacency(n: int, p: float, seed: int = 0) -> np.ndarray:
    """``[n, n]`` 0/1 float32 Erdős–Rényi directed graph with edge probability ``p``."""
    rng = np.random.default_rng(seed)
    adj = (rng.random((n, n)) < p).astype(np.float32)
    np.fill_diagonal(adj, 0.0)
    return adj


def check_adjacency(adjacency, n: int, name: str = "adjacency") -> np.ndarray:
    """Returns ``adjacency`` as a float32 ``[n, n]`` array or raises ``ValueError``
    naming the field, the shape given and the shape expected."""
    arr = np.asarray(adjacency, np.float32)
    if arr.shape != (n, n):
        raise ValueError(f"{name} has shape {arr.shape}; expected ({n}, {n}) "
                         f"for n_neurons={n} ([pre, post] square matrix)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries; expected a finite 0/1 or weighted matrix")
    return arr
