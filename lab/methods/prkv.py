"""PRKV: KV-cache eviction by personalized PageRank over the attention graph.

PRKV ("a training-free KV eviction method that estimates multi-hop global
token importance by applying Personalized PageRank over attention-induced
transition graphs") scores every cached token by where a random walk that
starts at the question ends up when it follows attention: from a query token
``i`` the walk moves to key token ``j`` with probability ``A[i, j]`` (the
prefill's causal attention probabilities, whose rows are already stochastic
over the prefix) and restarts with probability ``1 - alpha`` at a token drawn
from the restart vector ``v`` (uniform over the observation window -- the
last ``window`` prompt tokens -- or over a given question span). The fixed
point ``pi = (1 - alpha) v + alpha pi A`` (networkx's convention; computed by
:func:`personalized_pagerank`, a Pallas kernel on GPU/TPU and its jnp
reference on CPU) puts mass on the tokens the question attends to, the
tokens *those* attend to, and so on: evidence two hops away from the question
(``qze=kfp.`` -> ``kfp=abc.`` -> ``abc=417.``) scores high even if the
question never attends to it directly, which one-hop scores (SnapKV, TOVA)
miss.

Graph per layer: ``graph="group"`` averages the attention of a KV group's
query heads into one graph per KV head; ``graph="head"`` runs one PageRank
per query head and averages the scores over the group. Each layer's cache is
scored from that layer's attention. The top ``budget`` entries per KV head
are kept (:func:`lab.infer.policies.compact`); ``n_sink`` first positions and
``n_recent`` last positions can be protected.

Solve and memory: the policy never materialises the attention. It takes the
queries of every prompt token (``Stats.all_queries``, ``[L, B, H, T, hd]``) and
the keys the cache already holds. Causal attention only moves the walk to
earlier tokens (or stays), so each layer's chain is a triangular linear system:
by default (``solver="exact"``)
:func:`kernels_pallas.pagerank.attention_pagerank_exact` solves it by blocked
back-substitution, recomputing the attention a tile at a time, in about the
work of one power step, to the fixed point itself rather than an iterate
approaching it; ``solver="power"`` runs ``iters`` power steps
(:func:`kernels_pallas.pagerank.attention_pagerank`, which recomputes the tiles
in every step). Either way, beyond the queries (as large as the keys), O(T)
memory per head.
:func:`prkv_dense` is the same policy on the materialised ``Stats.attn``
(``[L, B, H, T, T]`` float32, ``4 L B H T^2`` bytes: 1 GiB at T = 2048 for 2
layers x 4 heads x batch 8, plus one ``[T, T]`` graph per (layer, row, KV head)
inside the solve); it is kept as the reference the matrix-free policy is
tested against and as :data:`DENSE`, an unregistered :class:`Policy` for
measuring what materialising costs.

While a long output is generated (``generate(..., compress_every=N)``, kvpress's
``DecodingPress``) the policy re-scores every ``N`` tokens on the graph those ``N``
tokens' queries span (:func:`decoding_scores`): the older entries' queries are not
kept, so the walk propagates only through the new tokens.

Importing this module registers the policy as ``"prkv"`` in
:mod:`lab.infer.policies`, so ``lab.infer.prefill(model, tokens, policy="prkv",
ratio=0.75)`` and ``generate(...)`` use it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.pagerank import (
    attention_pagerank,
    attention_pagerank_exact,
    personalized_pagerank,
)
from lab.infer.kvpress import avg_pool, protect
from lab.infer.policies import Policy, Stats, compact, register, window_attention
from lab.nn.cache import KVCache

GRAPHS = ("group", "head")
SOLVERS = ("exact", "power")

__all__ = ["DENSE", "GRAPHS", "SOLVERS", "attention_pagerank", "attention_pagerank_exact",
           "decoding_scores", "keep", "observed_restart", "personalized_pagerank",
           "prefill_scores", "prkv", "prkv_dense", "prkv_scores", "prkv_scores_matrix_free",
           "span_restart", "transition_graph", "window_restart"]


def window_restart(lengths: jax.Array, t: int, window: int) -> jax.Array:
    """Restart vectors ``[B, T]``: uniform over each row's last ``window`` prompt tokens
    (the whole prompt when it is shorter)."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}; expected a positive int")
    pos = jnp.arange(t, dtype=jnp.int32)[None, :]
    lengths = jnp.asarray(lengths, jnp.int32)[:, None]
    on = (pos < lengths) & (pos >= lengths - window)
    return on / jnp.sum(on, axis=-1, keepdims=True)


