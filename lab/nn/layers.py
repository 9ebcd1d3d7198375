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
