"""Fused RMSNorm (optionally with the residual add before it), as in Llama/Qwen.

``y = x / sqrt(mean(x^2) + eps) * weight``, computed in float32 and cast back
to ``x.dtype``; the same arithmetic as :class:`lab.nn.layers.RMSNorm`. With a
``residual``, the kernel first forms ``h = x + residual`` and returns
``(rmsnorm(h), h)``: the add, the reduction and the scaling are one pass over
memory (the fused-epilogue strategy; compare
``jax.experimental.pallas.ops.gpu.rms_norm``). The grid runs over blocks of
rows; each program holds whole rows, so the feature size ``D`` is one block. A
row count that is not a multiple of ``block_rows`` is zero-padded and cropped.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas import dispatch


def _normalise(h, w, eps):
    hf = h.astype(jnp.float32)
    return hf * jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + eps) * w


def _check(x, weight):
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        raise ValueError(f"rmsnorm needs x [..., D] and weight [D]; got {x.shape} and "
                         f"{weight.shape}")


def reference(x, weight, *, eps: float = 1e-6, residual=None):
    """jnp RMSNorm; with ``residual`` returns ``(rmsnorm(x + residual), x + residual)``."""
    _check(x, weight)
    h = x if residual is None else (x.astype(jnp.float32) + residual).astype(x.dtype)
    y = _normalise(h, weight.astype(jnp.float32), eps).astype(x.dtype)
    return y if residual is None else (y, h)


@functools.partial(jax.jit, static_argnames=("eps", "block_rows", "interpret", "triton"))
def rmsnorm_kernel(x, weight, *, eps: float = 1e-6, residual=None, block_rows: int = 8,
                   interpret: bool = False, triton: bool | None = None):
    """Pallas fused RMSNorm over row blocks; same outputs as :func:`reference`."""
    _check(x, weight)
    if not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"block_rows={block_rows!r}; expected a positive int")
    shape, d = x.shape, x.shape[-1]
    rows = x.reshape(-1, d)
    n = rows.shape[0]
    pad = (-n) % block_rows
    fused = residual is not None
    operands = [jnp.pad(rows, ((0, pad), (0, 0)))]
    if fused:
        res = jnp.broadcast_to(residual, shape).reshape(-1, d)
        operands.append(jnp.pad(res, ((0, pad), (0, 0))))
    operands.append(weight.reshape(1, d))

    def kernel(*refs):
        x_ref, w_ref = refs[0], refs[1 + fused]
        outs = refs[2 + fused:]
        h = x_ref[...]
        if fused:
            h = (h.astype(jnp.float32) + refs[1][...].astype(jnp.float32)).astype(x_ref.dtype)
            outs[1][...] = h
        w = w_ref[...].astype(jnp.float32)
        outs[0][...] = _normalise(h, w, eps).astype(outs[0].dtype)

    row_spec = pl.BlockSpec((block_rows, d), lambda i: (i, 0))
    in_specs = [row_spec] * (1 + fused) + [pl.BlockSpec((1, d), lambda i: (0, 0))]
    out_shape = [jax.ShapeDtypeStruct((n + pad, d), x.dtype)] * (1 + fused)
    params = None
    if (not interpret and dispatch.platform() == "gpu") if triton is None else triton:
        from jax.experimental.pallas import triton as pltriton

        params = pltriton.CompilerParams(num_warps=4, num_stages=1)
    outs = pl.pallas_call(kernel, out_shape=out_shape, grid=((n + pad) // block_rows,),
                          in_specs=in_specs, out_specs=[row_spec] * (1 + fused),
                          interpret=interpret, compiler_params=params,
                          name="lab_rmsnorm")(*operands)
    outs = [o[:n].reshape(shape) for o in outs]
    return (outs[0], outs[1]) if fused else outs[0]


def rmsnorm(x, weight, *, eps: float = 1e-6, residual=None, block_rows: int = 8,
            impl: str | None = None):
    """Dispatching fused RMSNorm (kernel on GPU/TPU or with ``impl="pallas"``, XLA otherwise)."""
    fn, chosen = dispatch.select(functools.partial(rmsnorm_kernel, block_rows=block_rows),
                                 reference, impl)
    return fn(x, weight, eps=eps, residual=residual)
