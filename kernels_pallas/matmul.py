"""Tiled matmul driven by a strategy configuration, and its block-scaled low-precision variant.

``matmul(a, b, bias=, activation=, scale=, config=)`` computes
``activation(scale * (a @ b) + bias)`` with float32 accumulation. The
:class:`MatmulConfig` carries the strategies of Hawkeye's taxonomy that apply to
a GEMM: tile sizes (tiling for the memory hierarchy), ``num_stages`` (software
pipelining depth; Triton's ``num_stages`` on GPU), ``num_warps``, ``split_k``
(parallel partial sums over K, reduced afterwards), ``group_m`` / ``grid_order``
(grid swizzling for L2 reuse, the grouped ordering of Triton's matmul
tutorial), the fused epilogue and ``backend``: ``"triton"`` (this module's kernel, lowered
through Pallas' Triton backend on NVIDIA and AMD GPUs) or a Mosaic GPU path,
``"mosaic_hopper"`` / ``"mosaic_blackwell"``: JAX's expert Mosaic GPU matmuls
(``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu`` and ``blackwell_matmul_mgpu``),
whose operand tiles reach shared memory by TMA bulk tensor copies issued by a producer
warp(group) while consumer warpgroups (Hopper: wgmma, with ``setmaxnreg`` register
reallocation) or an MMA warp (Blackwell: tcgen05 into tensor memory) compute. Those two
kernels have no epilogue hook and store the product in the operand dtype, so with a
Mosaic backend the epilogue runs as XLA ops afterwards (``fuse_epilogue`` must be off),
``num_stages`` is their ``max_concurrent_steps`` (TMA copies in flight), ``split_k``,
``group_m`` and ``grid_order`` must keep their defaults, and the shapes must divide into
the CTA tiles (Hopper's CTA is ``block_m x 2*block_n``: two consumer warpgroups).
The Triton kernel follows the structure of ``jax.experimental.pallas.ops.gpu`` kernels:
a grid over output tiles, a ``fori_loop`` over K inside, ``pl.ds`` slices of the K panel.

``scaled_matmul(qa, qb, ...)`` multiplies two :class:`~kernels_pallas.lowp.QuantizedArray`
operands (``a [M, K]`` quantised along K, ``b [K, N]`` quantised along K, i.e.
``axis=0``) without materialising the dequantised matrices: FP4 codes are
decoded and scaled per block inside the kernel. Its reference is
dequantise-then-matmul.

Shapes that are not multiples of the tile sizes are zero-padded and the
output cropped (zeros do not change a sum); ``split_k`` must divide the
number of K tiles or ``ValueError`` says so.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas import dispatch, lowp

ACTIVATIONS = {
    None: lambda x: x,
    "none": lambda x: x,
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
}
GRID_ORDERS = ("mn", "nm")
BACKENDS = ("triton", "mosaic_hopper", "mosaic_blackwell")
_STATIC = ("activation", "scale", "out_dtype", "config", "interpret", "triton")


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    """One point of the GEMM strategy space (see the module docstring)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_stages: int = 2
    num_warps: int = 4
    split_k: int = 1
    group_m: int = 1
    grid_order: str = "mn"
    backend: str = "triton"

    def validate(self) -> MatmulConfig:
        for f in ("block_m", "block_n", "block_k", "num_stages", "num_warps", "split_k",
                  "group_m"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"MatmulConfig.{f}={v!r}; expected a positive int")
        if self.grid_order not in GRID_ORDERS:
            raise ValueError(f"MatmulConfig.grid_order={self.grid_order!r}; expected one of "
                             f"{GRID_ORDERS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"MatmulConfig.backend={self.backend!r}; expected one of {BACKENDS}")
        if self.backend != "triton":
            fixed = {"split_k": 1, "group_m": 1, "grid_order": "mn"}
            bad = {f: getattr(self, f) for f, v in fixed.items() if getattr(self, f) != v}
            if bad:
                raise ValueError(f"MatmulConfig.backend={self.backend!r} with {bad}; the Mosaic "
                                 f"GPU kernels expect {fixed}")
        return self

    def cta_tile(self) -> tuple[int, int]:
        """Output rows x columns one program (CTA) computes."""
        if self.backend == "mosaic_hopper":   # two consumer warpgroups side by side along N
            return self.block_m, 2 * self.block_n
        return self.block_m, self.block_n


def tile_coords(t, n_m: int, n_n: int, group_m: int, grid_order: str):
    """Output tile ``(i, j)`` of linear program ``t`` under grouped (swizzled) ordering.

    With ``group_m = 1`` and ``grid_order="mn"`` this is row-major order; larger
    groups walk ``group_m`` tile rows column by column so that consecutive
    programs share B panels (Triton matmul tutorial, "L2 cache optimizations").
    """
    if grid_order == "nm":
        j, i = tile_coords(t, n_n, n_m, group_m, "mn")
        return i, j
    per_group = group_m * n_n
    first = (t // per_group) * group_m
    size = jnp.minimum(n_m - first, group_m)
    return first + (t % per_group) % size, (t % per_group) // size


def _epilogue(acc, bias, scale, activation):
    """``activation(scale * acc + bias)``; ``scale`` is a Python float fixed at compile time."""
    if scale is not None:
        if not isinstance(scale, (int, float)):
            raise ValueError(f"scale={scale!r}; expected a Python float (a compile-time "
                             "epilogue constant)")
        acc = acc * scale
    if bias is not None:
        acc = acc + bias
    return ACTIVATIONS[activation](acc)


def _pad_to(x, axis: int, multiple: int):
    r = x.shape[axis] % multiple
    if r == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, multiple - r)
    return jnp.pad(x, widths)


def _compiler_params(config: MatmulConfig, interpret: bool, triton: bool | None = None):
    """Triton compiler parameters when compiling for a GPU (``triton=True`` forces them, which
    lets a CPU host lower the kernel for CUDA with ``lowering_platforms=("cuda",)``)."""
    use = (not interpret and dispatch.platform() == "gpu") if triton is None else triton
    if not use:
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def _check_operands(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs a [M, K] and b [K, N]; got {a.shape} and {b.shape}")


@functools.partial(jax.jit, static_argnames=("activation", "scale", "out_dtype"))
def reference(a, b, *, bias=None, activation=None, scale=None, out_dtype=None):
    """``activation(scale * (a @ b) + bias)``, float32 accumulation: the XLA baseline."""
    _check_operands(a, b)
    acc = jnp.dot(a, b, preferred_element_type=jnp.float32)
    out = _epilogue(acc, None if bias is None else bias.astype(jnp.float32), scale, activation)
    return out.astype(out_dtype or a.dtype)


@functools.partial(jax.jit, static_argnames=_STATIC)
def matmul_kernel(a, b, *, bias=None, activation=None, scale=None, out_dtype=None,
                  config: MatmulConfig | None = None, interpret: bool = False,
                  triton: bool | None = None):
    """The Pallas tiled matmul; same result as :func:`reference` (float32 accumulation)."""
    _check_operands(a, b)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}; expected one of "
                         f"{sorted(map(str, ACTIVATIONS))}")
    cfg = (config or MatmulConfig()).validate()
    out_dtype = out_dtype or a.dtype
    if cfg.backend != "triton":
        out = mosaic_matmul(a, b, cfg, interpret)
        bias_v = None if bias is None else bias.astype(jnp.float32)
        return _epilogue(out.astype(jnp.float32), bias_v, scale, activation).astype(out_dtype)
    m, n = a.shape[0], b.shape[1]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    ap = _pad_to(_pad_to(a, 0, bm), 1, bk)
    bp = _pad_to(_pad_to(b, 0, bk), 1, bn)
    mp, kp = ap.shape
    np_ = bp.shape[1]
    n_m, n_n, n_k = mp // bm, np_ // bn, kp // bk
    if n_k % cfg.split_k:
        raise ValueError(f"split_k={cfg.split_k} does not divide the {n_k} K tiles "
                         f"(K={a.shape[1]}, block_k={bk})")
    k_steps = n_k // cfg.split_k
    kspan = k_steps * bk
    coords = functools.partial(tile_coords, n_m=n_m, n_n=n_n, group_m=cfg.group_m,
                               grid_order=cfg.grid_order)
    fused = cfg.split_k == 1
    has_bias = bias is not None and fused

    def kernel(a_ref, b_ref, *rest):
        o_ref = rest[-1]

        def body(k, acc):
            ks = pl.ds(pl.multiple_of(k * bk, bk), bk)
            return acc + jnp.dot(a_ref[:, ks], b_ref[ks, :], preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, k_steps, body, jnp.zeros((bm, bn), jnp.float32))
        if fused:
            bias_v = rest[0][...].astype(jnp.float32) if has_bias else None
            o_ref[...] = _epilogue(acc, bias_v, scale, activation).astype(o_ref.dtype)
        else:
            o_ref[0] = acc

    in_specs = [pl.BlockSpec((bm, kspan), lambda t, s: (coords(t)[0], s)),
                pl.BlockSpec((kspan, bn), lambda t, s: (s, coords(t)[1]))]
    operands = [ap, bp]
    if has_bias:
        operands.append(_pad_to(jnp.broadcast_to(bias, (n,)).reshape(1, n), 1, bn))
        in_specs.append(pl.BlockSpec((1, bn), lambda t, s: (0, coords(t)[1])))
    if fused:
        out_shape = jax.ShapeDtypeStruct((mp, np_), out_dtype)
        out_spec = pl.BlockSpec((bm, bn), lambda t, s: coords(t))
    else:
        out_shape = jax.ShapeDtypeStruct((cfg.split_k, mp, np_), jnp.float32)
        out_spec = pl.BlockSpec((1, bm, bn), lambda t, s: (s, *coords(t)))
    out = pl.pallas_call(kernel, out_shape=out_shape, grid=(n_m * n_n, cfg.split_k),
                         in_specs=in_specs, out_specs=out_spec, interpret=interpret,
                         compiler_params=_compiler_params(cfg, interpret, triton),
                         name="lab_matmul")(*operands)
    if not fused:
        bias_v = None if bias is None else _pad_to(jnp.broadcast_to(bias, (n,)), 0, bn)
        out = _epilogue(out.sum(0), None if bias_v is None else bias_v.astype(jnp.float32),
                        scale, activation).astype(out_dtype)
    return out[:m, :n]


