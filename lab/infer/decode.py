"""One decoding step on the KV cache, and the jitted decode loop.

A step is :meth:`lab.nn.Transformer.blocks` on one token per row: the model's
own block, with its fused q/k/v and gate/up projections, so the numbers are the
full forward's (the tests hold them to it within 1e-4). The loop carries the
cache as one buffer per layer (:class:`lab.nn.LayerKV`), whose single-token
writes XLA performs in place on the ``while_loop`` carry: a stacked ``[L, ...]``
cache would be sliced and restacked, a copy of the whole cache, every step.

With ``compress_every = N`` the loop also evicts during decoding, as kvpress's
``DecodingPress`` does: it runs ``N`` steps, buffering their queries, then lets
the policy re-score the cache with those queries as the observation window and
keep the prompt's budget, and repeats.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lab.infer import policies as policies_lib
from lab.infer import sampling
from lab.infer.options import Eviction, GenerateOptions
from lab.nn import KVCache, Transformer
from lab.nn.cache import check_cache


def _step(model: Transformer, layers: tuple, length, tokens, positions, active, *,
          hidden: bool = False, queries: bool = False):
    """One token per row on per-layer caches: ``(logits [B, V], layers, length,
    Intermediates)`` (hidden ``[L+1, B, 1, D]`` / queries ``[L, B, H, 1, hd]`` if asked)."""
    key_pos = positions if active is None else jnp.where(active, positions, -1)
    capture = (("hidden",) if hidden else ()) + (("queries",) if queries else ())
    x = model.embed(tokens)[:, None, :]                             # [B, 1, D]
    x, layers, inter = model.blocks(x, positions=positions[:, None],
                                    key_positions=key_pos.astype(jnp.int32)[:, None],
                                    caches=layers, slot=length, capture=capture)
    advance = jnp.ones_like(length) if active is None else active.astype(jnp.int32)
    return model.unembed(x[:, 0]), layers, length + advance, inter


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
    logits, layers, length, inter = _step(model, cache.layers(), cache.length, tokens,
                                          positions, active, hidden=hidden)
    advance = length - cache.length
    new = KVCache.from_layers(layers, length, cache.next_positions + advance)
    return logits, new, (inter.hidden[:, :, 0] if hidden else None)


def _compress(layers, length, next_position, queries, qpos, budget, eviction: Eviction):
    """Re-applies the policy to the per-layer caches with the buffered queries."""
    cache = KVCache.from_layers(layers, length, next_position)
    needs = eviction.needs
    stats = policies_lib.Stats(lengths=next_position, queries=queries, query_positions=qpos)
    if "attn_colsum" in needs:
        stats = stats._replace(
            attn_colsum=policies_lib.window_attention(cache, stats).sum(axis=3),
            query_start=policies_lib.first_position(qpos, next_position))
    if "queries" not in needs:
        stats = stats._replace(queries=None, query_positions=None)
    cache = eviction.policy(cache, stats, budget, **dict(eviction.kwargs))
    cache = policies_lib.resize(cache, eviction.capacity)
    return cache.layers(), cache.length


def loop(model: Transformer, cache: KVCache, first, key, temperature, budget, *,
         opts: GenerateOptions, eviction: Eviction, return_cache: bool = False):
    """Decodes tokens ``1..N-1`` in ``lax.while_loop`` (token 0 is given).

    Args:
      first: ``(token [B], logprob [B], hidden [L+1, B, D])`` of step 0 (from the
        prompt's last position).
      cache: the prompt's cache; token ``i`` is fed at ``cache.next_position + i - 1``.
      budget: ``[B]`` entries per KV head the policy keeps (with ``compress_every``).
      return_cache: feed the last token too and return the cache.

    Returns:
      ``(tokens [B, N], logprobs [B, N], hidden or None, n [B], cache or None)``.
    """
    tok, lp, h0 = first
    b, max_new = tok.shape[0], opts.max_new_tokens
    stop, capture = opts.stop_tokens, (opts.capture[0] if opts.capture else None)
    choose = functools.partial(sampling.choose, temperature=temperature, greedy=opts.greedy,
                               top_k=opts.top_k, top_p=opts.top_p)
    stop_ids = jnp.asarray(stop, jnp.int32)
    every = eviction.compress_every
    start = cache.next_positions

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
                 layers=cache.layers(), length=cache.length, hidden=hidden,
                 tokens=jnp.full((b, max_new), opts.pad_id, jnp.int32).at[:, 0].set(tok),
                 logprobs=jnp.zeros((b, max_new), jnp.float32).at[:, 0].set(lp))
    if every:
        c = model.config
        carry["queries"] = jnp.zeros((c.n_layers, b, c.n_heads, every, c.head_dim),
                                     c.jnp_dtype)
        carry["qpos"] = jnp.full((b, every), -1, jnp.int32)

    def body(cr):
        i, active = cr["i"], ~cr["done"]
        pos = start + i - 1
        logits, layers, length, inter = _step(
            model, cr["layers"], cr["length"], cr["tok"], pos, active if stop else None,
            hidden=capture is not None, queries=bool(every))
        tok, lp = choose(logits, jax.random.fold_in(key, i))
        tok = jnp.where(active, tok, opts.pad_id)
        new = dict(cr, i=i + 1, tok=tok, done=cr["done"] | is_stop(tok), n=cr["n"] + active,
                   layers=layers, length=length,
                   tokens=jax.lax.dynamic_update_slice(cr["tokens"], tok[:, None], (0, i)),
                   logprobs=jax.lax.dynamic_update_slice(
                       cr["logprobs"], jnp.where(active, lp, 0.0)[:, None], (0, i)))
        if capture:
            h = jnp.where(active[:, None], keep(inter.hidden[:, :, 0]), 0)[..., None, :]
            new["hidden"] = jax.lax.dynamic_update_slice_in_dim(cr["hidden"], h, i, axis=-2)
        if every:
            k = (i - 1) % every
            new["queries"] = jax.lax.dynamic_update_slice_in_dim(
                cr["queries"], inter.queries.astype(cr["queries"].dtype), k, axis=3)
            new["qpos"] = jax.lax.dynamic_update_slice_in_dim(
                cr["qpos"], jnp.where(active, pos, -1)[:, None], k, axis=1)
        return new

    def running(cr):
        return (cr["i"] < max_new) & ~jnp.all(cr["done"])

    if not every:
        carry = jax.lax.while_loop(running, body, carry)
    else:
        def chunk(cr):  # `every` steps, then one compression
            end = jnp.minimum(cr["i"] + every, max_new)
            cr = jax.lax.while_loop(lambda c: running(c) & (c["i"] < end), body, cr)
            layers, length = _compress(cr["layers"], cr["length"], start + cr["i"] - 1,
                                       cr["queries"], cr["qpos"], budget, eviction)
            return dict(cr, layers=layers, length=length,
                        qpos=jnp.full_like(cr["qpos"], -1))
        carry = jax.lax.while_loop(running, chunk, carry)

    out_cache = None
    if return_cache:  # the last sampled token of each row, fed so the cache holds it too
        last = jnp.take_along_axis(carry["tokens"], (carry["n"] - 1)[:, None], axis=1)[:, 0]
        _, layers, length, _ = _step(model, carry["layers"], carry["length"], last,
                                     start + carry["n"] - 1, None)
        out_cache = KVCache.from_layers(layers, length, start + carry["n"])
    return carry["tokens"], carry["logprobs"], carry["hidden"], carry["n"], out_cache
