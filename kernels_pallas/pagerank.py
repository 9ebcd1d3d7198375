"""Personalized PageRank by power iteration: a Pallas kernel, its jnp reference, a dispatcher.

Solves ``pi = (1 - alpha) v + alpha pi P`` for a row-stochastic ``P [..., n, n]``
(row ``i`` = transition probabilities out of node ``i``) and a restart
distribution ``v [..., n]``, batched over the leading axes (e.g. heads). This
is the convention of ``networkx.pagerank(G, alpha, personalization=v)``
(Page et al., 1999; networkx's ``_pagerank_scipy``): with ``P`` the
row-normalised adjacency, networkx's scores are the fixed point above.
Iteration starts from ``pi = v``; the fixed point does not depend on it.

``tol``: when given, each batch element stops as soon as the L1 change of one
step, ``sum |pi_k+1 - pi_k|``, falls below ``tol`` (at most ``iters`` steps).
networkx stops when that L1 change is below ``N * tol``, so networkx's
``tol=t`` corresponds to ``tol=n * t`` here.

The kernel (:func:`pagerank_kernel`) runs one Pallas program per batch element
(grid over the flattened leading axes) and keeps the iterate in its output
buffer: each step is a blocked vector-matrix product, for every column block
``c`` it sums ``pi[r] * P[r, c]`` over row blocks ``r`` (tiles of
``block x block`` read from ``P``), writes the new block to a second buffer,
and copies it back once the step is complete (the old iterate must stay
readable until every column block is done). ``n`` is padded to a block
multiple with zero rows/columns, which receive and send no mass. The early
stop on ``tol`` runs inside the kernel as a ``while_loop`` per batch element,
with the same rule as the reference.

Matrix-free over attention (:func:`attention_pagerank`, its jnp reference and
Pallas kernel): when ``P`` is PRKV's attention graph (row ``i`` the causal
softmax attention of query ``i``, averaged over a KV group's query heads,
padding rows dangling to ``v``), the solve takes one layer's queries and keys
instead of ``P``. A first blocked pass stores each query row's softmax max and
normaliser (its log-sum-exp, O(T) per head); every power step then recomputes
``P`` tile by tile (``[block, T]`` rows in the reference, ``block x block``
tiles in the kernel) and contracts it with ``pi`` at once, so no ``[T, T]``
array exists: O(T) memory per head for O(iters T^2 hd) work, where the
materialised path holds ``4 H T^2`` bytes of attention plus its graphs. On a
prefill cache (positions increasing with the slot) the chain is triangular and
:func:`attention_pagerank_exact` solves its fixed point exactly by blocked
back-substitution over the same tiles, in one pass.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import platform, select

STOCHASTIC_ATOL = 1e-3


def _is_traced(*xs) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


@jax.jit
def _stats(P, v):
    """Scalars the value checks need, computed where the arrays live (no host copy of P)."""
    sums = P.astype(jnp.float32).sum(-1)
    worst = jnp.argmax(jnp.abs(sums - 1).reshape(-1))
    vs = v.astype(jnp.float32).sum(-1)
    return P.min(), worst, sums.reshape(-1)[worst], v.min(), vs.min(), vs.max()


def _check(P, v, alpha, iters, tol, normalize):
    """Validates the inputs; returns them as arrays and the broadcast batch shape."""
    P, v = jnp.asarray(P), jnp.asarray(v)
    if P.ndim < 2 or P.shape[-1] != P.shape[-2]:
        raise ValueError(f"P has shape {P.shape}; expected [..., n, n]")
    n = P.shape[-1]
    if v.ndim < 1 or v.shape[-1] != n:
        raise ValueError(f"v has shape {v.shape}; expected [..., n] with n={n}")
    try:
        batch = np.broadcast_shapes(P.shape[:-2], v.shape[:-1])
    except ValueError:
        raise ValueError(f"leading axes of P {P.shape[:-2]} and v {v.shape[:-1]} do not "
                         "broadcast") from None
    if not 0.0 <= float(alpha) < 1.0:
        raise ValueError(f"alpha={alpha!r}; expected 0 <= alpha < 1")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters={iters!r}; expected a positive int")
    if tol is not None and not float(tol) > 0:
        raise ValueError(f"tol={tol!r}; expected None or a positive float")
    if not _is_traced(P, v):
        p_min, worst, worst_sum, v_min, v_lo, v_hi = jax.device_get(_stats(P, v))
        if v_min < 0 or max(abs(v_lo - 1), abs(v_hi - 1)) > STOCHASTIC_ATOL:
            raise ValueError(f"v is not a distribution: min {v_min:.3g}, sums in [{v_lo:.6g}, "
                             f"{v_hi:.6g}]; expected non-negative entries summing to 1 +- "
                             f"{STOCHASTIC_ATOL}")
        if p_min < 0:
            raise ValueError(f"P has negative entries (min {p_min:.3g}); expected a "
                             "row-stochastic matrix")
        if not normalize and abs(worst_sum - 1) > STOCHASTIC_ATOL:
            row = tuple(int(i) for i in np.unravel_index(int(worst), P.shape[:-1]))
            raise ValueError(f"P is not row-stochastic: row {row} sums to {worst_sum:.6g}; "
                             f"expected 1 +- {STOCHASTIC_ATOL} (or pass normalize=True)")
    return P, v, tuple(batch)


def _canonical(P, v, batch, normalize):
    """float32 ``P [N, n, n]`` and ``v [N, n]`` over the flattened batch (inside jit)."""
    n = P.shape[-1]
    P = jnp.broadcast_to(P.astype(jnp.float32), (*batch, n, n)).reshape(-1, n, n)
    v = jnp.broadcast_to(v.astype(jnp.float32), (*batch, n)).reshape(-1, n)
    if normalize:  # networkx: rows divided by their sums, dangling rows jump to v
        sums = P.sum(-1, keepdims=True)
        P = jnp.where(sums > 0, P / jnp.where(sums > 0, sums, 1.0), v[:, None, :])
    return P, v


@functools.partial(jax.jit, static_argnames=("alpha", "iters", "tol", "normalize", "batch"))
def _power_iteration(P, v, alpha, iters, tol, normalize, batch):
    P, v = _canonical(P, v, batch, normalize)

    def step(pi, p, u):
        return (1 - alpha) * u + alpha * jnp.einsum("i,ij->j", pi, p,
                                                    precision=lax.Precision.HIGHEST)

    def one(p, u):
        if tol is None:
            return lax.fori_loop(0, iters, lambda _, pi: step(pi, p, u), u)

        def body(c):
            it, pi, _ = c
            new = step(pi, p, u)
            return it + 1, new, jnp.sum(jnp.abs(new - pi))

        cond = lambda c: (c[0] < iters) & (c[2] >= tol)
        return lax.while_loop(cond, body, (0, u, jnp.array(jnp.inf, jnp.float32)))[1]

    return jax.vmap(one)(P, v).reshape(*batch, -1)


def pagerank_reference(P, v, *, alpha: float = 0.85, iters: int = 50, tol: float | None = None,
                       normalize: bool = False):
    """Personalized PageRank by power iteration in jnp (vmapped over the batch).

    Args:
      P: ``[..., n, n]`` row-stochastic transition matrices (non-negative, rows
        summing to 1 +- 1e-3, checked when concrete), or any non-negative
        weights with ``normalize=True`` (rows divided by their sums, all-zero
        rows replaced by ``v`` as networkx does for dangling nodes).
      v: ``[..., n]`` restart distributions; leading axes broadcast with P's.
      alpha: damping factor, the probability of following an edge.
      iters: number of steps (the maximum when ``tol`` is set).
      tol: stop a batch element once the L1 change of a step is below ``tol``.
      normalize: row-normalise P instead of requiring it to be stochastic.

    Returns:
      ``pi [..., n]`` float32, the fixed point of ``pi = (1 - alpha) v + alpha pi P``.
    """
    P, v, batch = _check(P, v, alpha, iters, tol, normalize)
    return _power_iteration(P, v, float(alpha), iters, None if tol is None else float(tol),
                            normalize, batch)


def _barrier(compiled_gpu: bool):
    """Orders one step's writes before the next step's reads across a Triton program's threads."""
    if compiled_gpu:
        from jax.experimental.pallas import triton as pltriton

        pltriton.debug_barrier()


