"""The closed-form geometric construction: superposed subject embeddings, a gated MLP selector.

Following the construction in the geometric-memorization abstract:
attribute (entity) codes ``u_a`` are random unit vectors in ``R^m``; every
chain ``c`` of relations gets a random orthogonal binding ``B_c``; a subject's
embedding is the linear superposition ``e_s = sum_c B_c u_{pi_c(s)}``. The
one-layer transformer reads it out: attention with zero queries/keys averages
the tokens (so the last position holds ``e_s`` plus the relation indicators),
and the MLP is a relation-conditioned selector: for chain ``c`` it has ``2m``
ReLU units ``relu(+-(A_c e)_i + M (g_c - L))`` with ``A_c = B_c^T - I`` and
``g_c = L`` exactly when the query asks chain ``c`` (``< L`` otherwise), so
only the asked chain's units open and the residual becomes ``B_c^T e_s =
u_{pi_c(s)} + crosstalk``; the unembedding decodes by the nearest code.
The crosstalk of the other ``C - 1`` terms has variance ``(C-1)/m`` per code
inner product, so ``m ~ 2 (C-1) ln N`` suffices: a logarithmic dimension.
Without chain-of-thought an ``L``-hop query needs ``C = R**L`` superposed
terms; with chain-of-thought the one-hop construction (``C = R``) is applied
``L`` times (the capacity-depth trade-off).

The construction is closed-form linear algebra evaluated once per (N, m) of a
dimension search; it runs in NumPy because compiling one XLA program per shape
would cost more than the arithmetic. :func:`to_model` turns it into the
weights of the JAX :class:`OneLayer`, whose forward gives the same answers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.methods.geomem import data
from lab.methods.geomem.model import OneLayer


class Construction(NamedTuple):
    """codes ``[N, m]`` unit attribute vectors; bindings ``[C, m, m]`` orthogonal;
    embeddings ``[N, m]`` superposed subject embeddings; chains ``[C, L]``."""

    codes: np.ndarray
    bindings: np.ndarray
    embeddings: np.ndarray
    chains: np.ndarray


def unit_codes(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """``[n, m]`` i.i.d. Gaussian vectors normalised to unit length (float32)."""
    g = rng.standard_normal((n, m), dtype=np.float32)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def random_orthogonal(rng: np.random.Generator, count: int, m: int) -> np.ndarray:
    """``[count, m, m]`` Haar-random orthogonal matrices (QR with sign fix)."""
    q, r = np.linalg.qr(rng.standard_normal((count, m, m)))
    return (q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]).astype(np.float32)


def superpose(codes, bindings, maps) -> np.ndarray:
    """``e_s = sum_c B_c u_{maps[c, s]}``: ``[N, m]`` (``maps [C, N]`` composite bijections)."""
    codes, maps = np.asarray(codes), np.asarray(maps)
    return sum(codes[maps[c]] @ bindings[c].T for c in range(maps.shape[0]))


def construct(seed: int, perms, m: int, hops: int = 1) -> Construction:
    """Builds the closed-form construction for ``hops``-hop queries in subject dimension ``m``.

    ``seed`` draws the codes and bindings; ``perms [R, N]`` are the bijections.
    """
    perms = np.asarray(perms)
    r, n = perms.shape
    data.check_sizes(n, r, hops)
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m={m!r}; expected a positive int subject dimension")
    chain_list = data.chains(r, hops)
    rng = np.random.default_rng([int(seed), int(m), int(hops)])
    codes = unit_codes(rng, n, int(m))
    bindings = random_orthogonal(rng, len(chain_list), int(m))
    emb = superpose(codes, bindings, data.compose(perms, chain_list))
    return Construction(codes, bindings, emb, chain_list)


def decode(cons: Construction, chunk: int = 2048) -> np.ndarray:
    """Predictions ``[C, N]``: ``argmax_a <u_a, B_c^T e_s>`` (what the built model outputs)."""
    n = cons.embeddings.shape[0]
    out = np.empty((len(cons.chains), n), np.int64)
    for c in range(len(cons.chains)):
        read = cons.embeddings @ cons.bindings[c]  # rows B_c^T e_s
        for i in range(0, n, chunk):
            out[c, i:i + chunk] = np.argmax(read[i:i + chunk] @ cons.codes.T, axis=-1)
    return out


def accuracy(seed: int, perms, m: int, hops: int = 1) -> float:
    """Accuracy over every ``hops``-hop query of the construction without chain-of-thought."""
    cons = construct(seed, perms, m, hops)
    answers = data.compose(perms, cons.chains)
    return float(np.mean(decode(cons) == answers))


def cot_accuracy(seed: int, perms, m: int, hops: int) -> float:
    """Accuracy of ``hops``-hop chains answered by chaining the one-hop construction.

    Each hop's predicted entity is fed back as the next subject (chain-of-thought:
    the intermediate answers are emitted), so errors compound along the chain. The
    chaining is the closed-form decode applied hop by hop, outside a network; the trained
    transformer that reads its own emission is :func:`lab.methods.geomem.sweeps.multihop`.
    """
    pred = decode(construct(seed, perms, m, 1))  # [R, N]
    chain_list = data.chains(np.asarray(perms).shape[0], hops)
    return float(np.mean(data.compose(pred, chain_list) == data.compose(perms, chain_list)))


def to_model(cons: Construction, hops: int, margin: float = 1.0) -> OneLayer:
    """The construction as the weights of a :class:`OneLayer` (``d = m + hops*R``).

    Attention: ``wq = wk = 0`` (uniform over the ``hops+1`` tokens), ``wv = (hops+1) I``,
    ``wo = I``; so ``h = e_s + indicators`` with the last hop's indicator doubled.
    MLP gate weights are 1 for earlier hops and 1/2 for the last, so ``g_c = L``
    iff the query asks chain ``c``; ``M = max|A_c e| + margin`` keeps other gates shut.
    """
    n, m = cons.embeddings.shape
    chain_list = np.asarray(cons.chains)
    n_chains, n_hops = chain_list.shape
    if n_hops != hops:
        raise ValueError(f"hops={hops} does not match the construction's chains of {n_hops}")
    r = int(round(n_chains ** (1.0 / hops)))
    d, hidden = m + hops * r, 2 * m * n_chains
    sel = np.einsum("cji->cij", cons.bindings) - np.eye(m, dtype=np.float32)  # A_c = B_c^T - I
    big = max(float(np.max(np.abs(cons.embeddings @ a.T))) for a in sel) + margin

    w1 = np.zeros((d, hidden), np.float32)
    w2 = np.zeros((hidden, d), np.float32)
    for c, chain in enumerate(chain_list):
        a_t = sel[c].T  # h_subj @ A_c^T = (A_c h)^T
        lo = 2 * m * c
        w1[:m, lo:lo + m], w1[:m, lo + m:lo + 2 * m] = a_t, -a_t
        for hop, rel in enumerate(chain):
            w1[m + hop * r + rel, lo:lo + 2 * m] = big * (0.5 if hop == hops - 1 else 1.0)
        w2[lo:lo + m, :m], w2[lo + m:lo + 2 * m, :m] = np.eye(m), -np.eye(m)
    model = OneLayer(n, hops * r, d, hidden, rngs=nnx.Rngs(0))
    subjects = np.zeros((n, d), np.float32)
    subjects[:, :m] = cons.embeddings
    relations = np.zeros((hops * r, d), np.float32)
    relations[:, m:] = np.eye(hops * r)
    unembed = np.zeros((n, d), np.float32)
    unembed[:, :m] = cons.codes
    weights = {"subjects": subjects, "relations": relations, "wq": np.zeros((d, d)),
               "wk": np.zeros((d, d)), "wv": (hops + 1) * np.eye(d), "wo": np.eye(d),
               "w1": w1, "b1": np.full((hidden,), -big * hops), "w2": w2, "unembed": unembed}
    for name, value in weights.items():
        getattr(model, name)[...] = jnp.asarray(value, jnp.float32)
    return model
