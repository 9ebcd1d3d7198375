"""KVCache: fixed-capacity, per-layer, per-KV-head key/value buffers with original positions.

Entries can be evicted independently per KV head (a policy rewrites
``positions`` to -1 or compacts the kept entries to the front) and decoding
continues on what is left: keys are stored after rotary embedding, so a stored
key keeps the phase of its original position, and the attention mask is built
from ``positions`` (``0 <= position <= query position``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LayerKV(NamedTuple):
    """One layer's share of a :class:`KVCache` (what :meth:`lab.nn.Block.__call__` reads
    and returns): ``keys, values [B, Hkv, C, hd]``, ``positions [B, Hkv, C]``, and for
    ``qk_smear`` models ``qk_tail [B, S, H + Hkv, hd]`` at ``tail_positions [B, S]``."""

    keys: jax.Array
    values: jax.Array
    positions: jax.Array
    qk_tail: jax.Array | None = None
    tail_positions: jax.Array | None = None


class KVCache(NamedTuple):
    """Stacked over layers.

    keys, values: ``[L, B, Hkv, C, head_dim]`` (keys after RoPE).
    positions:    ``[L, B, Hkv, C]`` int32 original token positions, -1 = empty.
    length:       ``[B]`` int32: the next slot to write, per row (the same for
                  every layer and head: policies compact kept entries to the front).
    qk_tail:      ``[L, B, S, H + Hkv, head_dim]`` or None: the raw queries and keys
                  (before smear, norm and RoPE) of each row's ``S`` latest tokens,
                  for models with ``qk_smear = S`` (like a convolution's state, it is
                  the current tokens' context, not evictable).
    tail_positions: ``[B, S]`` int32 or None: their positions (-1 = none).
    next_position: ``[B]`` int32: the position the next fed token of each row takes
                  (the number of tokens the row has seen; an evicting policy lowers
                  ``length`` but not this). None in a hand-built cache: ``length``.
    """

    keys: jax.Array
    values: jax.Array
    positions: jax.Array
    length: jax.Array
    qk_tail: jax.Array | None = None
    tail_positions: jax.Array | None = None
    next_position: jax.Array | None = None

    @classmethod
    def init(cls, config, batch: int, capacity: int) -> KVCache:
        c = config
        shape = (c.n_layers, batch, c.n_kv_heads, capacity, c.head_dim)
        tail = tail_positions = None
        if c.qk_smear:
            tail = jnp.zeros((c.n_layers, batch, c.qk_smear, c.n_heads + c.n_kv_heads,
                              c.head_dim), c.jnp_dtype)
            tail_positions = jnp.full((batch, c.qk_smear), -1, jnp.int32)
        return cls(
            keys=jnp.zeros(shape, c.jnp_dtype),
            values=jnp.zeros(shape, c.jnp_dtype),
            positions=jnp.full(shape[:-1], -1, jnp.int32),
            length=jnp.zeros((batch,), jnp.int32),
            qk_tail=tail, tail_positions=tail_positions,
            next_position=jnp.zeros((batch,), jnp.int32),
        )

    def layers(self) -> tuple[LayerKV, ...]:
        """The per-layer views (slices of the stacked buffers)."""
        tail = self.qk_tail
        return tuple(LayerKV(self.keys[i], self.values[i], self.positions[i],
                             None if tail is None else tail[i], self.tail_positions)
                     for i in range(self.keys.shape[0]))

    @classmethod
    def from_layers(cls, layers, length: jax.Array, next_position: jax.Array | None = None
                    ) -> KVCache:
        """Stacks per-layer caches back (the inverse of :meth:`layers`)."""
        tail = [lc.qk_tail for lc in layers]
        return cls(jnp.stack([lc.keys for lc in layers]),
                   jnp.stack([lc.values for lc in layers]),
                   jnp.stack([lc.positions for lc in layers]), length,
                   None if tail[0] is None else jnp.stack(tail), layers[0].tail_positions,
                   next_position)

    @property
    def next_positions(self) -> jax.Array:
        """``next_position``, or ``length`` for a cache built without it."""
        return self.length if self.next_position is None else self.next_position

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def valid(self) -> jax.Array:
        """``[L, B, Hkv, C]`` boolean: the slot holds a token."""
        return self.positions >= 0

    def nbytes(self) -> int:
        """Bytes held by the buffers (keys, values, positions, and the q/k tail if any)."""
        parts = (self.keys, self.values, self.positions, self.qk_tail, self.tail_positions)
        # (length and next_position are bookkeeping, not storage)
        return int(sum(x.size * x.dtype.itemsize for x in parts if x is not None))

    def kept_bytes(self) -> jax.Array:
        """Bytes of the entries actually kept (what a compressed cache needs to store)."""
        per_entry = 2 * self.keys.shape[-1] * self.keys.dtype.itemsize + 4
        return jnp.sum(self.valid) * per_entry


def write(layer_keys, layer_values, layer_positions, start, new_k, new_v, new_pos):
    """Writes ``T`` new entries per row at slot ``start[b]`` (one layer).

    layer_*: ``[B, Hkv, C, ...]``; new_k/new_v: ``[B, Hkv, T, D]``; new_pos: ``[B, T]``.
    One new token is a scatter at ``[row, :, start[row]]``, which XLA performs in
    place on a ``while_loop`` carry (the decode loop's cache is never copied).
    """
    if new_k.shape[2] == 1:
        rows = jnp.arange(layer_keys.shape[0])
        pos = jnp.broadcast_to(new_pos[:, :1], (new_pos.shape[0], layer_positions.shape[1]))
        return (layer_keys.at[rows, :, start].set(new_k[:, :, 0].astype(layer_keys.dtype)),
                layer_values.at[rows, :, start].set(new_v[:, :, 0].astype(layer_values.dtype)),
                layer_positions.at[rows, :, start].set(pos.astype(jnp.int32)))

    def one(kc, vc, pc, s, k, v, p):
        kc = jax.lax.dynamic_update_slice(kc, k.astype(kc.dtype), (0, s, 0))
        vc = jax.lax.dynamic_update_slice(vc, v.astype(vc.dtype), (0, s, 0))
        pp = jnp.broadcast_to(p[None, :], (pc.shape[0], p.shape[0])).astype(jnp.int32)
        pc = jax.lax.dynamic_update_slice(pc, pp, (0, s))
        return kc, vc, pc

    return jax.vmap(one)(layer_keys, layer_values, layer_positions, start, new_k, new_v, new_pos)


def check_cache(cache: KVCache, config) -> None:
    """Raises ValueError when ``cache`` cannot serve a model of ``config`` (a ``qk_smear``
    model needs the q/k tail that :meth:`KVCache.init` allocates)."""
    if config.qk_smear and (cache.qk_tail is None or cache.qk_tail.shape[2] != config.qk_smear):
        got = None if cache.qk_tail is None else cache.qk_tail.shape[2]
        raise ValueError(f"the model has qk_smear={config.qk_smear} but the KVCache's qk_tail "
                         f"holds {got} tokens; build the cache with KVCache.init(config, ...)")
