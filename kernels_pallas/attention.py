"""Attention: the reference in jnp (the Pallas flash kernel is added beside it).

Layout (head-major, like the KV cache): ``q [B, H, T, D]``, ``k, v [B, Hkv, S, D]``
with ``H`` a multiple of ``Hkv`` (grouped-query attention: query head ``h``
reads KV head ``h // (H // Hkv)``). ``mask`` is boolean, True = attend,
broadcastable to ``[B, Hm, T, S]`` with ``Hm`` in ``{1, Hkv, H}`` (a per-KV-head
mask is what an evicted cache needs). ``bias`` is additive, broadcastable to
``[B, H, T, S]``. A query row with no allowed key returns zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def expand_heads(x: jax.Array | None, n_heads: int) -> jax.Array | None:
    """Broadcasts a ``[B, Hm, ...]`` mask/bias with Hm in {1, Hkv, H} to H heads."""
    if x is None or x.ndim < 4:
        return x
    hm = x.shape[1]
    if hm in (1, n_heads):
        return x
    if n_heads % hm:
        raise ValueError(f"mask/bias head axis {hm} does not divide n_heads={n_heads}")
    return jnp.repeat(x, n_heads // hm, axis=1)


def reference(q, k, v, *, mask=None, bias=None, sm_scale=None, return_probs=False,
              return_colsum=False):
    """Softmax attention in float32 with GQA, mask and bias.

    Returns:
      ``out [B, H, T, D]`` in ``q.dtype``; with ``return_colsum`` also the
      column sums of the probabilities over queries ``[B, H, S]``; with
      ``return_probs`` also the probabilities ``[B, H, T, S]`` (float32).
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    if h % hkv:
        raise ValueError(f"n_heads={h} is not a multiple of n_kv_heads={hkv}")
    scale = d ** -0.5 if sm_scale is None else sm_scale
    qf = q.astype(jnp.float32).reshape(b, hkv, h // hkv, t, d)
    logits = jnp.einsum("bkgtd,bksd->bkgts", qf, k.astype(jnp.float32)) * scale
    logits = logits.reshape(b, h, t, -1)
    if bias is not None:
        logits = logits + expand_heads(jnp.asarray(bias, jnp.float32), h)
    if mask is not None:
        m = expand_heads(jnp.asarray(mask, bool), h)
        logits = jnp.where(m, logits, NEG_INF)
    mx = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.exp(logits - mx)
    if mask is not None:
        p = jnp.where(m, p, 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    probs = p / jnp.where(denom == 0, 1.0, denom)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs.reshape(b, hkv, h // hkv, t, -1),
                     v.astype(jnp.float32)).reshape(b, h, t, d).astype(q.dtype)
    extras = []
    if return_colsum:
        extras.append(probs.sum(axis=2))
    if return_probs:
        extras.append(probs)
    return (out, *extras) if extras else out


def attention(q, k, v, *, mask=None, bias=None, sm_scale=None, return_colsum=False,
              impl: str | None = None):
    """Dispatching entry point (the Pallas kernel lands here; the reference until then)."""
    del impl
    return reference(q, k, v, mask=mask, bias=bias, sm_scale=sm_scale, return_colsum=return_colsum)