def mosaic_matmul(a, b, config: MatmulConfig, interpret: bool = False):
    """``a @ b`` by JAX's expert Mosaic GPU kernel named by ``config.backend`` (module
    docstring), stored in the operand dtype. ``interpret=True`` runs it in JAX's GPU
    interpreter (shared memory, barriers, TMA copies and warpgroups simulated on the host;
    jax 0.10's interpreter does not simulate Blackwell's tensor memory and raises
    ``NotImplementedError`` for that path; on a Blackwell GPU it compiles and runs)."""
    m, k = a.shape
    n = b.shape[1]
    if a.dtype != b.dtype or a.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"backend={config.backend!r} needs bfloat16 or float16 operands of one "
                         f"dtype; got {a.dtype} and {b.dtype}")
    tm, tn = config.cta_tile()
    if m % tm or n % tn or k % config.block_k:
        raise ValueError(f"backend={config.backend!r}: shape M={m}, N={n}, K={k} must divide "
                         f"into CTA tiles {tm}x{tn} and block_k={config.block_k}")
    import contextlib
    from unittest import mock

    if config.backend == "mosaic_hopper":
        from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as mod

        cfg = mod.TuningConfig(tile_m=config.block_m, tile_n=config.block_n,
                               tile_k=config.block_k, max_concurrent_steps=config.num_stages,
                               epi_tile_n=None, epi_tile_m=None)
        run = lambda: mod.matmul(a, b, None, cfg)  # noqa: E731
    else:
        from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as mod

        cfg = mod.TuningConfig(tile_m=config.block_m, tile_n=config.block_n,
                               tile_k=config.block_k, max_concurrent_steps=config.num_stages,
                               collective=False, epilogue_tile_n=min(64, config.block_n))
        run = lambda: mod.matmul_kernel(a, b, cfg)  # noqa: E731
    with contextlib.ExitStack() as stack:
        if interpret or dispatch.platform() != "gpu":
            # the persistent grid reads the SM count from a GPU; a host without one (GPU
            # interpreter, or lowering for CUDA from a CPU) gets one SM
            if hasattr(mod, "get_num_sms"):
                stack.enter_context(mock.patch.object(mod, "get_num_sms", lambda: 1))
        if interpret:
            from jax._src.pallas.mosaic_gpu.interpret.params import force_gpu_interpret_mode

            stack.enter_context(force_gpu_interpret_mode())
        return run()


