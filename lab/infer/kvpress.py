"""kvpress's baseline eviction policies, registered into :mod:`lab.infer.policies`.

Each scorer follows the press of the same name in NVIDIA's kvpress
(https://github.com/NVIDIA/kvpress, ``kvpress/presses/*_press.py``): it gives
every cached entry a score per (layer, batch row, KV head) and
:func:`lab.infer.policies.compact` keeps the ``budget = max(1, int(T * (1 - ratio)))``
best per KV head. Scores are computed at the end of prefill, inside the same
jit, from the statistics prefill captured (:class:`lab.infer.policies.Stats`):

* ``random``  -- uniform random scores (kvpress ``RandomPress``);
* ``knorm``   -- minus the L2 norm of the (rotated) key (kvpress ``KnormPress``);
* ``tova``    -- the last query's attention averaged over all query heads,
  the same for every KV head, the last token always kept (kvpress ``TOVAPress``);
* ``snapkv``  -- the attention of the last ``window`` (default 64) queries to
  the prefix before the window, averaged over the window, 1-D average pooling
  with kernel 5 (zero padding counted), averaged over the query heads of a GQA
  group; the window is always kept (kvpress ``SnapKVPress``);
* ``h2o``     -- attention summed over every prompt query and divided by the
  number of queries that see the key (kvpress ``ObservedAttentionPress``: the
  mean attention a key receives, so early keys are not favoured by having more
  queries), averaged over the group, plus H2O's recent window (Zhang et al.,
  2023): the last ``round(budget * recent_fraction)`` tokens are always kept
  (``recent_fraction=0`` is kvpress's press itself).

Every policy evicts at the end of prefill, scoring with the prompt's queries
(kvpress evaluates every press this way); with ``compress_every`` it evicts again
every few generated tokens, scoring with the queries generated since the last
compression (kvpress's ``DecodingPress``), so H2O's statistic is then the
attention of those queries.

``streaming_llm`` and ``full`` live in :mod:`lab.infer.policies`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lab.infer.policies import Policy, Stats, compact, register, window_attention
from lab.nn.cache import KVCache

PROTECT = 1e30  # added to the scores of protected entries (sinks, windows): kept first


def _group_mean(scores: jax.Array, n_kv_heads: int) -> jax.Array:
    """``[L, B, H, C] -> [L, B, Hkv, C]``: the mean over each KV group's query heads."""
    n_layers, b, h, c = scores.shape
    return scores.reshape(n_layers, b, n_kv_heads, h // n_kv_heads, c).mean(3)


def avg_pool(x: jax.Array, kernel_size: int) -> jax.Array:
    """1-D average pooling over the last axis, stride 1, same length: torch's
    ``F.avg_pool1d(x, kernel_size, padding=kernel_size // 2, stride=1)`` (zero
    padding counted in the mean), as kvpress pools SnapKV's scores."""
    if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size={kernel_size!r}; expected a positive odd int")
    r, c = kernel_size // 2, x.shape[-1]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(r, r)])
    return sum(padded[..., i:i + c] for i in range(kernel_size)) / kernel_size


def protect(scores: jax.Array, cache: KVCache, lengths: jax.Array, *, n_sink: int = 0,
            n_recent=0) -> jax.Array:
    """Scores with the first ``n_sink`` positions and each row's last ``n_recent``
    prompt positions raised above every unprotected entry.

    ``n_recent`` is an int or a ``[B]`` array (per-row recent window). Returns
    ``[L, B, Hkv, C]`` float32.
    """
    pos = cache.positions
    recent = jnp.broadcast_to(jnp.asarray(n_recent, jnp.int32), lengths.shape)
    keep = (pos >= 0) & ((pos < n_sink)
                         | (pos >= (lengths - recent)[None, :, None, None]))
    return jnp.where(keep, scores.astype(jnp.float32) + PROTECT, scores.astype(jnp.float32))


def random(cache: KVCache, stats: Stats, budget, *, seed: int = 0) -> KVCache:
    """kvpress ``RandomPress``: keeps a uniformly random ``budget`` entries per KV head
    (independently per layer, row and head), drawn from ``jax.random.key(seed)``."""
    del stats
    scores = jax.random.uniform(jax.random.key(seed), cache.positions.shape)
    return compact(cache, scores, budget)


def knorm(cache: KVCache, stats: Stats, budget) -> KVCache:
    """kvpress ``KnormPress`` (Devoto et al., 2024): score = ``-||k||_2`` of the stored
    key (after RoPE), so low-norm keys, which draw more attention, are kept."""
    del stats
    scores = -jnp.linalg.norm(cache.keys.astype(jnp.float32), axis=-1)
    return compact(cache, scores, budget)


def tova(cache: KVCache, stats: Stats, budget) -> KVCache:
    """kvpress ``TOVAPress`` (Oren et al., 2024): the last prompt query's attention
    probabilities averaged over all query heads (one score per token, shared by
    the KV heads); the last token itself is always kept."""
    n_kv = cache.keys.shape[2]
    p = window_attention(cache, stats)[..., -1, :]                # [L, B, H, C]
    scores = jnp.broadcast_to(p.mean(2, keepdims=True), (*p.shape[:2], n_kv, p.shape[-1]))
    return compact(cache, protect(scores, cache, stats.lengths, n_recent=1), budget)


def snapkv_scores(cache: KVCache, stats: Stats, *, kernel_size: int = 5) -> jax.Array:
    """SnapKV's scores ``[L, B, Hkv, C]`` (window entries get +:data:`PROTECT`).

    kvpress ``SnapKVPress.score``: ``attn[..., -w:, :-w].mean(-2)``, then
    ``F.avg_pool1d(kernel_size, padding=kernel_size // 2, stride=1)`` (zero
    padding counted in the mean), then the mean over the GQA group, then the
    window padded back in with the largest score.
    """
    p = window_attention(cache, stats)                            # [L, B, H, W, C]
    present = (stats.query_positions >= 0).sum(-1)                # [B]
    w = p.shape[3]
    mean = p.sum(3) / jnp.maximum(present, 1)[None, :, None, None]
    prefix_end = stats.lengths - jnp.minimum(present, w)          # first window position
    pos = cache.positions[:, :, :1, :]                            # [L, B, 1, C]
    in_prefix = (pos >= 0) & (pos < prefix_end[None, :, None, None])
    mean = jnp.where(in_prefix, mean, 0.0)
    scores = _group_mean(avg_pool(mean, kernel_size), cache.keys.shape[2])
    return protect(scores, cache, stats.lengths, n_recent=jnp.minimum(present, w))


def snapkv(cache: KVCache, stats: Stats, budget, *, kernel_size: int = 5) -> KVCache:
    """kvpress ``SnapKVPress`` (Li et al., 2024); see :func:`snapkv_scores`."""
    return compact(cache, snapkv_scores(cache, stats, kernel_size=kernel_size), budget)


def h2o(cache: KVCache, stats: Stats, budget, *, recent_fraction: float = 0.5) -> KVCache:
    """H2O (Zhang et al., 2023) as kvpress's ``ObservedAttentionPress`` plus a recent window.

    Score of the key at position ``p`` = its attention summed over the prompt's
    queries (``Stats.attn_colsum``) divided by how many of them see it,
    ``lengths - max(p, query_start)`` (kvpress: ``attentions.sum(2) /
    arange(n_tokens, 0, -1)``), averaged over the KV group's query heads; the last
    ``round(budget * recent_fraction)`` prompt tokens of each row are always kept
    (H2O's split of the budget between heavy hitters and recent tokens).
    """
    if not 0.0 <= recent_fraction <= 1.0:
        raise ValueError(f"recent_fraction={recent_fraction!r}; expected a number in [0, 1]")
    start = (jnp.zeros_like(stats.lengths) if stats.query_start is None
             else stats.query_start)[None, :, None, None]
    # Slots hold different positions per KV head once a cache has been compressed.
    seen = stats.lengths[None, :, None, None] - jnp.maximum(cache.positions, start)
    n_layers, b, h, c = stats.attn_colsum.shape
    n_kv = cache.keys.shape[2]
    colsum = stats.attn_colsum.reshape(n_layers, b, n_kv, h // n_kv, c)
    scores = (colsum / jnp.maximum(seen, 1)[:, :, :, None].astype(jnp.float32)).mean(3)
    b = jnp.broadcast_to(jnp.asarray(budget, jnp.int32), stats.lengths.shape)
    recent = jnp.round(b * recent_fraction).astype(jnp.int32)
    return compact(cache, protect(scores, cache, stats.lengths, n_recent=recent), budget)


register("random", Policy(random))
register("knorm", Policy(knorm))
register("tova", Policy(tova, needs=("queries",), window=1))
register("snapkv", Policy(snapkv, needs=("queries",), window=64))
register("h2o", Policy(h2o, needs=("attn_colsum",)))
