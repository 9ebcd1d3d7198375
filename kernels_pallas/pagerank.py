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
"""

from __future__ import annotations

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