def matmul(a, b, *, bias=None, activation=None, scale=None, out_dtype=None,
           config: MatmulConfig | None = None, impl: str | None = None):
    """Dispatching matmul: the Pallas kernel on GPU/TPU or with ``impl="pallas"``, XLA otherwise."""
    fn, chosen = dispatch.select(functools.partial(matmul_kernel, config=config), reference, impl)
    return fn(a, b, bias=bias, activation=activation, scale=scale, out_dtype=out_dtype)


# ----------------------------------------------------------------------------- block-scaled


def _check_quantized(qa: lowp.QuantizedArray, qb: lowp.QuantizedArray):
    if qa.fmt != qb.fmt:
        raise ValueError(f"operands have formats {qa.fmt!r} and {qb.fmt!r}; expected the same")
    if len(qa.shape) != 2 or len(qb.shape) != 2 or qa.shape[1] != qb.shape[0]:
        raise ValueError(f"scaled_matmul needs a [M, K] and b [K, N]; got {qa.shape}, {qb.shape}")
    if qa.axis != 1 or qb.axis != 0:
        raise ValueError(f"a must be quantised along axis 1 and b along axis 0 (K); got "
                         f"axis={qa.axis} and axis={qb.axis}")


def scaled_reference(qa, qb, *, bias=None, activation=None, scale=None,
                     out_dtype=jnp.float32):
    """Dequantise both operands, then :func:`reference` in float32."""
    _check_quantized(qa, qb)
    return reference(qa.dequantize(), qb.dequantize(), bias=bias, activation=activation,
                     scale=scale, out_dtype=out_dtype)


