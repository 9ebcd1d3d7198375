"""Small building blocks of the decoder: RMSNorm, LayerNorm, rotary embeddings (1-D,
multimodal M-RoPE, 2-D axial), fused projections, SwiGLU, the GELU MLP of a ViT, and the
causal q/k smear."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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


class LayerNorm(nnx.Module):
    """LayerNorm with scale and bias, ``(x - mean) / sqrt(var + eps) * weight + bias``,
    computed in float32 (the two-pass variance of ``torch.nn.LayerNorm``)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
        xf = xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + self.eps)
        out = xf * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return out.astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float) -> jax.Array:
    """Inverse frequencies ``theta ** (-2i / head_dim)`` (Hugging Face's default rope)."""
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def rope_angles(positions: jax.Array, head_dim: int, theta: float) -> jax.Array:
    """Rotary angles ``[..., head_dim / 2]`` of integer ``positions [...]`` (1-D RoPE)."""
    return positions.astype(jnp.float32)[..., None] * rope_frequencies(head_dim, theta)


def mrope_angles(positions: jax.Array, head_dim: int, theta: float,
                 section: tuple[int, int, int]) -> jax.Array:
    """Qwen3-VL's interleaved M-RoPE angles ``[B, T, head_dim / 2]`` of ``positions [3, B, T]``
    (temporal, height, width rows).

    Frequency ``j`` turns with the height position when ``j % 3 == 1`` and ``j < 3 *
    section[1]``, with the width position when ``j % 3 == 2`` and ``j < 3 * section[2]``,
    and with the temporal one otherwise (``Qwen3VLTextRotaryEmbedding``); equal rows give
    :func:`rope_angles` of that row.
    """
    axis = np.zeros(head_dim // 2, np.int32)
    axis[1:3 * section[1]:3] = 1
    axis[2:3 * section[2]:3] = 2
    ang = rope_angles(positions, head_dim, theta)                    # [3, B, T, D/2]
    return sum(jnp.where(jnp.asarray(axis == a), ang[a], 0.0) for a in range(3))


def axial_angles(rows: jax.Array, cols: jax.Array, head_dim: int, theta: float) -> jax.Array:
    """2-D (axial) rotary angles ``[..., head_dim / 2]`` of patch ``rows`` and ``cols``: the
    first half of the frequencies turn with the row, the second with the column, each
    half the frequencies of a ``head_dim / 2`` RoPE (Qwen3-VL's vision rotary)."""
    half = head_dim // 2
    return jnp.concatenate([rope_angles(rows, half, theta), rope_angles(cols, half, theta)],
                           axis=-1)


def rotate(x: jax.Array, angles: jax.Array) -> jax.Array:
    """Rotates ``x [B, T, H, D]`` by ``angles [B, T, D/2]`` (the rotate-half convention of HF
    Llama: channel ``i`` pairs with ``i + D/2``)."""
    d = x.shape[-1]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotates ``x [B, T, H, D]`` by ``positions [B, T]`` (rotate-half convention of HF Llama).

    Positions may be any integers (an evicted cache keeps original positions).
    """
    return rotate(x, rope_angles(positions, x.shape[-1], theta))


class Fused(nnx.Module):
    """Several bias-optional projections of the same input in one matmul.

    ``kernel [D, *out_shape]``: ``x [..., D] -> [..., *out_shape]``. The attention's
    q/k/v (``out_shape = (Hkv, G + 2, hd)``, grouped by KV head) and the MLP's
    gate/up (``(2, F)``) are each one of these, so the forward, cached decoding and
    training all run one matmul where three (or two) separate ``Linear`` would run;
    ``lab.hf`` splits them back into Hugging Face's ``q_proj``/``k_proj``/... tensors.
    ``kernel`` and ``bias`` are given (built from their parts' initialisations).
    """

    def __init__(self, kernel: jax.Array, bias: jax.Array | None = None, *, dtype,
                 dot_general=jax.lax.dot_general):
        self.kernel = nnx.Param(kernel)
        self.bias = nnx.Param(bias) if bias is not None else nnx.data(None)
        self.dtype = dtype
        self.dot_general = dot_general  # as nnx.Linear's (mixed precision swaps it)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        d, out = kernel.shape[0], kernel.shape[1:]
        # One 2-D matmul on [B*T, D] x [D, prod(out)]: XLA's CPU backward of a batched
        # dot_general is about twice as slow as a plain 2-D one (docs/benchmarks.md).
        y = self.dot_general(x.reshape(-1, d).astype(self.dtype),
                             kernel.reshape(d, -1).astype(self.dtype), (((1,), (0,)), ((), ())))
        y = y.reshape(*x.shape[:-1], *out)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


def normal_kernels(rngs: nnx.Rngs, std: float, d: int, widths, dtype) -> list[jax.Array]:
    """``[D, w]`` kernels drawn in order with one ``rngs.params()`` key each, as the same
    number of ``nnx.Linear(d, w)`` would draw them (so a fused model starts from the
    weights its unfused form had)."""
    init = nnx.initializers.normal(std)
    return [init(rngs.params(), (d, w), dtype) for w in widths]


class SwiGLU(nnx.Module):
    """``down(silu(gate(x)) * up(x))`` without biases; gate and up are one fused matmul
    (``gate_up.kernel [D, 2, F]``: ``[:, 0]`` gate, ``[:, 1]`` up)."""

    def __init__(self, d_model: int, d_ff: int, *, dtype, init_std: float, rngs: nnx.Rngs):
        gate, up = normal_kernels(rngs, init_std, d_model, (d_ff, d_ff), dtype)
        self.gate_up = Fused(jnp.stack([gate, up], axis=1), dtype=dtype)
        self.down = nnx.Linear(d_ff, d_model, use_bias=False, param_dtype=dtype, dtype=dtype,
                               kernel_init=nnx.initializers.normal(init_std), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        shape = x.shape
        gu = self.gate_up(x.reshape(-1, shape[-1]))                  # [N, 2, F]
        return self.down(jax.nn.silu(gu[:, 0]) * gu[:, 1]).reshape(*shape[:-1], -1)

    def neurons(self, x: jax.Array) -> jax.Array:
        """The neurons' activations ``silu(gate(x)) * up(x)`` ``[..., F]`` (what ``down``
        reads; :meth:`__call__` is ``project(neurons(x))``)."""
        gu = self.gate_up(x.reshape(-1, x.shape[-1]))
        return (jax.nn.silu(gu[:, 0]) * gu[:, 1]).reshape(*x.shape[:-1], -1)

    def project(self, h: jax.Array) -> jax.Array:
        """``down(h)`` of activations ``h [..., F]`` -> ``[..., D]``."""
        return self.down(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:-1], -1)


class GeluMLP(nnx.Module):
    """``fc2(gelu(fc1(x)))`` with biases: a ViT's MLP (Qwen3-VL's ``Qwen3VLVisionMLP``);
    ``approximate``: the tanh GELU (Hugging Face's ``gelu_pytorch_tanh``), else erf."""

    def __init__(self, d_model: int, d_ff: int, *, approximate: bool, dtype, init_std: float,
                 rngs: nnx.Rngs):
        init = nnx.initializers.normal(init_std)
        self.fc1 = nnx.Linear(d_model, d_ff, param_dtype=dtype, dtype=dtype, kernel_init=init,
                              rngs=rngs)
        self.fc2 = nnx.Linear(d_ff, d_model, param_dtype=dtype, dtype=dtype, kernel_init=init,
                              rngs=rngs)
        self.approximate = approximate

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.approximate))

    def neurons(self, x: jax.Array) -> jax.Array:
        """The neurons' activations ``gelu(fc1(x))`` ``[..., F]`` (what ``fc2`` reads)."""
        return jax.nn.gelu(self.fc1(x), approximate=self.approximate)

    def project(self, h: jax.Array) -> jax.Array:
        """``fc2(h)`` of activations ``h [..., F]``."""
        return self.fc2(h)


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
