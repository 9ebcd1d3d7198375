"""Small building blocks of the decoder: RMSNorm, rotary embeddings, SwiGLU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
    """RMSNorm as in Llama/Qwen: ``x / rms(x) * weight``, computed in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * self.weight[...].astype(jnp.float32)).astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float) -> jax.Array:
    """Inverse frequencies ``theta ** (-2i / head_dim)`` (Hugging Face's default rope)."""
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotates ``x [B, T, H, D]`` by ``positions [B, T]`` (rotate-half convention of HF Llama).

    Positions may be any integers (an evicted cache keeps original positions).
    """
    d = x.shape[-1]
    angles = positions.astype(jnp.float32)[..., None] * rope_frequencies(d, theta)  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class SwiGLU(nnx.Module):
    """``down(silu(gate(x)) * up(x))`` without biases."""

    def __init__(self, d_model: int, d_ff: int, *, dtype, init_std: float, rngs: nnx.Rngs):
        init = nnx.initializers.normal(init_std)
        kw = dict(use_bias=False, param_dtype=dtype, dtype=dtype, kernel_init=init, rngs=rngs)
        self.gate = nnx.Linear(d_model, d_ff, **kw)
        self.up = nnx.Linear(d_model, d_ff, **kw)
        self.down = nnx.Linear(d_ff, d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        # Matmuls on [B*T, D] rather than [B, T, D]: XLA's CPU backward of a batched
        # dot_general is about twice as slow as a plain 2-D one (benchmarks/train.py).
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x)).reshape(*shape[:-1], -1)


def causal_smear(x: jax.Array, positions: jax.Array, weights: jax.Array,
                 prev: jax.Array, prev_positions: jax.Array,
                 src_positions: jax.Array | None = None) -> jax.Array:
    """Depthwise causal smear over the previous tokens of the same sequence.

    ``out[t] = x[t] + sum_i weights[i-1] * x[u]`` over lags ``i = 1..S``, where
    ``u`` is the token at position ``positions[t] - i`` of the same row. The
    previous tokens come from ``prev [B, S, H, D]`` (a decode cache's tail, at
    ``prev_positions [B, S]``, -1 = none) followed by ``x [B, T, H, D]`` itself;
    a lag whose token is missing (an example's start in a packed row, padding,
    an empty tail slot) adds nothing, so packing and padding stay exact. The
    row's tokens must be contiguous in ``[prev, x]`` (right padding).

    Args:
      weights: ``[S, H, D]``, one weight per lag, head and channel.
      src_positions: ``[B, T]`` positions of ``x`` as a source (-1 = padding, never
        mixed in); default ``positions``.
    """
    s, t = weights.shape[0], x.shape[1]
    src = positions if src_positions is None else src_positions
    xa = jnp.concatenate([prev.astype(x.dtype), x], axis=1)
    pa = jnp.concatenate([prev_positions, src], axis=1)
    out = x
    for i in range(1, s + 1):
        shifted, pos = xa[:, s - i:s - i + t], pa[:, s - i:s - i + t]
        ok = (pos >= 0) & (pos == positions - i)
        out = out + jnp.where(ok[..., None, None], weights[i - 1].astype(x.dtype) * shifted, 0)
    return out


def last_tokens(prev: jax.Array, prev_positions: jax.Array, x: jax.Array,
                positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ``S`` latest tokens of ``[prev, x]`` per row by position (the new tail):
    ``([B, S, ...], positions [B, S])`` in increasing position, -1 (and zeros) where
    the row has fewer than ``S`` valid tokens. ``positions`` -1 marks padding."""
    s = prev.shape[1]
    xa = jnp.concatenate([prev, x.astype(prev.dtype)], axis=1)
    pa = jnp.concatenate([prev_positions, positions], axis=1)
    _, idx = jax.lax.top_k(pa, s)                      # largest positions first
    idx = idx[:, ::-1]
    pos = jnp.take_along_axis(pa, idx, axis=1)
    pos = jnp.where(pos >= 0, pos, -1)
    take = idx.reshape(idx.shape + (1,) * (xa.ndim - 2))
    out = jnp.take_along_axis(xa, take, axis=1)
    out = jnp.where((pos >= 0).reshape(pos.shape + (1,) * (xa.ndim - 2)), out, 0)
    return out, pos
