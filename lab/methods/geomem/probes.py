"""Probes of the learnt solution: superposed embeddings, relation-gated MLP units.

The geometric-memorization abstract predicts that gradient
descent finds subject embeddings that are *linear superpositions* of their
attribute vectors and an MLP that *gates by relation*. Two measurements:

* :func:`superposition_r2`: regress subject embeddings ``e_s`` on the
  concatenated attribute vectors ``[u_{pi_1(s)}, ..., u_{pi_C(s)}]`` (the
  unembedding rows, i.e. the codes the model decodes with) plus an intercept,
  fit on half of the subjects and score R^2 on the other half. A one-hot
  regression (``[N, C*N]`` indicators) would fit ``N`` rows exactly and say
  nothing, hence the attribute vectors as regressors and the held-out half.
* :func:`gating_selectivity`: per MLP unit, its mean activation under each
  relation; selectivity ``(max - mean of others) / (max + mean of others)``
  (1 = fires for one relation only), averaged with weights = activation mass.
"""

from __future__ import annotations

import numpy as np


def superposition_features(attribute_vectors, maps) -> np.ndarray:
    """``[N, C*d_a + 1]``: each subject's attribute vectors (one per relation/chain), then 1."""
    u = np.asarray(attribute_vectors, np.float64)
    maps = np.asarray(maps)
    feats = [u[maps[c]] for c in range(maps.shape[0])]
    return np.concatenate(feats + [np.ones((maps.shape[1], 1))], axis=1)


def fit_superposition(embeddings, attribute_vectors, maps) -> np.ndarray:
    """Least-squares coefficients ``[C*d_a + 1, d]`` of ``e_s ~ sum_c W_c u_{maps[c,s]} + b``."""
    x = superposition_features(attribute_vectors, maps)
    coef, *_ = np.linalg.lstsq(x, np.asarray(embeddings, np.float64), rcond=None)
    return coef


def r2_score(y, pred) -> float:
    """Multi-output R^2: ``1 - SS_res / SS_tot`` (total about the column means of ``y``)."""
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    ss_tot = float(np.sum((y - y.mean(0)) ** 2))
    return 1.0 - float(np.sum((y - pred) ** 2)) / max(ss_tot, 1e-30)


def superposition_r2(embeddings, attribute_vectors, maps, *, seed: int = 0,
                     fit_fraction: float = 0.5) -> dict:
    """Held-out R^2 of the linear-superposition model of subject embeddings.

    Returns:
      ``{"r2_heldout", "r2_fit", "n_fit", "n_features"}``; a random embedding
      table scores ~0 held out, an exact superposition scores 1.
    """
    emb = np.asarray(embeddings, np.float64)
    n = emb.shape[0]
    if not 0 < fit_fraction < 1:
        raise ValueError(f"fit_fraction={fit_fraction!r}; expected in (0, 1)")
    x = superposition_features(attribute_vectors, maps)
    if x.shape[0] != n:
        raise ValueError(f"maps cover {x.shape[0]} subjects but embeddings has {n} rows")
    order = np.random.default_rng(seed).permutation(n)
    n_fit = int(round(fit_fraction * n))
    fit_idx, test_idx = order[:n_fit], order[n_fit:]
    coef, *_ = np.linalg.lstsq(x[fit_idx], emb[fit_idx], rcond=None)
    return {
        "r2_heldout": r2_score(emb[test_idx], x[test_idx] @ coef),
        "r2_fit": r2_score(emb[fit_idx], x[fit_idx] @ coef),
        "n_fit": n_fit,
        "n_features": int(x.shape[1]),
    }


def gating_selectivity(activations, relation, n_relations: int) -> dict:
    """How selectively MLP units fire by relation.

    Args:
      activations: ``[Q, H]`` ReLU activations over queries.
      relation: ``[Q]`` relation (or chain) index of each query.
      n_relations: number of distinct relations.

    Returns:
      ``{"selectivity"}`` (mass-weighted mean over units), ``"gated_fraction"``
      (share of activation mass in units with selectivity > 0.9) and
      ``"active_units"`` (units with any activation).
    """
    z = np.asarray(activations, np.float64)
    rel = np.asarray(relation)
    if n_relations < 2:
        raise ValueError(f"n_relations={n_relations}; selectivity needs at least 2 relations")
    means = np.stack([z[rel == r].mean(0) for r in range(n_relations)])  # [R, H]
    top = means.max(0)
    others = (means.sum(0) - top) / (n_relations - 1)
    mass = means.sum(0)
    active = mass > 1e-9
    if not active.any():
        return {"selectivity": 0.0, "gated_fraction": 0.0, "active_units": 0}
    sel = (top - others)[active] / (top + others)[active]
    w = mass[active] / mass[active].sum()
    return {
        "selectivity": float(np.sum(w * sel)),
        "gated_fraction": float(np.sum(w * (sel > 0.9))),
        "active_units": int(active.sum()),
    }
