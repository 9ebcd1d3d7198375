"""One decoding step on the stacked KV cache, and the jitted decode loop.

``Transformer.__call__`` with ``cache=`` serves any number of new tokens, but it
slices each layer's buffer out of the stacked ``[L, ...]`` cache and stacks the
results back, which XLA turns into copies of the whole cache on every step.
:func:`step` runs the same blocks (the model's own ``project``/``attend``/MLP
modules, so the numbers are the same) for one token per row and writes the
new entry with a scatter into the stacked buffers, which XLA performs in place
on the ``while_loop`` carry: the per-step memory traffic is the weights plus
one read of the cache.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lab.infer import sampling
from lab.nn import KVCache, Transformer


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
    c = model.config
    b = tokens.shape[0]
    rows = jnp.arange(b)
    slot = cache.length
    key_pos = positions if active is None else jnp.where(active, positions, -1)
    kpos = cache.positions.at[:, rows, :, slot].set(key_pos[:, None, None].astype(jnp.int32))
    allowed = kpos[:, :, :, None, :] >= 0                          # [L, B, Hkv, 1, C]
    if c.causal:
        allowed &= kpos[:, :, :, None, :] <= positions[None, :, None, None, None]
    keys, values = cache.keys, cache.values
    x = model.embed(tokens)[:, None, :]                            # [B, 1, D]
    pos = positions[:, None]
    states = [x]
    for i, layer in enumerate(model.layers):
        q, k, v = layer.attn.project(layer.attn_norm(x), pos)      # k, v [B, Hkv, 1, hd]
        keys = keys.at[i, rows, :, slot].set(k[:, :, 0].astype(keys.dtype))
        values = values.at[i, rows, :, slot].set(v[:, :, 0].astype(values.dtype))
        out, _, _ = layer.attn.attend(q, keys[i], values[i], allowed[i], None,
                                      probs=False, colsum=False)
        x = x + out
        x = x + layer.mlp(layer.mlp_norm(x))
        states.append(x)
    logits = model.unembed(x[:, 0])
    advance = jnp.ones((b,), jnp.int32) if active is None else active.astype(jnp.int32)
    cache = KVCache(keys, values, kpos, cache.length + advance)
    return logits, cache, (jnp.stack(states)[:, :, 0] if hidden else None)


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
                 cache=cache, hidden=hidden,
                 tokens=jnp.full((b, max_new), pad_id, jnp.int32).at[:, 0].set(tok),
                 logprobs=jnp.zeros((b, max_new), jnp.float32).at[:, 0].set(lp))

    def cond(c):
        return (c["i"] < max_new) & ~jnp.all(c["done"])

    def body(c):
        i, active = c["i"], ~c["done"]
        logits, cache, h = step(model, c["cache"], c["tok"], lengths + i - 1,
                                active if stop else None, hidden=capture is not None)
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