def span_restart(starts, ends, t: int) -> jax.Array:
    """Restart vectors ``[B, T]`` uniform over ``[starts[b], ends[b])`` (e.g. the
    question's tokens). Raises ValueError (on host values) for an empty or
    out-of-range span."""
    starts, ends = jnp.asarray(starts, jnp.int32), jnp.asarray(ends, jnp.int32)
    if not isinstance(starts, jax.core.Tracer) and not isinstance(ends, jax.core.Tracer):
        if bool(jnp.any(starts < 0)) or bool(jnp.any(ends > t)) or bool(jnp.any(ends <= starts)):
            raise ValueError(f"restart spans starts={starts.tolist()} ends={ends.tolist()}; "
                             f"expected 0 <= start < end <= {t}")
    pos = jnp.arange(t, dtype=jnp.int32)[None, :]
    on = (pos >= starts[:, None]) & (pos < ends[:, None])
    return on / jnp.sum(on, axis=-1, keepdims=True)


def transition_graph(attn: jax.Array, n_kv_heads: int, v: jax.Array,
                     graph: str = "group") -> jax.Array:
    """Row-stochastic transition matrices from attention probabilities.

    Args:
      attn: ``[L, B, H, T, T]`` (row = query token, column = key token).
      n_kv_heads: ``Hkv`` (``H`` must be a multiple).
      v: ``[B, T]`` restart vectors; rows of absent (padding) queries, which
        attend to nothing, jump to ``v`` (networkx's rule for dangling nodes).
      graph: ``"group"`` (mean over a KV group's heads) or ``"head"``.

    Returns:
      ``[L, B, Hkv, T, T]`` (group) or ``[L, B, H, T, T]`` (head) float32.
    """
    if graph not in GRAPHS:
        raise ValueError(f"graph={graph!r}; expected one of {GRAPHS}")
    n_layers, b, h, t, s = attn.shape
    if t != s or h % n_kv_heads:
        raise ValueError(f"attn has shape {attn.shape}; expected [L, B, H, T, T] with H a "
                         f"multiple of n_kv_heads={n_kv_heads}")
    p = attn.astype(jnp.float32)
    if graph == "group":
        p = p.reshape(n_layers, b, n_kv_heads, h // n_kv_heads, t, t).mean(3)
    sums = p.sum(-1, keepdims=True)
    dangling = sums < 0.5
    vb = v.astype(jnp.float32)[None, :, None, None, :]
    return jnp.where(dangling, vb, p / jnp.where(dangling, 1.0, sums))


def prkv_scores(attn: jax.Array, v: jax.Array, n_kv_heads: int, *, alpha: float = 0.85,
                iters: int = 50, tol: float | None = None, graph: str = "group",
                impl: str | None = None, solver: str = "power") -> jax.Array:
    """PageRank scores ``[L, B, Hkv, T]`` of every key token per KV head.

    ``pi`` of :func:`transition_graph`'s chain with restart ``v [B, T]``
    (:func:`window_restart` or :func:`span_restart`); with ``graph="head"`` the
    mean of the query heads' ``pi`` over each group. Every ``pi`` sums to 1.
    ``solver="power"``: ``iters`` power steps (:func:`personalized_pagerank`);
    ``"exact"``: the fixed point by a dense triangular solve, for attention whose keys
    are never in later slots than their query (a prefill's): ``y (I - alpha P0) = v``
    with the dangling rows of ``P0`` zeroed, ``pi = y / sum(y)`` (the mass those rows send
    back to ``v`` only rescales ``y``).
    """
    _check_solver(solver)
    n_layers, b, h, t, _ = attn.shape
    # with a zero restart the dangling rows stay zero (the exact solve's P0)
    p = transition_graph(attn, n_kv_heads, jnp.zeros_like(v) if solver == "exact" else v,
                         graph)
    vb = jnp.broadcast_to(v.astype(jnp.float32)[None, :, None, :], p.shape[:-1])
    if solver == "exact":
        y = jax.scipy.linalg.solve_triangular(jnp.eye(t) - alpha * p, vb[..., None],
                                              lower=True, trans="T")[..., 0]
        pi = y / jnp.sum(y, axis=-1, keepdims=True)
    else:
        pi = personalized_pagerank(p, vb, alpha=alpha, iters=iters, tol=tol, impl=impl)
    if graph == "head":
        pi = pi.reshape(n_layers, b, n_kv_heads, h // n_kv_heads, t).mean(3)
    return pi


def prkv_scores_matrix_free(queries: jax.Array, keys: jax.Array, positions: jax.Array,
                            v: jax.Array, *, alpha: float = 0.85, iters: int = 50,
                            tol: float | None = None, graph: str = "group",
                            impl: str | None = None, causal_slots: bool = False,
                            solver: str = "power") -> jax.Array:
    """:func:`prkv_scores` without the attention: ``[L, B, Hkv, T]`` from queries and keys.

    Args:
      queries: ``[L, B, H, T, hd]`` every prompt token's queries (after RoPE), at its slot.
      keys: ``[L, B, Hkv, T, hd]`` the same tokens' keys (the prefill cache's).
      positions: ``[B, T]`` int32 token positions, -1 = padding (never attended; a
        padding query is a dangling row that jumps to ``v``).
      v: ``[B, T]`` restart vectors.

    Each layer's chain is :func:`prkv_scores`'s on the causal softmax attention
    ``softmax(q k^T / sqrt(hd))`` that ``lab.nn`` computes, solved by
    :func:`kernels_pallas.pagerank.attention_pagerank` (equal to the materialised
    solve within 1e-6; ``impl`` and ``causal_slots``, the promise that positions strictly
    increase over the valid slots so masked tiles are skipped, as there).
    ``solver="exact"`` (which needs ``causal_slots``) solves each chain's fixed point
    exactly by back-substitution instead
    (:func:`kernels_pallas.pagerank.attention_pagerank_exact`; ``iters``, ``tol`` and
    ``impl`` unused): causal attention makes the chain triangular.
    """
    if queries.ndim != 5 or keys.ndim != 5 or queries.shape[:2] != keys.shape[:2] \
            or queries.shape[3:] != keys.shape[3:]:
        raise ValueError(f"queries {queries.shape} and keys {keys.shape}; expected "
                         "[L, B, H, T, hd] and [L, B, Hkv, T, hd]")
    _check_solver(solver)
    if solver == "exact":
        if not causal_slots:
            raise ValueError("solver='exact' needs causal_slots=True (positions strictly "
                             "increasing over the valid slots: the chain is then triangular)")
        return jnp.stack([attention_pagerank_exact(queries[i], keys[i], v, positions=positions,
                                                   alpha=alpha, graph=graph)
                          for i in range(queries.shape[0])])
    return jnp.stack([attention_pagerank(queries[i], keys[i], v, positions=positions,
                                         alpha=alpha, iters=iters, tol=tol, graph=graph,
                                         impl=impl, causal_slots=causal_slots)
                      for i in range(queries.shape[0])])


def _check_solver(solver):
    if solver not in SOLVERS:
        raise ValueError(f"solver={solver!r}; expected one of {SOLVERS}")


def observed_restart(stats: Stats, t: int) -> jax.Array:
    """Restart vectors ``[B, T]`` uniform over the positions of the queries prefill captured
    (``Stats.query_positions``: each row's observation window or question)."""
    qpos = stats.query_positions                                  # [B, W], -1 = absent
    on = jnp.any(jnp.arange(t, dtype=jnp.int32)[None, :, None] == qpos[:, None, :], axis=-1)
    return on / jnp.maximum(jnp.sum(on, axis=-1, keepdims=True), 1)


def _check_budget(budget, cache: KVCache, t: int):
    if not isinstance(budget, jax.core.Tracer) and int(jnp.max(jnp.asarray(budget))) > t:
        raise ValueError(f"budget={jnp.asarray(budget).tolist()} exceeds the context of {t} "
                         "tokens; expected at most the prompt length per row")
    if cache.capacity != t:
        raise ValueError(f"prkv scores a cache of {t} slots (the prompt), got capacity "
                         f"{cache.capacity}")


def keep(cache: KVCache, stats: Stats, scores: jax.Array, budget, *, n_sink: int = 0,
         n_recent: int = 0, kernel_size: int = 1) -> KVCache:
    """The policy's last step on PageRank ``scores [L, B, Hkv, T]``: pooling, protection of
    sinks and recent tokens, top-``budget`` compaction. Scores do not depend on the budget,
    so one solve serves every ratio and pooling (the experiment's ablation)."""
    if kernel_size != 1:
        scores = avg_pool(scores, kernel_size)
    scores = protect(scores, cache, stats.lengths, n_sink=n_sink, n_recent=n_recent)
    return compact(cache, scores, budget)


def decoding_scores(cache: KVCache, stats: Stats, *, alpha: float = 0.85, iters: int = 50,
                    graph: str = "group", impl: str | None = None) -> jax.Array:
    """PRKV's scores ``[L, B, Hkv, C]`` while decoding (``compress_every``).

    The graph's nodes are the cached entries. Only the tokens written since the last
    compression have a query (``Stats.queries``, at ``Stats.query_positions``; the
    older entries' queries were never kept), so only they have outgoing edges: the
    row of the entry holding such a token is its attention over the cache
    (:func:`lab.infer.policies.window_attention`, per KV head, since a compressed cache
    holds different positions per head). The other entries are dangling and, as
    networkx does, jump to the restart, which is uniform over the new tokens. Multi-hop
    mass therefore flows only through the new tokens: an older entry scores by the
    attention the recent tokens pay it, weighted by how much of the walk reaches each
    of them.
    """
    if graph not in GRAPHS:
        raise ValueError(f"graph={graph!r}; expected one of {GRAPHS}")
    p = window_attention(cache, stats)                               # [L, B, H, W, C]
    n_layers, b, h, w, c = p.shape
    n_kv = cache.keys.shape[2]
    p = p.reshape(n_layers, b, n_kv, h // n_kv, w, c)
    if graph == "group":
        p = p.mean(3, keepdims=True)
    qpos = stats.query_positions[None, :, None, :, None]             # [1, B, 1, W, 1]
    holds = (cache.positions[:, :, :, None, :] == qpos) & (qpos >= 0)  # [L, B, Hkv, W, C]
    rows = jnp.einsum("lbkwc,lbkgwd->lbkgcd", holds.astype(jnp.float32), p)
    v = holds.any(3).astype(jnp.float32)                             # [L, B, Hkv, C]
    v = jnp.broadcast_to((v / jnp.maximum(v.sum(-1, keepdims=True), 1.0))[:, :, :, None],
                         rows.shape[:-1])
    dangling = rows.sum(-1, keepdims=True) < 0.5
    pi = personalized_pagerank(jnp.where(dangling, v[..., None, :], rows), v, alpha=alpha,
                               iters=iters, impl=impl)
    return pi.mean(3)


def prefill_scores(cache: KVCache, stats: Stats, *, alpha: float = 0.85, iters: int = 50,
                   graph: str = "group", impl: str | None = None, solver: str = "exact"
                   ) -> jax.Array:
    """PRKV's PageRank scores ``[L, B, Hkv, T]`` of the uncompressed prefill cache: the
    attention of ``Stats.all_queries`` over the cache's keys, matrix-free
    (:func:`prkv_scores_matrix_free`; slot = position in a prefill cache, so the masked key
    tiles past each query group are skipped), restarting at the captured queries'
    positions (:func:`observed_restart`). ``solver="exact"``: the chain's fixed point by
    back-substitution (the prefill cache's causal attention is triangular); ``"power"``:
    ``iters`` power steps from the restart. They do not depend on the budget: one solve
    serves every ratio (:func:`keep`)."""
    if stats.all_queries is None or stats.query_positions is None:
        raise ValueError("prkv needs stats.all_queries and stats.query_positions; register "
                         "it with needs=('all_queries', 'queries')")
    t = stats.all_queries.shape[3]
    return prkv_scores_matrix_free(stats.all_queries, cache.keys, cache.positions[0, :, 0],
                                   observed_restart(stats, t), alpha=alpha, iters=iters,
                                   graph=graph, impl=impl, causal_slots=True, solver=solver)


def prkv(cache: KVCache, stats: Stats, budget, *, alpha: float = 0.85, iters: int = 50,
         graph: str = "group", n_sink: int = 0, n_recent: int = 0, kernel_size: int = 1,
         impl: str | None = None, solver: str = "exact") -> KVCache:
    """The PRKV cache policy: keeps the top-``budget`` PageRank scores per KV head.

    Restart uniform over the observation window: the positions of the queries
    prefill captured (``Stats.query_positions``, each row's last ``window``
    prompt tokens; ``window=`` to prefill/generate sets it, default 64 as
    SnapKV's). ``n_sink`` first and ``n_recent`` last positions are always
    kept. ``kernel_size > 1`` average-pools the scores over neighbouring
    positions before the top-k, as SnapKV pools its scores
    (:func:`lab.infer.kvpress.avg_pool`; 1 = off). The graph is the attention of
    ``Stats.all_queries`` over the cache's keys, never materialised
    (:func:`prefill_scores`), its PageRank solved exactly (``solver="exact"``, the default)
    or by ``iters`` power steps (``"power"``). Runs on the uncompressed prefill cache, as
    every policy does.

    While decoding (``generate(..., compress_every=)``), where only the queries of the
    tokens written since the last compression exist (``Stats.all_queries`` is None), the
    graph is theirs: :func:`decoding_scores` (power steps: that graph is not triangular).
    """
    _check_solver(solver)
    if stats.all_queries is None and stats.queries is not None:
        scores = decoding_scores(cache, stats, alpha=alpha, iters=iters, graph=graph,
                                 impl=impl)
        return keep(cache, stats, scores, budget, n_sink=n_sink, n_recent=n_recent,
                    kernel_size=kernel_size)
    if stats.all_queries is not None:
        _check_budget(budget, cache, stats.all_queries.shape[3])
    scores = prefill_scores(cache, stats, alpha=alpha, iters=iters, graph=graph, impl=impl,
                            solver=solver)
    return keep(cache, stats, scores, budget, n_sink=n_sink, n_recent=n_recent,
                kernel_size=kernel_size)


def prkv_dense(cache: KVCache, stats: Stats, budget, *, alpha: float = 0.85, iters: int = 50,
               graph: str = "group", n_sink: int = 0, n_recent: int = 0, kernel_size: int = 1,
               impl: str | None = None, solver: str = "exact") -> KVCache:
    """:func:`prkv` on the materialised attention ``Stats.attn`` (:func:`prkv_scores`, the
    same ``solver``): the reference the matrix-free policy is tested against; needs
    ``Stats.attn``."""
    if stats.attn is None or stats.query_positions is None:
        raise ValueError("prkv_dense needs stats.attn and stats.query_positions; use it with "
                         "needs=('attn', 'queries')")
    t = stats.attn.shape[-1]
    _check_budget(budget, cache, t)
    scores = prkv_scores(stats.attn, observed_restart(stats, t), cache.keys.shape[2], alpha=alpha,
                         iters=iters, graph=graph, impl=impl, solver=solver)
    return keep(cache, stats, scores, budget, n_sink=n_sink, n_recent=n_recent,
                kernel_size=kernel_size)


register("prkv", Policy(prkv, needs=("all_queries", "queries"), window=64))
# The materialised variant, not registered: pass it as ``policy=DENSE`` to prefill/generate.
DENSE = Policy(prkv_dense, needs=("attn", "queries"), window=64)