def _kernel(p_ref, v_ref, pi_ref, new_ref, *, alpha, iters, tol, block, n_blocks, gpu):
    def init(c, carry):  # block by block: Triton loads power-of-two shapes, n_p may not be one
        cs = pl.ds(c * block, block)
        pi_ref[cs] = v_ref[cs]
        return carry

    lax.fori_loop(0, n_blocks, init, 0)
    _barrier(gpu)

    def one_step():
        delta = jnp.zeros((), jnp.float32)
        for_cols = lambda c, d: d + column_block(c)
        delta = lax.fori_loop(0, n_blocks, for_cols, delta)
        _barrier(gpu)
        lax.fori_loop(0, n_blocks, copy_back, 0)
        _barrier(gpu)
        return delta

    def column_block(c):
        cs = pl.ds(c * block, block)

        def rows(r, acc):
            rs = pl.ds(r * block, block)
            return acc + jnp.sum(pi_ref[rs][:, None] * p_ref[rs, cs], axis=0)

        acc = lax.fori_loop(0, n_blocks, rows, jnp.zeros((block,), jnp.float32))
        new = (1 - alpha) * v_ref[cs] + alpha * acc
        new_ref[cs] = new
        return jnp.sum(jnp.abs(new - pi_ref[cs]))

    def copy_back(c, carry):
        cs = pl.ds(c * block, block)
        pi_ref[cs] = new_ref[cs]
        return carry

    if tol is None:
        lax.fori_loop(0, iters, lambda _, carry: (one_step(), carry)[1], 0)
    else:
        cond = lambda c: (c[0] < iters) & (c[1] >= tol)
        lax.while_loop(cond, lambda c: (c[0] + 1, one_step()),
                       (jnp.int32(0), jnp.array(jnp.inf, jnp.float32)))