def _row_scale(q: lowp.QuantizedArray, rows: int):
    if q.fmt == "bf16":
        return jnp.ones((rows, 1), jnp.float32)
    if q.fmt.startswith("fp8"):
        return jnp.broadcast_to(jnp.reshape(q.scales, (-1, 1)), (rows, 1)).astype(jnp.float32)
    return jnp.broadcast_to(jnp.reshape(q.tensor_scale if q.fmt == "nvfp4" else 1.0, (1, 1)),
                            (rows, 1)).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=_STATIC)
def scaled_matmul_kernel(qa, qb, *, bias=None, activation=None, scale=None,
                         out_dtype=jnp.float32, config: MatmulConfig | None = None,
                         interpret: bool = False, triton: bool | None = None):
    """Pallas block-scaled matmul: in-kernel FP4 decode and per-block scaling, f32 accumulate.

    Tensor/row scales (FP8 per-tensor or per-row, NVFP4 tensor scales) are
    applied in the fused epilogue; MX/NV block scales per K block in the loop.
    """
    _check_quantized(qa, qb)
    cfg = (config or MatmulConfig()).validate()
    m, n = qa.shape[0], qb.shape[1]
    fmt = qa.format
    bm, bn = cfg.block_m, cfg.block_n
    packed = fmt.block > 0
    bk = fmt.block if packed else cfg.block_k
    a_data = _pad_to(qa.data, 0, bm)
    b_data = _pad_to(qb.data, 0, bn)  # b is stored [N, K(/2)]
    if not packed:
        a_data, b_data = _pad_to(a_data, 1, bk), _pad_to(b_data, 1, bk)
    mp, np_ = a_data.shape[0], b_data.shape[0]
    kw = a_data.shape[1]  # storage width along K
    step = bk // 2 if packed else bk
    k_steps = kw // step
    ra, rb = _pad_to(_row_scale(qa, m), 0, bm), _pad_to(_row_scale(qb, n), 0, bn).reshape(1, -1)
    n_m, n_n = mp // bm, np_ // bn
    coords = functools.partial(tile_coords, n_m=n_m, n_n=n_n, group_m=cfg.group_m,
                               grid_order=cfg.grid_order)
    nt = (((1,), (1,)), ((), ()))  # contract the K axes of [bm, k] and [bn, k]

    def kernel(a_ref, b_ref, sa_ref, sb_ref, ra_ref, rb_ref, *rest):
        o_ref = rest[-1]

        def body(k, acc):
            ks = pl.ds(k * step, step)
            if not packed:
                return acc + jax.lax.dot_general(a_ref[:, ks], b_ref[:, ks], nt,
                                                 preferred_element_type=jnp.float32)
            sa = _block_scale(sa_ref[:, pl.ds(k, 1)], fmt.name)  # [bm, 1]
            sb = _block_scale(sb_ref[:, pl.ds(k, 1)], fmt.name)  # [bn, 1]
            a_lo, a_hi = lowp.unpack_fp4(a_ref[:, ks])
            b_lo, b_hi = lowp.unpack_fp4(b_ref[:, ks])
            dec = lowp.decode_e2m1
            f32 = jnp.float32
            part = (jax.lax.dot_general(dec(a_lo), dec(b_lo), nt, preferred_element_type=f32)
                    + jax.lax.dot_general(dec(a_hi), dec(b_hi), nt, preferred_element_type=f32))
            return acc + part * sa * sb.reshape(1, bn)

        acc = jax.lax.fori_loop(0, k_steps, body, jnp.zeros((bm, bn), jnp.float32))
        acc = acc * ra_ref[...] * rb_ref[...]
        bias_v = rest[0][...].astype(jnp.float32) if len(rest) > 1 else None
        o_ref[...] = _epilogue(acc, bias_v, scale, activation).astype(o_ref.dtype)

    if packed:
        sa_arr = _pad_to(jax.lax.bitcast_convert_type(qa.scales, jnp.uint8), 0, bm)
        sb_arr = _pad_to(jax.lax.bitcast_convert_type(qb.scales, jnp.uint8), 0, bn)
    else:  # fp8/bf16 carry no block scales: zero arrays of the same rank, never read,
        # let both cases share one kernel signature
        sa_arr, sb_arr = jnp.zeros((mp, 1), jnp.uint8), jnp.zeros((np_, 1), jnp.uint8)
    in_specs = [pl.BlockSpec((bm, kw), lambda t: (coords(t)[0], 0)),
                pl.BlockSpec((bn, kw), lambda t: (coords(t)[1], 0)),
                pl.BlockSpec((bm, sa_arr.shape[1]), lambda t: (coords(t)[0], 0)),
                pl.BlockSpec((bn, sb_arr.shape[1]), lambda t: (coords(t)[1], 0)),
                pl.BlockSpec((bm, 1), lambda t: (coords(t)[0], 0)),
                pl.BlockSpec((1, bn), lambda t: (0, coords(t)[1]))]
    operands = [a_data, b_data, sa_arr, sb_arr, ra, rb]
    if bias is not None:
        operands.append(_pad_to(jnp.broadcast_to(bias, (n,)).reshape(1, n), 1, bn))
        in_specs.append(pl.BlockSpec((1, bn), lambda t: (0, coords(t)[1])))
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
                         grid=(n_m * n_n,), in_specs=in_specs,
                         out_specs=pl.BlockSpec((bm, bn), coords), interpret=interpret,
                         compiler_params=_compiler_params(cfg, interpret, triton),
                         name=f"lab_scaled_matmul_{fmt.name}")(*operands)
    return out[:m, :n]


def _block_scale(codes_u8, fmt: str):
    """Per-block scale codes (uint8 view) -> float32: E8M0 for mxfp4, E4M3 for nvfp4."""
    if fmt == "mxfp4":
        return lowp.e8m0_to_f32(codes_u8)
    return jax.lax.bitcast_convert_type(codes_u8, jnp.float8_e4m3fn).astype(jnp.float32)


def scaled_matmul(qa, qb, *, bias=None, activation=None, scale=None, out_dtype=jnp.float32,
                  config: MatmulConfig | None = None, impl: str | None = None):
    """Dispatching block-scaled matmul (kernel on GPU/TPU or ``impl="pallas"``, else reference)."""
    fn, _ = dispatch.select(functools.partial(scaled_matmul_kernel, config=config),
                            scaled_reference, impl)
    return fn(qa, qb, bias=bias, activation=activation, scale=scale, out_dtype=out_dtype)
