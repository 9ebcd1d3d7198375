"""One decoding step on the KV cache, and the jitted decode loop.

``Transformer.__call__`` with ``cache=`` serves any number of new tokens, but it
slices each layer's buffer out of the stacked ``[L, ...]`` cache and stacks the
results back, which XLA turns into copies of the whole cache on every step.
The decode loop instead carries the cache as one buffer per layer
(:class:`LayerCache`) and writes each new entry with a scatter that XLA
performs in place on the ``while_loop`` carry, and it runs the blocks with the
query/key/value and gate/up projections fused into one matmul each (weights
concatenated once, before the loop): at batch 8 a decode step is a chain of
small kernels, and their number is what costs. The norms, rotary embedding,
attention kernel and MLP are the model's own modules and functions, so the
numbers are the model's (the tests hold them to the full forward within 1e-4).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lab.infer import sampling
from lab.nn import KVCache, Transformer
from lab.nn.cache import check_cache
from lab.nn.layers import last_tokens


class LayerCache(NamedTuple):
    """The cache as per-layer tuples: ``keys[i], values[i] [B, Hkv, C, hd]``,
    ``positions[i] [B, Hkv, C]`` (policies may keep different entries per layer),
    ``length [B]``, and for ``qk_smear`` models ``qk_tail[i] [B, S, H + Hkv, hd]``
    with ``tail_positions [B, S]`` (empty tuple / None otherwise)."""

    keys: tuple
    values: tuple
    positions: tuple
    length: jax.Array
    qk_tail: tuple = ()
    tail_positions: jax.Array | None = None

    @classmethod
    def from_cache(cls, cache: KVCache) -> LayerCache:
        n = cache.keys.shape[0]
        tail = () if cache.qk_tail is None else tuple(cache.qk_tail[i] for i in range(n))
        return cls(tuple(cache.keys[i] for i in range(n)),
                   tuple(cache.values[i] for i in range(n)),
                   tuple(cache.positions[i] for i in range(n)), cache.length,
                   tail, cache.tail_positions)

    def to_cache(self) -> KVCache:
        return KVCache(jnp.stack(self.keys), jnp.stack(self.values), jnp.stack(self.positions),
                       self.length, jnp.stack(self.qk_tail) if self.qk_tail else None,
                       self.tail_positions)


def fused_weights(model: Transformer) -> tuple:
    """Per layer ``(w_qkv [D, (H + 2 Hkv) hd], b_qkv or None, w_gate_up [D, 2 F])``."""
    out = []
    for layer in model.layers:
        a, m = layer.attn, layer.mlp
        w = jnp.concatenate([a.q.kernel[...], a.k.kernel[...], a.v.kernel[...]], axis=1)
        bias = None
        if a.q.bias is not None:
            bias = jnp.concatenate([a.q.bias[...], a.k.bias[...], a.v.bias[...]])
        out.append((w, bias, jnp.concatenate([m.gate.kernel[...], m.up.kernel[...]], axis=1)))
    return tuple(out)


def _layers_step(model: Transformer, weights: tuple, cache: LayerCache, tokens, positions,
                 active, hidden: bool):
    c = model.config
    b = tokens.shape[0]
    rows = jnp.arange(b)
    slot = cache.length
    dt = c.jnp_dtype
    key_pos = (positions if active is None else jnp.where(active, positions, -1))
    key_pos = key_pos.astype(jnp.int32)[:, None]                   # [B, 1]
    pos = positions[:, None]                                        # [B, 1]
    nq, nkv, hd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.head_dim
    x = model.embed(tokens)[:, None, :]                             # [B, 1, D]
    states, keys, values, kpos, tails = [x], [], [], [], []
    tail_pos = cache.tail_positions
    for i, layer in enumerate(model.layers):
        w_qkv, b_qkv, w_gu = weights[i]
        a = layer.attn
        qkv = layer.attn_norm(x) @ w_qkv
        if b_qkv is not None:
            qkv = qkv + b_qkv
        q = qkv[..., :nq].reshape(b, 1, c.n_heads, hd)
        k = qkv[..., nq:nq + nkv].reshape(b, 1, c.n_kv_heads, hd)
        v = qkv[..., nq + nkv:].reshape(b, c.n_kv_heads, hd)
        if c.qk_smear:
            tail, tail_pos = last_tokens(cache.qk_tail[i], cache.tail_positions,
                                         jnp.concatenate([q, k], axis=2), key_pos)
            tails.append(tail)
        q, k = a.rotate(q, k, pos, src_positions=key_pos,
                        tail=cache.qk_tail[i] if c.qk_smear else None,
                        tail_positions=cache.tail_positions)  # [B, H, 1, hd]
        k = k[:, :, 0]                                              # [B, Hkv, hd]
        kc = cache.keys[i].at[rows, :, slot].set(k.astype(dt))
        vc = cache.values[i].at[rows, :, slot].set(v.astype(dt))
        pc = cache.positions[i].at[rows, :, slot].set(key_pos)
        allowed = pc[:, :, None, :] >= 0                            # [B, Hkv, 1, C]
        if c.causal:
            allowed &= pc[:, :, None, :] <= positions[:, None, None, None]
        out, _, _ = a.attend(q, kc, vc, allowed, None, probs=False, colsum=False)
        x = x + out
        gu = layer.mlp_norm(x) @ w_gu
        x = x + layer.mlp.down(jax.nn.silu(gu[..., :c.d_ff]) * gu[..., c.d_ff:])
        states.append(x)
        keys.append(kc), values.append(vc), kpos.append(pc)
    logits = model.unembed(x[:, 0])
    advance = jnp.ones((b,), jnp.int32) if active is None else active.astype(jnp.int32)
    new = LayerCache(tuple(keys), tuple(values), tuple(kpos), cache.length + advance,
                     tuple(tails), tail_pos)
    return logits, new, (jnp.stack(states)[:, :, 0] if hidden else None)


def step(model: Transformer, cache: KVCache, tokens: jax.Array, positions: jax.Array,
         active: jax.Array | None = None, *, hidden: bool = False):
    """Feeds one token per row.

    Args:
      tokens: ``[B]`` ids; positions: ``[B]`` their original positions.
      active: ``[B]`` bool or None; an inactive row writes an empty slot (position
        -1) and does not advance its ``length``, so its cache does not change.
      hidden: also return the residual stream.

    Returns:
      ``(logits [B, V] float32, cache, hidden [L+1, B, D] or None)``; the new
      key/value is stored at slot ``cache.length`` of each row.
    """
    check_cache(cache, model.config)
    logits, new, h = _layers_step(model, fused_weights(model), LayerCache.from_cache(cache),
                                  tokens, positions, active, hidden)
    return logits, new.to_cache(), h


def loop(model: Transformer, cache: KVCache, first, lengths, key, temperature, *,
         max_new: int, greedy: bool, top_k, top_p, stop: tuple[int, ...], pad_id: int,
         capture: str | None):
    """Decodes tokens ``1..max_new-1`` in a ``lax.while_loop`` (token 0 is given).

    Args:
      first: ``(token [B], logprob [B], hidden [L+1, B, D])`` of step 0 (from the
        prompt's last position; hidden may be None when nothing is captured).
      lengths: ``[B]`` prompt lengths: token ``i`` is fed at position ``lengths + i``.

    Returns:
      ``(tokens [B, N], logprobs [B, N], hidden or None, n [B])`` (see ``Generation``).
    """
    tok, lp, h0 = first
    b = tok.shape[0]
    choose = functools.partial(sampling.choose, temperature=temperature, greedy=greedy,
                               top_k=top_k, top_p=top_p)
    stop_ids = jnp.asarray(stop, jnp.int32)
    weights = fused_weights(model)

    def is_stop(t):
        return jnp.isin(t, stop_ids) if stop else jnp.zeros(t.shape, bool)

    def keep(h):  # [L+1, B, D] -> what is stored per step
        return h if capture == "hidden" else h[-1]

    hidden = None
    if capture:
        first_h = keep(h0)
        hidden = jnp.zeros(first_h.shape[:-1] + (max_new,) + first_h.shape[-1:], first_h.dtype)
        hidden = hidden.at[..., 0, :].set(first_h)
    carry = dict(i=jnp.int32(1), tok=tok, done=is_stop(tok), n=jnp.ones((b,), jnp.int32),
                 cache=LayerCache.from_cache(cache), hidden=hidden,
                 tokens=jnp.full((b, max_new), pad_id, jnp.int32).at[:, 0].set(tok),
                 logprobs=jnp.zeros((b, max_new), jnp.float32).at[:, 0].set(lp))

    def cond(c):
        return (c["i"] < max_new) & ~jnp.all(c["done"])

    def body(c):
        i, active = c["i"], ~c["done"]
        logits, cache, h = _layers_step(model, weights, c["cache"], c["tok"], lengths + i - 1,
                                        active if stop else None, capture is not None)
        tok, lp = choose(logits, jax.random.fold_in(key, i))
        tok = jnp.where(active, tok, pad_id)
        new = dict(i=i + 1, tok=tok, done=c["done"] | is_stop(tok), n=c["n"] + active,
                   cache=cache, hidden=c["hidden"],
                   tokens=jax.lax.dynamic_update_slice(c["tokens"], tok[:, None], (0, i)),
                   logprobs=jax.lax.dynamic_update_slice(
                       c["logprobs"], jnp.where(active, lp, 0.0)[:, None], (0, i)))
        if capture:
            h = jnp.where(active[:, None], keep(h), 0)[..., None, :]
            new["hidden"] = jax.lax.dynamic_update_slice_in_dim(c["hidden"], h, i, axis=-2)
        return new

    c = jax.lax.while_loop(cond, body, carry)
    return c["tokens"], c["logprobs"], c["hidden"], c["n"]