def pagerank_kernel(P, v, *, alpha: float = 0.85, iters: int = 50, tol: float | None = None,
                    normalize: bool = False, block: int = 64, interpret: bool = False):
    """Personalized PageRank as a Pallas kernel; same arguments and result as the reference.

    ``block`` (a power of two) is the tile side: each step reads ``P`` in
    ``block x block`` tiles; ``n`` is padded to a multiple of it (clipped to
    ``max(16, next_pow2(n))``). One program per batch element (module docstring).
    """
    if not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ValueError(f"block={block!r}; expected a positive power of two")
    P, v, batch = _check(P, v, alpha, iters, tol, normalize)
    return _pagerank_call(P, v, float(alpha), iters, None if tol is None else float(tol),
                          normalize, batch, block, interpret)


@functools.partial(jax.jit, static_argnames=("alpha", "iters", "tol", "normalize", "batch",
                                             "block", "interpret"))
def _pagerank_call(P, v, alpha, iters, tol, normalize, batch, block, interpret):
    P, v = _canonical(P, v, batch, normalize)
    nb, n, _ = P.shape
    block = min(block, max(16, 1 << (n - 1).bit_length()))
    n_p = pl.cdiv(n, block) * block
    P = jnp.pad(P, ((0, 0), (0, n_p - n), (0, n_p - n)))
    v = jnp.pad(v, ((0, 0), (0, n_p - n)))
    gpu = not interpret and platform() == "gpu"
    params = None
    if gpu:
        from jax.experimental.pallas import triton as pltriton

        params = pltriton.CompilerParams(num_warps=4, num_stages=2)
    vec = pl.BlockSpec((None, n_p), lambda i: (i, 0))
    pi, _ = pl.pallas_call(
        functools.partial(_kernel, alpha=alpha, iters=iters, tol=tol, block=block,
                          n_blocks=n_p // block, gpu=gpu),
        grid=(nb,),
        in_specs=[pl.BlockSpec((None, n_p, n_p), lambda i: (i, 0, 0)), vec],
        out_specs=[vec, vec],
        out_shape=[jax.ShapeDtypeStruct((nb, n_p), jnp.float32)] * 2,
        compiler_params=params, interpret=interpret, name="lab_pagerank",
    )(P, v)
    return pi[:, :n].reshape(*batch, n)


def personalized_pagerank(P, v, *, alpha: float = 0.85, iters: int = 50,
                          tol: float | None = None, normalize: bool = False,
                          impl: str | None = None):
    """Dispatching entry point (PRKV's scorer): the Pallas kernel or the jnp reference.

    ``impl``: ``"pallas"``, ``"xla"`` or ``None`` (compiled Pallas on GPU/TPU,
    the reference on CPU; ``LAB_KERNELS`` overrides ``None``). Arguments and
    result as :func:`pagerank_reference`: ``pi [..., n]``, the fixed point of
    ``pi = (1 - alpha) v + alpha pi P`` (networkx's convention).
    """
    fn, _ = select(pagerank_kernel, pagerank_reference, impl)
    return fn(P, v, alpha=alpha, iters=iters, tol=tol, normalize=normalize)


# --------------------------------------------------------------------------------------------
# Matrix-free PageRank over an attention graph.
#
# PRKV's chain is P = mean_{h in group} A_h with A_h = softmax(q_h k^T * scale) under the
# causal positional mask (row = query, column = key) and padding rows sent to the restart v.
# Storing A is O(T^2) per head; here every power step recomputes A tile by tile from the
# queries, the keys and the per-row log-sum-exp, so only O(T) per head lives across steps.
# --------------------------------------------------------------------------------------------

ATTENTION_GRAPHS = ("group", "head")
NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class _Walk:
    """Static options of one attention PageRank solve (hashable: jit's static argument)."""

    scale: float
    alpha: float
    iters: int
    tol: float | None
    graph: str
    block: int
    causal_slots: bool = False


def _row_groups(nb: int, causal_slots: bool) -> list[tuple[int, int]]:
    """Row-block ranges ``[(r0, r1)]`` whose tiles read keys ``[0, r1 * block)`` only: one
    range over every key without ``causal_slots``; else up to 8 near-equal ranges, so the
    masked upper triangle is mostly skipped ((1 + 2 + ... + 8) / 64 of the tiles at 8)."""
    n = min(nb, 8) if causal_slots else 1
    edges = [round(i * nb / n) for i in range(n + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _check_attention(q, k, v, positions, scale, alpha, iters, tol, graph, block,
                     causal_slots=False) -> _Walk:
    """Validates the inputs of :func:`attention_pagerank`; returns its static options."""
    if q.ndim != 4:
        raise ValueError(f"q has shape {q.shape}; expected [B, H, T, hd]")
    b, h, t, hd = q.shape
    if k.ndim != 4 or k.shape[0] != b or k.shape[2:] != (t, hd):
        raise ValueError(f"k has shape {k.shape}; expected [B={b}, Hkv, T={t}, hd={hd}] "
                         f"matching q {q.shape}")
    hkv = k.shape[1]
    if hkv < 1 or h % hkv:
        raise ValueError(f"q has H={h} heads and k has Hkv={hkv}; expected H a multiple of Hkv")
    if positions.shape != (b, t) or not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions has shape {positions.shape} and dtype {positions.dtype}; "
                         f"expected integer [B={b}, T={t}] (-1 = padding)")
    if v.shape != (b, t):
        raise ValueError(f"v has shape {v.shape}; expected [B={b}, T={t}]")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha={alpha!r}; expected 0 < alpha < 1")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters={iters!r}; expected a positive int")
    if tol is not None and not float(tol) > 0:
        raise ValueError(f"tol={tol!r}; expected None or a positive float")
    if graph not in ATTENTION_GRAPHS:
        raise ValueError(f"graph={graph!r}; expected one of {ATTENTION_GRAPHS}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ValueError(f"block={block!r}; expected a positive power of two")
    scale = hd ** -0.5 if scale is None else float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale={scale!r}; expected None (hd ** -0.5) or a positive float")
    if not _is_traced(v):
        vs = np.asarray(jax.device_get(v), np.float64)
        lo, hi = vs.sum(-1).min(), vs.sum(-1).max()
        if vs.min() < 0 or max(abs(lo - 1), abs(hi - 1)) > STOCHASTIC_ATOL:
            raise ValueError(f"v is not a distribution: min {vs.min():.3g}, sums in [{lo:.6g}, "
                             f"{hi:.6g}]; expected non-negative rows summing to 1 +- "
                             f"{STOCHASTIC_ATOL}")
    if not isinstance(causal_slots, bool):
        raise ValueError(f"causal_slots={causal_slots!r}; expected a bool")
    if causal_slots and not _is_traced(positions):
        p = np.asarray(jax.device_get(positions))
        later = np.where(p >= 0, p, np.iinfo(np.int32).max)
        if np.any(np.minimum.accumulate(later[:, ::-1], axis=1)[:, ::-1][:, 1:] <= p[:, :-1]):
            raise ValueError("causal_slots=True but some valid slot's position is not above "
                             "every earlier one's; expected positions strictly increasing "
                             "over the valid slots of each row (a prefill cache: slot = "
                             "position)")
    return _Walk(scale, float(alpha), iters, None if tol is None else float(tol), graph, block,
                 causal_slots)


def _graph_heads(q, k, graph):
    """``(q [B, Hg, G, T, hd], k [B, Hg, T, hd])`` float32: the query heads of each graph.

    ``group``: one graph per KV head over its ``G = H / Hkv`` query heads (the
    order of ``lab.nn``'s GQA: query head ``h`` reads KV head ``h // G``);
    ``head``: one graph per query head (``G = 1``, its KV head's keys repeated).
    """
    b, h, t, hd = q.shape
    hkv = k.shape[1]
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    if graph == "group":
        return q.reshape(b, hkv, h // hkv, t, hd), k
    return q[:, :, None], jnp.repeat(k, h // hkv, axis=1)


def _pad_tokens(q, k, positions, v, t_p):
    """Pads the token axis to ``t_p``: zero queries/keys at position -1 (never attended,
    dangling with no mass) and zero restart."""
    t = positions.shape[-1]
    pad = t_p - t
    q = jnp.pad(q, ((0, 0),) * 3 + ((0, pad), (0, 0)))
    k = jnp.pad(k, ((0, 0),) * 2 + ((0, pad), (0, 0)))
    positions = jnp.pad(positions.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
    v = jnp.pad(v.astype(jnp.float32), ((0, 0), (0, pad)))
    return q, k, positions, v


def _finish(pi, t, h, hkv, graph):
    """``[B, Hg, T_p] -> [B, Hkv, T]``: the padding cut, ``head`` scores averaged per group."""
    pi = pi[..., :t]
    if graph == "head":
        b = pi.shape[0]
        pi = pi.reshape(b, hkv, h // hkv, t).mean(2)
    return pi


class _Tiles:
    """One graph's query blocks (jnp): ``q [G, T_p, hd]``, ``k [T_p, hd]``, ``pos [T_p]``.

    Query rows are taken ``block`` at a time; each block's tile is ``[G, block, T_p]``, or,
    with ``walk.causal_slots``, ``[G, block, end]`` over the keys of its row group
    (:func:`_row_groups`): keys in later slots than every query of the group are skipped.
    """

    def __init__(self, q, k, pos, walk: _Walk):
        g, t_p, hd = q.shape
        self.t_p, self.walk, self.k, self.pos = t_p, walk, k, pos
        self.nb, self.bq = t_p // walk.block, walk.block
        self.qb = q.reshape(g, self.nb, self.bq, hd).transpose(1, 0, 2, 3)  # [nb, G, bq, hd]
        self.posb = pos.reshape(self.nb, self.bq)
        self.groups = _row_groups(self.nb, walk.causal_slots)
        self.m = self.den = None

    def logits(self, q_i, pos_i, end):
        """Masked logits ``[G, bq, end]`` of one query block over keys ``[0, end)`` and its
        allowed pairs."""
        s = jnp.einsum("gqd,kd->gqk", q_i, self.k[:end],
                       precision=lax.Precision.HIGHEST) * self.walk.scale
        ok = (self.pos[None, :end] >= 0) & (self.pos[None, :end] <= pos_i[:, None])
        return jnp.where(ok[None], s, NEG_INF), ok

    def store_stats(self):
        """A first pass storing each row's softmax max ``m`` and normaliser ``den``
        (``[nb, G, bq]``; 0 and 1 for dangling rows), for :meth:`rows` over part of a row."""
        def norm_block(xs, end):
            s, _ = self.logits(*xs, end)
            m = jnp.max(s, axis=-1)
            den = jnp.sum(jnp.exp(s - m[..., None]), axis=-1)
            valid = xs[1] >= 0                                    # dangling rows: unused
            return jnp.where(valid, m, 0.0), jnp.where(valid, den, 1.0)

        parts = [lax.map(functools.partial(norm_block, end=r1 * self.bq),
                         (self.qb[r0:r1], self.posb[r0:r1])) for r0, r1 in self.groups]
        self.m = jnp.concatenate([a for a, _ in parts])
        self.den = jnp.concatenate([d for _, d in parts])

    def rows(self, r, end):
        """``P[rows of block r, :end]``, ``[bq, end]``: the attention of block ``r``'s queries
        averaged over the graph's heads (zero rows for dangling queries). Normalised with the
        stored statistics, or, before :meth:`store_stats`, over the tile itself, which holds
        every key a row attends when ``end`` is past the block (``causal_slots``)."""
        s, ok = self.logits(self.qb[r], self.posb[r], end)
        if self.m is None:
            m = jnp.max(s, axis=-1, keepdims=True)
            e = jnp.where(ok[None], jnp.exp(s - m), 0.0)
            a = e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), jnp.finfo(jnp.float32).tiny)
        else:
            a = jnp.exp(s - self.m[r][..., None]) / self.den[r][..., None]
        return jnp.where(ok[None], a, 0.0).mean(0)


def _walk_one(q, k, pos, u, walk: _Walk):
    """One graph's power iteration (jnp): ``q [G, T_p, hd]``, ``k [T_p, hd]``, ``pos [T_p]``,
    ``u [T_p]`` -> pi (the tiles of :class:`_Tiles`)."""
    tiles = _Tiles(q, k, pos, walk)
    tiles.store_stats()
    nb, bq = tiles.nb, tiles.bq
    t_p = tiles.t_p
    dangling = pos < 0

    def step(pi):
        def row_block(acc, xs, end):
            r, pi_i = xs
            return acc.at[:end].add(jnp.einsum("q,qk->k", pi_i, tiles.rows(r, end),
                                               precision=lax.Precision.HIGHEST)), None

        acc, pib = jnp.zeros((t_p,), jnp.float32), pi.reshape(nb, bq)
        for r0, r1 in tiles.groups:
            acc, _ = lax.scan(functools.partial(row_block, end=r1 * bq), acc,
                              (jnp.arange(r0, r1), pib[r0:r1]))
        lost = jnp.sum(jnp.where(dangling, pi, 0.0))              # dangling rows jump to u
        return (1 - walk.alpha) * u + walk.alpha * (acc + lost * u)

    if walk.tol is None:
        return lax.fori_loop(0, walk.iters, lambda _, pi: step(pi), u)

    def body(c):
        it, pi, _ = c
        new = step(pi)
        return it + 1, new, jnp.sum(jnp.abs(new - pi))

    cond = lambda c: (c[0] < walk.iters) & (c[2] >= walk.tol)
    return lax.while_loop(cond, body, (0, u, jnp.array(jnp.inf, jnp.float32)))[1]


def _solve_one(q, k, pos, u, walk: _Walk):
    """One graph's exact fixed point by blocked back-substitution (jnp; ``causal_slots``).

    With keys only in earlier or the same slots, ``P`` is lower triangular, so
    ``pi (I - alpha P0) = c u`` (``P0``: the dangling rows zeroed; ``c`` a scalar) is
    solved from the last query block to the first: block ``r``'s ``pi_r`` solves
    ``pi_r (I - alpha P_rr) = (1 - alpha) u_r + alpha f_r`` (``P_rr`` the diagonal tile,
    ``f_r`` the inflow from the later blocks, already solved), then adds
    ``pi_r P[r, :r]`` to the earlier blocks' inflow. ``pi`` is rescaled to sum 1, which
    fixes ``c`` (the mass the dangling rows send back to ``u``).
    """
    tiles = _Tiles(q, k, pos, walk)
    bq, t_p, alpha = tiles.bq, tiles.t_p, walk.alpha
    ub = u.reshape(tiles.nb, bq)
    eye = jnp.eye(bq, dtype=jnp.float32)
    slots = jnp.arange(t_p)

    def block(j, carry, r1, end):
        inflow, pi = carry
        r = r1 - 1 - j
        rows = tiles.rows(r, end)                                    # [bq, end]
        diag = lax.dynamic_slice_in_dim(rows, r * bq, bq, axis=1)     # lower triangular
        rhs = (1 - alpha) * ub[r] + alpha * lax.dynamic_slice_in_dim(inflow, r * bq, bq)
        x = jax.scipy.linalg.solve_triangular(eye - alpha * diag, rhs, lower=True, trans="T")
        flow = jnp.einsum("q,qk->k", x, rows, precision=lax.Precision.HIGHEST)
        flow = jnp.where(slots[:end] < r * bq, flow, 0.0)             # earlier blocks only
        return inflow.at[:end].add(flow), lax.dynamic_update_slice_in_dim(pi, x, r * bq, 0)

    carry = (jnp.zeros((t_p,), jnp.float32), jnp.zeros((t_p,), jnp.float32))
    for r0, r1 in reversed(tiles.groups):
        carry = lax.fori_loop(0, r1 - r0, functools.partial(block, r1=r1, end=r1 * bq), carry)
    pi = carry[1]
    return pi / jnp.sum(pi)


@functools.partial(jax.jit, static_argnames=("walk", "one"))
def _over_graphs(q, k, v, positions, walk: _Walk, one):
    """``one(q [G, T_p, hd], k [T_p, hd], pos, u, walk) -> pi`` (:func:`_walk_one` or
    :func:`_solve_one`) for every row and graph, on tokens padded to a block multiple;
    ``[B, Hkv, T]``."""
    b, h, t, _ = q.shape
    hkv = k.shape[1]
    qg, kg = _graph_heads(q, k, walk.graph)
    block = min(walk.block, 1 << (t - 1).bit_length())
    walk = dataclasses.replace(walk, block=block)
    qg, kg, pos, u = _pad_tokens(qg, kg, positions, v, pl.cdiv(t, block) * block)
    per_graph = jax.vmap(one, in_axes=(0, 0, None, None, None))
    pi = jax.vmap(per_graph, in_axes=(0, 0, 0, 0, None))(qg, kg, pos, u, walk)
    return _finish(pi, t, h, hkv, walk.graph)


def attention_pagerank_exact(q, k, v, *, positions, scale: float | None = None,
                             alpha: float = 0.85, graph: str = "group", block: int = 32):
    """The exact fixed point of :func:`attention_pagerank_reference`'s chain on a prefill
    cache, in one blocked pass instead of ``iters`` power steps.

    Causal attention only moves the walk to earlier (or the same) slots, so on a cache whose
    positions strictly increase over the valid slots (``causal_slots``, checked when
    concrete; a prefill cache, slot = position) ``P`` is lower triangular and
    ``pi = (1 - alpha) v + alpha pi P`` is a triangular linear system. It is solved by
    back-substitution over query blocks, last block first: each block's ``block x block``
    diagonal tile is a small triangular solve (``jax.scipy.linalg.solve_triangular``, its
    diagonal ``1 - alpha P[i, i] >= 1 - alpha``), and the block's ``[block, T]`` tile then
    sends its rows' mass to the earlier keys. The tiles are recomputed from ``q`` and ``k``,
    normalised over the tile itself (it holds every key its rows attend), so memory stays
    O(T) per head (plus one tile) and the work is that of about one power step. The result
    is the fixed point itself to float32 rounding (``tests/kernels``: within 1e-6 of a
    float64 solve), which ``iters`` power steps from ``v`` approach geometrically.

    Arguments and result as :func:`attention_pagerank_reference` (no ``iters`` or ``tol``);
    ``[B, Hkv, T]`` float32, each summing to 1.
    """
    q, k, v, positions = (jnp.asarray(x) for x in (q, k, v, positions))
    walk = _check_attention(q, k, v, positions, scale, alpha, 1, None, graph, block,
                            causal_slots=True)
    return _over_graphs(q, k, v, positions, walk, _solve_one)


def attention_pagerank_reference(q, k, v, *, positions, scale: float | None = None,
                                 alpha: float = 0.85, iters: int = 50, tol: float | None = None,
                                 graph: str = "group", block: int = 64,
                                 causal_slots: bool = False):
    """Personalized PageRank over one layer's causal attention graph, never forming ``[T, T]``.

    The chain is PRKV's (``lab.methods.prkv.transition_graph``): with
    ``A_h[i, j] = exp(q_h[i] . k[j] * scale - lse_h[i])`` for keys ``j`` that
    query ``i`` may attend (``0 <= positions[j] <= positions[i]``, the mask of
    ``lab.nn``'s attention; ``lse_h[i]`` the row's log-sum-exp, so each row is
    a softmax), ``graph="group"`` walks ``P = mean_{h in group} A_h`` (a mean of
    row-stochastic rows, so row-stochastic), and padding queries
    (``positions[i] = -1``, which attend nothing) are dangling rows that jump to
    ``v`` (networkx's rule). ``pi`` is the fixed point of
    ``pi = (1 - alpha) v + alpha pi P`` by power iteration from ``pi = v``, as
    :func:`pagerank_reference` computes it on the materialised ``P``.

    A first pass over query blocks stores each row's softmax max ``m`` and
    normaliser ``den`` (``lse = m + log den``, kept in two parts so that
    ``exp(s - m) / den`` rounds as the materialised softmax does). Each step's
    ``pi P = sum_i pi_i P[i, :]`` is then computed a query block at a time:
    the ``[block, T]`` logit tile of every head in the graph is recomputed from
    ``q`` and ``k``, normalised with the stored statistics and contracted with
    ``pi`` of those rows; dangling rows add ``(sum of their pi) * v``. Across
    steps only ``q``, ``k``, ``m, den [H, T]`` and ``pi`` live: O(T) memory per
    head for O(iters T^2 hd) work.

    Args:
      q: ``[B, H, T, hd]`` queries of every prompt token (after RoPE).
      k: ``[B, Hkv, T, hd]`` keys of the same tokens; ``H`` a multiple of ``Hkv``.
      v: ``[B, T]`` restart distributions (checked when concrete).
      positions: ``[B, T]`` int token positions, -1 = padding.
      scale: logit scale, ``hd ** -0.5`` by default (``lab.nn``'s).
      alpha: damping, ``0 < alpha < 1``; iters: steps (the maximum with ``tol``).
      tol: stop a graph once the L1 change of a step is below ``tol``.
      graph: ``"group"`` (one graph per KV head) or ``"head"`` (one PageRank per
        query head, then the mean of the scores over the group).
      block: query rows per tile (a power of two).
      causal_slots: the caller's promise that positions strictly increase over each row's
        valid slots (a prefill cache, slot = position; checked when concrete): every key in
        a later slot than a query is then masked for it, and the tiles of keys beyond a
        group of query blocks are skipped (about 0.56 of the work at 8 groups), with the
        same result.

    Returns:
      ``pi [B, Hkv, T]`` float32 (each sums to 1 when ``v`` does).
    """
    q, k, v, positions = (jnp.asarray(x) for x in (q, k, v, positions))
    walk = _check_attention(q, k, v, positions, scale, alpha, iters, tol, graph, block,
                            causal_slots)
    return _over_graphs(q, k, v, positions, walk, _walk_one)


def _norm_kernel(q_ref, k_ref, qpos_ref, kpos_ref, max_ref, den_ref, *, scale, block,
                 n_blocks, groups):
    """One query block of one graph: the softmax max and normaliser of each row and head
    (flash attention's online recurrence over ``block x block`` key tiles)."""
    qpos = qpos_ref[...]
    for g in range(groups):
        q = q_ref[g]

        def keys(c, carry, q=q):
            m, den = carry
            cs = pl.ds(c * block, block)
            kpos = kpos_ref[cs]
            ok = (kpos[None, :] >= 0) & (kpos[None, :] <= qpos[:, None])
            s = _logits_hi(q, k_ref[cs, :], scale)
            s = jnp.where(ok, s, NEG_INF)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
            return m_new, den * jnp.exp(m - m_new) + jnp.sum(p, axis=1)

        m, den = lax.fori_loop(0, n_blocks, keys, (jnp.full((block,), NEG_INF, jnp.float32),
                                                   jnp.zeros((block,), jnp.float32)))
        max_ref[g] = jnp.where(den > 0, m, 0.0)
        den_ref[g] = jnp.where(den > 0, den, 1.0)


def _flow_kernel(q_ref, k_ref, qpos_ref, kpos_ref, max_ref, den_ref, pi_ref, out_ref, *, scale,
                 block, n_blocks, groups):
    """One key block ``c`` of one graph: ``sum_i pi_i mean_g A_g[i, c]`` over every query
    block (dangling rows have all-zero ``A`` rows; their mass is added outside)."""
    k = k_ref[...]
    kpos = kpos_ref[...]

    def rows(r, acc):
        rs = pl.ds(r * block, block)
        qpos = qpos_ref[rs]
        ok = (kpos[None, :] >= 0) & (kpos[None, :] <= qpos[:, None])
        w = pi_ref[rs] / groups
        for g in range(groups):
            s = _logits_hi(q_ref[g, rs, :], k, scale)
            e = jnp.exp(s - max_ref[g, rs][:, None]) / den_ref[g, rs][:, None]
            acc = acc + jnp.sum(w[:, None] * jnp.where(ok, e, 0.0), axis=0)
        return acc

    out_ref[...] = lax.fori_loop(0, n_blocks, rows, jnp.zeros((block,), jnp.float32))


def _logits_hi(q, k, scale):
    """``q @ k.T * scale`` in full float32 (no TF32: the scores must match to 1e-6)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.float32)
    return s * scale


@functools.partial(jax.jit, static_argnames=("walk", "interpret"))
def _attention_call(q, k, v, positions, walk: _Walk, interpret: bool):
    b, h, t, hd = q.shape
    hkv = k.shape[1]
    qg, kg = _graph_heads(q, k, walk.graph)
    bs = min(walk.block, max(16, 1 << (t - 1).bit_length()))
    t_p = pl.cdiv(t, bs) * bs
    nb = t_p // bs
    qg, kg, pos, u = _pad_tokens(qg, kg, positions, v, t_p)
    hd_p = max(16, 1 << (hd - 1).bit_length())           # Triton tiles: power-of-two widths
    qg = jnp.pad(qg, ((0, 0),) * 4 + ((0, hd_p - hd),))
    kg = jnp.pad(kg, ((0, 0),) * 3 + ((0, hd_p - hd),))
    n_graphs, groups = qg.shape[1], qg.shape[2]
    params = None
    if not interpret and platform() == "gpu":
        from jax.experimental.pallas import triton as pltriton

        params = pltriton.CompilerParams(num_warps=4, num_stages=2)
    opts = dict(scale=walk.scale, block=bs, n_blocks=nb, groups=groups)
    q_all = pl.BlockSpec((None, None, groups, t_p, hd_p), lambda i, j, c: (i, j, 0, 0, 0))
    q_blk = pl.BlockSpec((None, None, groups, bs, hd_p), lambda i, j, c: (i, j, 0, c, 0))
    k_all = pl.BlockSpec((None, None, t_p, hd_p), lambda i, j, c: (i, j, 0, 0))
    k_blk = pl.BlockSpec((None, None, bs, hd_p), lambda i, j, c: (i, j, c, 0))
    pos_all = pl.BlockSpec((None, t_p), lambda i, j, c: (i, 0))
    pos_blk = pl.BlockSpec((None, bs), lambda i, j, c: (i, c))
    norm_all = pl.BlockSpec((None, None, groups, t_p), lambda i, j, c: (i, j, 0, 0))
    norm_blk = pl.BlockSpec((None, None, groups, bs), lambda i, j, c: (i, j, 0, c))
    grid = (b, n_graphs, nb)
    m, den = pl.pallas_call(
        functools.partial(_norm_kernel, **opts), grid=grid,
        in_specs=[q_blk, k_all, pos_blk, pos_all], out_specs=[norm_blk, norm_blk],
        out_shape=[jax.ShapeDtypeStruct((b, n_graphs, groups, t_p), jnp.float32)] * 2,
        compiler_params=params, interpret=interpret, name="lab_attention_softmax_stats",
    )(qg, kg, pos, pos)
    flow = pl.pallas_call(
        functools.partial(_flow_kernel, **opts), grid=grid,
        in_specs=[q_all, k_blk, pos_all, pos_blk, norm_all, norm_all,
                  pl.BlockSpec((None, None, t_p), lambda i, j, c: (i, j, 0))],
        out_specs=pl.BlockSpec((None, None, bs), lambda i, j, c: (i, j, c)),
        out_shape=jax.ShapeDtypeStruct((b, n_graphs, t_p), jnp.float32),
        compiler_params=params, interpret=interpret, name="lab_attention_pagerank_step",
    )
    u = jnp.broadcast_to(u[:, None], (b, n_graphs, t_p))
    dangling = (pos < 0)[:, None]

    def step(pi):
        lost = jnp.sum(jnp.where(dangling, pi, 0.0), axis=-1, keepdims=True)
        return (1 - walk.alpha) * u + walk.alpha * (flow(qg, kg, pos, pos, m, den, pi) + lost * u)

    if walk.tol is None:
        pi = lax.fori_loop(0, walk.iters, lambda _, x: step(x), u)
    else:  # each graph stops on its own, as the reference's vmapped while_loop
        def body(c):
            it, x, delta = c
            new = step(x)
            live = delta >= walk.tol
            change = jnp.sum(jnp.abs(new - x), axis=-1)
            return it + 1, jnp.where(live[..., None], new, x), jnp.where(live, change, delta)

        cond = lambda c: (c[0] < walk.iters) & jnp.any(c[2] >= walk.tol)
        init = (0, u, jnp.full((b, n_graphs), jnp.inf, jnp.float32))
        pi = lax.while_loop(cond, body, init)[1]
    return _finish(pi, t, h, hkv, walk.graph)


def attention_pagerank_kernel(q, k, v, *, positions, scale: float | None = None,
                              alpha: float = 0.85, iters: int = 50, tol: float | None = None,
                              graph: str = "group", block: int = 64, interpret: bool = False,
                              causal_slots: bool = False):
    """:func:`attention_pagerank_reference` with its two blocked passes as Pallas kernels.

    ``lab_attention_softmax_stats`` (grid ``B x graphs x query blocks``) writes
    each query row's softmax max and normaliser by an online softmax over
    ``block x block`` key tiles (flash attention's recurrence).
    ``lab_attention_pagerank_step`` (grid ``B x graphs x key blocks``, one launch
    per power step) gives each key block ``c`` its inflow
    ``sum_i pi_i mean_g A_g[i, c]``, recomputing the tiles
    ``exp(q[r] k[c]^T * scale - max[r]) / den[r]`` (masked) over every query
    block ``r``; the step's restart and dangling terms, and the per-graph
    ``tol`` stop, are jnp around it. Only ``block x block`` tiles exist; ``T``
    is padded to a block multiple (block clipped to ``max(16, next_pow2(T))``)
    and ``hd`` to a power of two. Graphs are ``B x Hkv`` (``group``) or
    ``B x H`` (``head``). ``causal_slots`` is checked as the reference's but the kernel
    still computes every tile (skipping masked ones is not implemented here).
    """
    q, k, v, positions = (jnp.asarray(x) for x in (q, k, v, positions))
    walk = _check_attention(q, k, v, positions, scale, alpha, iters, tol, graph, block,
                            causal_slots)
    return _attention_call(q, k, v, positions, walk, interpret)


def attention_pagerank(q, k, v, *, positions, scale: float | None = None, alpha: float = 0.85,
                       iters: int = 50, tol: float | None = None, graph: str = "group",
                       impl: str | None = None, causal_slots: bool = False):
    """Dispatching entry point: :func:`attention_pagerank_kernel` or its jnp reference.

    ``impl`` as :func:`personalized_pagerank` (compiled Pallas on GPU/TPU, the
    reference on CPU). Result: ``pi [B, Hkv, T]``, equal to
    ``lab.methods.prkv.prkv_scores`` on this layer's materialised attention.
    """
    fn, _ = select(attention_pagerank_kernel, attention_pagerank_reference, impl)
    return fn(q, k, v, positions=positions, scale=scale, alpha=alpha, iters=iters, tol=tol,
              graph=graph, causal_slots=causal_slots)
