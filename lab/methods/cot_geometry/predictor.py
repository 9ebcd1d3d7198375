"""A correctness predictor on trajectory features, and the exact AUC it is scored by.

- :func:`fit_logistic` / :func:`predict_logistic`: L2-regularised logistic regression in
  JAX, trained full-batch with optax's Adam on standardised features (the training set's
  mean and standard deviation, kept with the weights).
- :func:`auc`: the area under the ROC curve computed exactly as the Mann-Whitney rank
  statistic, ``U / (n_pos n_neg)`` with ``U`` the number of (positive, negative) pairs
  whose scores are ordered correctly and ties counted 1/2 (Mann & Whitney 1947; Hanley &
  McNeil 1982, "The meaning and use of the area under a ROC curve", which also gives
  :func:`auc_se`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class Logistic(NamedTuple):
    """A fitted predictor: ``p = sigmoid(((x - mean) / scale) @ w + b)``."""

    w: np.ndarray
    b: float
    mean: np.ndarray
    scale: np.ndarray


def _check_xy(x, y=None):
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"features have shape {x.shape}; expected [N, F] with N >= 1")
    if not np.all(np.isfinite(x)):
        raise ValueError("features contain NaN or inf; drop or fill those rows first")
    if y is None:
        return x, None
    y = np.asarray(y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels have shape {y.shape}; expected [{x.shape[0]}]")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0/1 (or booleans)")
    return x, y.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("steps",))
def _fit(x, y, weights, l2, lr, steps):
    tx = optax.adam(lr)
    params = (jnp.zeros(x.shape[1]), jnp.zeros(()))
    weights = weights / weights.sum()

    def loss(p):
        logits = x @ p[0] + p[1]
        nll = optax.sigmoid_binary_cross_entropy(logits, y)
        return jnp.sum(weights * nll) + l2 * jnp.sum(p[0] ** 2)

    def step(carry, _):
        p, s = carry
        value, g = jax.value_and_grad(loss)(p)
        upd, s = tx.update(g, s, p)
        return (optax.apply_updates(p, upd), s), value

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
    return params, losses


def fit_logistic(x, y, *, weights=None, l2: float = 1e-2, learning_rate: float = 0.05,
                 steps: int = 400) -> Logistic:
    """Fits ``P(y = 1 | x)`` by logistic regression (mean log-loss + ``l2 * ||w||^2``) on
    standardised features; ``steps`` full-batch Adam updates. Constant features get
    scale 1 (they then carry no weight).

    ``weights [N]`` (>= 0; default all 1) weigh each row's loss and the standardisation:
    0/1 weights fit on a subset, and fits on subsets of one array share one compiled
    program. Returns a :class:`Logistic`."""
    x, y = _check_xy(x, y)
    if l2 < 0 or steps < 1:
        raise ValueError(f"l2={l2!r}, steps={steps!r}; expected l2 >= 0 and steps >= 1")
    w8 = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
    if w8.shape != y.shape or np.any(w8 < 0) or w8.sum() <= 0:
        raise ValueError(f"weights have shape {w8.shape} (sum {w8.sum():.3g}); expected "
                         f"[{len(y)}] non-negative weights with a positive sum")
    mean = (w8[:, None] * x).sum(0) / w8.sum()
    scale = np.sqrt((w8[:, None] * (x - mean) ** 2).sum(0) / w8.sum())
    scale = np.where(scale > 1e-12, scale, 1.0)
    z = jnp.asarray((x - mean) / scale, jnp.float32)
    (w, b), _ = _fit(z, jnp.asarray(y), jnp.asarray(w8, jnp.float32), jnp.float32(l2),
                     jnp.float32(learning_rate), steps)
    return Logistic(np.asarray(w, np.float64), float(b), mean, scale)


def predict_logistic(model: Logistic, x) -> np.ndarray:
    """``P(y = 1 | x)`` ``[N]`` under a fitted :class:`Logistic`."""
    x, _ = _check_xy(x)
    if x.shape[1] != model.w.shape[0]:
        raise ValueError(f"features have {x.shape[1]} columns; the predictor was fitted on "
                         f"{model.w.shape[0]}")
    z = (x - model.mean) / model.scale
    return 1.0 / (1.0 + np.exp(-(z @ model.w + model.b)))


def midranks(values) -> np.ndarray:
    """1-based ranks of ``values`` with ties given the mean of the ranks they span."""
    v = np.asarray(values, np.float64)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v), np.float64)
    sorted_v = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def auc(scores, labels) -> float:
    """Exact ROC AUC of ``scores`` for ``labels`` (1 = positive): the Mann-Whitney
    ``U / (n_pos n_neg)`` from midranks, i.e. the share of (positive, negative) pairs with
    the positive scored higher, ties counting 1/2. NaN when a class is empty; ValueError for
    mismatched shapes, non-finite scores or labels other than 0/1."""
    s = np.asarray(scores, np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1)
    if s.shape != y.shape:
        raise ValueError(f"scores {s.shape} and labels {y.shape} differ in length")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0/1 (or booleans)")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or inf")
    y = y.astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = midranks(s)
    u = r[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def auc_se(a: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil's (1982, eq. 2) standard error of an AUC ``a`` from ``n_pos``
    positives and ``n_neg`` negatives (NaN when either is 0 or ``a`` is NaN)."""
    if not n_pos or not n_neg or not np.isfinite(a):
        return float("nan")
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (
        n_pos * n_neg)
    return float(np.sqrt(max(var, 0.0)))


def auc_entry(scores, labels) -> dict:
    """``{"auc", "se", "n_pos", "n_neg"}`` of ``scores`` for ``labels``."""
    y = np.asarray(labels).astype(bool).reshape(-1)
    a = auc(scores, y)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    return {"auc": a, "se": auc_se(a, n_pos, n_neg), "n_pos": n_pos, "n_neg": n_neg}
