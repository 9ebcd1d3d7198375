"""KV-cache policies: a registry of pure functions ``(cache, stats, budget) -> cache``.

A policy runs at the end of prefill (inside the same jit), and with
``compress_every`` every few decoding steps too, the way
NVIDIA's kvpress applies a "press" (https://github.com/NVIDIA/kvpress): every
scoring method assigns a score to each cached entry per (layer, batch row, KV
head) and keeps the ``budget`` best, ``budget = max(1, int(T * (1 - ratio)))`` per row
for a prompt of ``T`` tokens (kvpress's rule). Decoding then continues on the
compressed cache; rotary phases survive because keys are stored after RoPE and
the original positions are kept beside them.

A policy declares which prefill statistics it needs (:data:`STATS`) so that
prefill captures only those; :class:`Stats` carries them. Methods add theirs
with :func:`register` (also a decorator); the built-in names (:data:`BUILTIN`)
resolve on first use. :func:`compact` is the shared top-``budget`` gather that
every scoring policy ends with.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lab.nn.cache import KVCache

STATS = ("attn_colsum", "queries", "attn", "all_queries")
NEG_INF = -1e30


class Stats(NamedTuple):
    """What prefill measured, for the policy to score with (None unless a policy needs it).

    During decoding (``compress_every``) the "prompt queries" are the queries of the
    tokens generated since the last compression, and ``attn_colsum`` their attention.

    lengths:         ``[B]`` int32 tokens seen per row, the next position (after a
                     prompt: its length; the cache then holds slots
                     ``0..lengths[b]-1`` of row ``b`` at their positions).
    attn_colsum:     ``[L, B, H, C]`` float32 attention probabilities summed over
                     the row's prompt queries (padding queries contribute 0):
                     H2O's accumulated attention.
    queries:         ``[L, B, H, W, hd]`` the queries of each row's last ``W``
                     prompt tokens, after q-norm and RoPE (SnapKV's observation
                     window, TOVA's last query is ``queries[..., -1, :]``).
    query_positions: ``[B, W]`` int32 positions of those queries (-1 where a row
                     is shorter than ``W``).
    attn:            ``[L, B, H, T, C]`` float32 attention probabilities of every
                     prompt query (only when asked: it is ``O(T^2)``).
    all_queries:     ``[L, B, H, T, hd]`` the queries of every prompt token at its
                     slot (after q-norm and RoPE; padding slots hold the padding's
                     queries, position -1 in the cache): with the cache's keys they
                     give the attention graph matrix-free, in ``O(T)`` memory per
                     head (PRKV's).
    query_start:     ``[B]`` int32 position of the first query summed into
                     ``attn_colsum`` (its queries are positions ``query_start ..
                     lengths - 1``; None: 0, a prompt on an empty cache), so a key
                     at position ``p`` is seen by ``lengths - max(p, query_start)``
                     of them (H2O's normaliser).

    Keys (after RoPE) and values are in the cache itself; see :func:`window_attention`.
    """

    lengths: jax.Array
    attn_colsum: jax.Array | None = None
    queries: jax.Array | None = None
    query_positions: jax.Array | None = None
    attn: jax.Array | None = None
    all_queries: jax.Array | None = None
    query_start: jax.Array | None = None


def first_position(positions: jax.Array, end: jax.Array) -> jax.Array:
    """``[B]`` int32: each row's smallest valid (``>= 0``) position of ``positions``
    ``[B, T]``, or ``end[b]`` for a row with none (:attr:`Stats.query_start`)."""
    return jnp.min(jnp.where(positions >= 0, positions, end[:, None]), axis=1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A cache policy: ``fn(cache, stats, budget, **kwargs) -> cache``.

    needs:  which of :data:`STATS` prefill must capture for it.
    window: the number of last prompt queries captured when ``"queries"`` is needed
            (kvpress's SnapKV default, 64); a ``window=`` keyword to prefill overrides it.
    evicts: False for a policy that keeps everything (``full``): prefill then sizes
            the cache for the whole prompt whatever the ratio.

    ``budget`` is an int32 ``[B]`` array (entries to keep per KV head of each
    row); the returned cache must hold at most ``budget[b]`` valid entries per
    (layer, row, KV head), packed at the front, with ``length <= budget``.
    """

    fn: Callable
    needs: tuple[str, ...] = ()
    window: int = 64
    evicts: bool = True

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError(f"Policy.fn={self.fn!r} is not callable")
        object.__setattr__(self, "needs", tuple(self.needs))
        for name in self.needs:
            if name not in STATS:
                raise ValueError(f"Policy.needs contains {name!r}; expected any of {STATS}")
        if not isinstance(self.window, int) or self.window <= 0:
            raise ValueError(f"Policy.window={self.window!r}; expected a positive int")

    def __call__(self, cache: KVCache, stats: Stats, budget: jax.Array, **kwargs) -> KVCache:
        return self.fn(cache, stats, budget, **kwargs)


_REGISTRY: dict[str, Policy] = {}
# Built-in policies by the module that defines them: a name resolves on first use by
# importing its module (which registers it), so no import has to happen beforehand.
BUILTIN = {
    "full": __name__, "streaming_llm": __name__,
    "random": "lab.infer.kvpress", "knorm": "lab.infer.kvpress", "tova": "lab.infer.kvpress",
    "snapkv": "lab.infer.kvpress", "h2o": "lab.infer.kvpress",
    "prkv": "lab.methods.prkv",
}


def register(name: str, policy: Policy | Callable | None = None, *,
             needs: tuple[str, ...] = (), window: int = 64, overwrite: bool = False):
    """Adds a policy under ``name`` (a bare function is wrapped as ``Policy(fn, needs,
    window)``) and returns the registered :class:`Policy`.

    Without ``policy`` it is a decorator::

        @policies.register("keep_first", needs=())
        def keep_first(cache, stats, budget): ...

    Registering a different policy under a taken name raises ValueError unless
    ``overwrite=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy name {name!r}; expected a non-empty string")
    if policy is None:
        def decorate(fn):
            register(name, fn, needs=needs, window=window, overwrite=overwrite)
            return fn
        return decorate
    if not isinstance(policy, Policy):
        policy = Policy(policy, needs=needs, window=window)
    old = _REGISTRY.get(name)
    if old is not None and old != policy and not overwrite:
        raise ValueError(f"cache policy {name!r} is already registered; pass overwrite=True")
    _REGISTRY[name] = policy
    return policy


def get(name: str | Policy) -> Policy:
    """The :class:`Policy` registered as ``name`` (a Policy passes through); a built-in
    name imports the module that defines it on first use."""
    if isinstance(name, Policy):
        return name
    if isinstance(name, str) and name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown cache policy {name!r}; known policies: {names()}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Every policy name :func:`get` resolves (built-in and registered), sorted."""
    return tuple(sorted(set(_REGISTRY) | set(BUILTIN)))


def budgets(lengths, ratio: float):
    """kvpress's rule, per row: ``max(1, int(T * (1 - ratio)))`` entries kept per KV head
    (kvpress's ``compute_n_kept``: a short row keeps at least one entry), 0 for an empty row.

    Computed in Python floats on host lengths so it matches kvpress exactly.
    Raises ValueError for a ratio outside ``[0, 1)``.
    """
    if not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) < 1.0:
        raise ValueError(f"ratio={ratio!r}; expected a compression ratio in [0, 1)")
    return [min(int(t), max(1, int(int(t) * (1.0 - float(ratio))))) for t in lengths]


def compact(cache: KVCache, scores: jax.Array, budget) -> KVCache:
    """Keeps the top-``budget`` entries per (layer, row, KV head) by ``scores``.

    Args:
      cache: the cache to compress.
      scores: ``[L, B, Hkv, C]``, higher = keep; empty slots are never kept.
      budget: int or ``[B]`` int array, entries to keep per KV head of each row.

    Returns:
      The cache with the kept entries gathered to the front of each head's
      buffer in their original slot order (keys, values, positions), every
      other slot emptied (position -1, zero key/value) and ``length`` set to
      the largest number kept in the row (the next write slot). Ties go to the
      earlier slot. This is kvpress's ``scores.topk(n_kept)`` + gather.
    """
    c = cache.capacity
    valid = cache.valid
    s = jnp.where(valid, scores.astype(jnp.float32), -jnp.inf)
    order = jnp.argsort(-s, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    b = jnp.broadcast_to(jnp.asarray(budget, jnp.int32), cache.length.shape)
    keep = valid & (rank < b[None, :, None, None])
    slot = jnp.arange(c, dtype=jnp.int32)
    idx = jnp.argsort(jnp.where(keep, slot, c + slot), axis=-1, stable=True)
    kept = jnp.take_along_axis(keep, idx, axis=-1)
    positions = jnp.where(kept, jnp.take_along_axis(cache.positions, idx, axis=-1), -1)
    gather = idx[..., None]
    keys = jnp.where(kept[..., None], jnp.take_along_axis(cache.keys, gather, axis=3), 0)
    values = jnp.where(kept[..., None], jnp.take_along_axis(cache.values, gather, axis=3), 0)
    length = jnp.max(jnp.sum(kept, axis=-1), axis=(0, 2)).astype(jnp.int32)
    return cache._replace(keys=keys.astype(cache.keys.dtype),
                          values=values.astype(cache.values.dtype),
                          positions=positions.astype(jnp.int32), length=length)


def resize(cache: KVCache, capacity: int) -> KVCache:
    """The same entries in a buffer of ``capacity`` slots (padding with empty slots,
    or dropping trailing slots, which must be empty: ``length <= capacity``)."""
    c = cache.capacity
    if capacity == c:
        return cache
    if capacity < c:
        return cache._replace(keys=cache.keys[:, :, :, :capacity],
                              values=cache.values[:, :, :, :capacity],
                              positions=cache.positions[:, :, :, :capacity])
    pad = [(0, 0)] * 3 + [(0, capacity - c)]
    return cache._replace(keys=jnp.pad(cache.keys, pad + [(0, 0)]),
                          values=jnp.pad(cache.values, pad + [(0, 0)]),
                          positions=jnp.pad(cache.positions, pad, constant_values=-1))


def window_attention(cache: KVCache, stats: Stats) -> jax.Array:
    """Attention probabilities of the window queries over the cache, ``[L, B, H, W, C]``.

    Softmax of ``q . k / sqrt(hd)`` over the valid, causally visible entries
    (``0 <= key position <= query position``), as kvpress's SnapKV and TOVA
    compute them from the last queries; rows of absent queries are zero.
    Needs ``"queries"`` in the policy's ``needs``.
    """
    if stats.queries is None:
        raise ValueError("window_attention needs stats.queries; declare needs=('queries',)")
    q = stats.queries.astype(jnp.float32)                         # [L, B, H, W, d]
    n_layers, b, h, w, d = q.shape
    hkv = cache.keys.shape[2]
    qg = q.reshape(n_layers, b, hkv, h // hkv, w, d)
    logits = jnp.einsum("lbkgwd,lbkcd->lbkgwc", qg, cache.keys.astype(jnp.float32)) * d ** -0.5
    kpos = cache.positions[:, :, :, None, None, :]                # [L, B, Hkv, 1, 1, C]
    qpos = stats.query_positions[None, :, None, None, :, None]    # [1, B, 1, 1, W, 1]
    allowed = (kpos >= 0) & (kpos <= qpos) & (qpos >= 0)
    logits = jnp.where(allowed, logits, NEG_INF)
    p = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True)) * allowed
    p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    return p.reshape(n_layers, b, h, w, -1)


def full(cache: KVCache, stats: Stats, budget) -> KVCache:
    """Keeps every entry (the uncompressed baseline)."""
    del stats, budget
    return cache


def streaming_llm(cache: KVCache, stats: Stats, budget, *, n_sink: int = 4) -> KVCache:
    """StreamingLLM (Xiao et al., 2024), as kvpress's ``StreamingLLMPress``: the first
    ``n_sink`` tokens (attention sinks) plus the most recent ``budget - n_sink``.

    Scores by original position, sinks above everything, so it also works on a
    cache that was already compressed.
    """
    del stats
    pos = cache.positions
    big = jnp.int32(2 ** 30)
    scores = jnp.where(pos < n_sink, big - pos, pos).astype(jnp.float32)
    return compact(cache, scores, budget)


register("full", Policy(full, evicts=False))
register("streaming_llm", Policy(streaming_llm))
