"""Low-precision formats: BF16, FP8 (E4M3/E5M2), MXFP4 and NVFP4, with exact numpy references.

``quantize(x, fmt, axis=-1)`` returns a :class:`QuantizedArray` (a pytree) whose
``dequantize()`` gives float32 back. The quantised axis (the reduction axis of
a matmul) is moved last in storage. Formats:

- ``bf16``: a round-to-nearest-even cast, no scale.
- ``fp8_e4m3`` / ``fp8_e5m2``: ``scale = amax * (1 / fmax)`` per tensor
  (``scaling="tensor"``, default) or per row (``scaling="row"``: one scale per
  slice along ``axis``), values ``clip(x / scale, -fmax, fmax)`` cast RNE.
- ``mxfp4`` (OCP Microscaling Formats v1.0, section 6.3): blocks of 32 along
  ``axis``, E2M1 elements, a shared E8M0 scale ``X = 2^(floor(log2(amax)) - 2)``
  (2 = emax of E2M1), exponent clamped to [-127, 127]; elements ``x / X``
  rounded to nearest even and saturated at +-6.
- ``nvfp4`` (NVIDIA's NVFP4 recipe, as in Transformer Engine): blocks of 16,
  a float32 tensor scale ``g = amax / (448 * 6)``, E4M3 block scales
  ``fp8(amax_b * (1/6) / g)``, elements ``x / (s_b * g)`` RNE, saturated at +-6.

FP4 codes are packed two per byte (``uint8``): element ``2i`` in the low
nibble, ``2i + 1`` in the high nibble (the order of PyTorch's
``float4_e2m1fn_x2``). Codes come from ``ml_dtypes.float4_e2m1fn``; MX scales
are ``ml_dtypes.float8_e8m0fnu`` and NVFP4 block scales ``float8_e4m3fn``.

Edge values, identical in the jnp path and the numpy reference:

- float32 subnormals (inputs and intermediates) are flushed to signed zero,
  which is what XLA does on CPU and GPU; the references flush explicitly.
- zeros: a zero tensor/row gets scale 1 (fp8, nvfp4 tensor scale); a zero MX
  block gets E8M0 code 0 (2^-127) and zero elements. E8M0 code 0 is a float32
  subnormal, so it dequantises to 0 (flush-to-zero).
- NaN / +-inf: amaxes are taken over finite values. FP8 and BF16 keep NaN as
  NaN and saturate +-inf to +-fmax (BF16 keeps inf). In MXFP4/NVFP4 a block
  holding any NaN or inf gets a NaN scale (E8M0 0xFF, E4M3 0x7F) and zero codes,
  so the whole block dequantises to NaN (OCP MX: "if X is NaN, every element
  of the block is NaN").
- a length along ``axis`` that is not a multiple of the block (32 or 16) is
  zero-padded (``pad=True``, the default; ``dequantize`` crops it) or rejected
  with ``pad=False``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

TINY = np.float32(2.0**-126)  # smallest normal float32


@dataclasses.dataclass(frozen=True)
class Format:
    """A low-precision format: element type, block size (0 = none), largest element."""

    name: str
    element: type
    block: int
    fmax: float
    bits: float  # storage bits per element, scales included (amortised)


FORMATS: dict[str, Format] = {
    "bf16": Format("bf16", ml_dtypes.bfloat16, 0, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
                   16),
    "fp8_e4m3": Format("fp8_e4m3", ml_dtypes.float8_e4m3fn, 0, 448.0, 8),
    "fp8_e5m2": Format("fp8_e5m2", ml_dtypes.float8_e5m2, 0, 57344.0, 8),
    "mxfp4": Format("mxfp4", ml_dtypes.float4_e2m1fn, 32, 6.0, 4 + 8 / 32),
    "nvfp4": Format("nvfp4", ml_dtypes.float4_e2m1fn, 16, 6.0, 4 + 8 / 16),
}
SCALINGS = ("tensor", "row")


def get_format(fmt: str) -> Format:
    """The :class:`Format` named ``fmt``; ``ValueError`` listing the known names otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a known low-precision format; "
                         f"known formats: {sorted(FORMATS)}")
    return FORMATS[fmt]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedArray:
    """A quantised tensor, quantised axis last in storage.

    ``data``: bf16/fp8 values, or packed FP4 codes ``uint8 [..., Kp / 2]``.
    ``scales``: fp8: float32 ``[]`` or ``[..., 1]``; mxfp4: float8_e8m0fnu
    ``[..., Kp / 32]``; nvfp4: float8_e4m3fn ``[..., Kp / 16]``; bf16: None.
    ``tensor_scale``: float32 ``[]`` (nvfp4 only). ``shape``/``axis`` describe
    the original array; ``Kp`` is the padded length along ``axis``.
    """

    data: jax.Array
    scales: jax.Array | None
    tensor_scale: jax.Array | None
    fmt: str = dataclasses.field(metadata=dict(static=True))
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    axis: int = dataclasses.field(metadata=dict(static=True))

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    def dequantize(self) -> jax.Array:
        """Returns the float32 array of the original shape (padding cropped)."""
        return dequantize(self)


# ----------------------------------------------------------------------------- shared helpers


def decode_e2m1(codes):
    """FP4 E2M1 codes (low 4 bits of an integer array) -> float32 values (works in kernels)."""
    c = codes.astype(jnp.int32)
    sign = jnp.where((c >> 3) & 1 == 1, -1.0, 1.0).astype(jnp.float32)
    e = (c >> 1) & 3
    m = (c & 1).astype(jnp.float32)
    pow2 = jnp.where(e == 3, 4.0, jnp.where(e == 2, 2.0, 1.0)).astype(jnp.float32)
    mag = jnp.where(e == 0, 0.5 * m, pow2 * (1.0 + 0.5 * m))
    return sign * mag


def unpack_fp4(packed):
    """``uint8 [..., n]`` -> (low, high) code arrays: elements ``2i`` and ``2i + 1``."""
    p = packed.astype(jnp.int32)
    return p & 0xF, (p >> 4) & 0xF


def e8m0_to_f32(codes):
    """E8M0 codes (uint8) -> 2^(code - 127) as float32; 255 -> NaN; 0 -> 0 (subnormal, flushed)."""
    c = codes.astype(jnp.uint32)
    val = jax.lax.bitcast_convert_type(c << 23, jnp.float32)
    return jnp.where(c == 255, jnp.float32(np.nan), val)


def _ftz(x):
    return jnp.where(jnp.abs(x) < TINY, jnp.copysign(jnp.float32(0.0), x), x)


def _to_blocks(x, axis: int, block: int, pad: bool, fmt: str):
    x = jnp.moveaxis(x, axis, -1)
    k = x.shape[-1]
    if block and k % block:
        if not pad:
            raise ValueError(f"length {k} along axis {axis} is not a multiple of the {fmt} "
                             f"block size {block}; pass pad=True to zero-pad")
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, block - k % block)])
    return x


def _check(x, fmt: str, axis: int, scaling: str):
    spec = get_format(fmt)
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is unknown; expected one of {SCALINGS}")
    if np.ndim(x) == 0:
        raise ValueError("quantize needs an array with at least one axis, got a scalar")
    if not -np.ndim(x) <= axis < np.ndim(x):
        raise ValueError(f"axis={axis} is out of range for an array of rank {np.ndim(x)}")
    return spec, axis % np.ndim(x)


# ----------------------------------------------------------------------------- jnp path


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "scaling", "pad"))
def quantize(x, fmt: str, *, axis: int = -1, scaling: str = "tensor",
             pad: bool = True) -> QuantizedArray:
    """Quantises ``x`` (cast to float32) to ``fmt`` with blocks/rows along ``axis``.

    Returns:
      A :class:`QuantizedArray`; ``quantize_reference`` gives the same bits in numpy.
    """
    spec, ax = _check(x, fmt, axis, scaling)
    shape = tuple(np.shape(x))
    x = _ftz(jnp.asarray(x, jnp.float32))
    xt = _to_blocks(x, ax, spec.block, pad, fmt)
    finite = jnp.isfinite(xt)
    if fmt == "bf16":
        return QuantizedArray(xt.astype(jnp.bfloat16), None, None, fmt, shape, ax)
    if fmt.startswith("fp8"):
        amax = jnp.max(jnp.where(finite, jnp.abs(xt), 0.0), axis=-1 if scaling == "row" else None,
                       keepdims=scaling == "row")
        scale = jnp.where(amax == 0, 1.0, jnp.maximum(amax * np.float32(1 / spec.fmax), TINY))
        q = jnp.clip(_ftz(xt / scale), -spec.fmax, spec.fmax).astype(spec.element)
        return QuantizedArray(q, scale.astype(jnp.float32), None, fmt, shape, ax)
    blocks = xt.reshape(*xt.shape[:-1], -1, spec.block)
    bad = ~jnp.all(jnp.isfinite(blocks), axis=-1, keepdims=True)
    amax_b = jnp.max(jnp.where(jnp.isfinite(blocks), jnp.abs(blocks), 0.0), axis=-1,
                     keepdims=True)
    if fmt == "mxfp4":
        bits = jax.lax.bitcast_convert_type(amax_b, jnp.uint32)
        e = jnp.clip(((bits >> 23) & 0xFF).astype(jnp.int32) - 127 - 2, -127, 127)
        e = jnp.where(amax_b == 0, -127, e)
        inv = jax.lax.bitcast_convert_type(((127 - e) << 23).astype(jnp.uint32), jnp.float32)
        y = _ftz(blocks * inv)
        code = jnp.where(bad, 255, e + 127).astype(jnp.uint8)
        scales = jax.lax.bitcast_convert_type(code[..., 0], jnp.float8_e8m0fnu)
        tensor_scale = None
    else:  # nvfp4
        amax_t = jnp.max(jnp.where(finite, jnp.abs(xt), 0.0))
        g = jnp.where(amax_t == 0, 1.0, jnp.maximum(amax_t * np.float32(1 / 2688), TINY))
        s = jnp.clip(_ftz(_ftz(amax_b * np.float32(1 / 6)) / g), 0, 448)
        s8 = jnp.where(bad, jnp.float32(np.nan), s).astype(jnp.float8_e4m3fn)
        denom = _ftz(s8.astype(jnp.float32) * g)
        y = jnp.where(denom == 0, 0.0, _ftz(blocks / jnp.where(denom == 0, 1.0, denom)))
        scales, tensor_scale = s8[..., 0], g.astype(jnp.float32)
    y = jnp.where(bad, 0.0, jnp.clip(y, -6.0, 6.0))
    codes = jax.lax.bitcast_convert_type(y.astype(jnp.float4_e2m1fn), jnp.uint4).astype(jnp.uint8)
    codes = codes.reshape(*xt.shape[:-1], -1, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return QuantizedArray(packed, scales, tensor_scale, fmt, shape, ax)


def element_values(q: QuantizedArray):
    """The unscaled element values ``[..., Kp]`` (float32) in storage layout (axis last)."""
    if q.fmt in ("mxfp4", "nvfp4"):
        lo, hi = unpack_fp4(q.data)
        return jnp.stack([decode_e2m1(lo), decode_e2m1(hi)], -1).reshape(*q.data.shape[:-1], -1)
    return q.data.astype(jnp.float32)


def block_scales(q: QuantizedArray):
    """Float32 scales broadcastable to :func:`element_values` (per block expanded)."""
    if q.fmt == "bf16":
        return jnp.float32(1.0)
    if q.fmt.startswith("fp8"):
        return q.scales
    if q.fmt == "mxfp4":
        s = e8m0_to_f32(jax.lax.bitcast_convert_type(q.scales, jnp.uint8))
    else:
        s = _ftz(q.scales.astype(jnp.float32) * q.tensor_scale)
    return jnp.repeat(s, q.format.block, axis=-1)


@jax.jit
def dequantize(q: QuantizedArray) -> jax.Array:
    """Returns float32 values of the original shape: elements times their scales."""
    y = _ftz(element_values(q) * block_scales(q))
    k = q.shape[q.axis]
    return jnp.moveaxis(y[..., :k], -1, q.axis)


# ----------------------------------------------------------------------------- numpy references


def _np_ftz(x):
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < TINY, np.copysign(np.float32(0.0), x), x).astype(np.float32)


def quantize_reference(x, fmt: str, *, axis: int = -1, scaling: str = "tensor",
                       pad: bool = True) -> dict:
    """Numpy/ml_dtypes reference of :func:`quantize`, written from the format definitions.

    Returns:
      ``{"data", "scales", "tensor_scale"}`` as numpy arrays in storage layout
      (``None`` where a format has no such part), bit-comparable with the fields
      of :func:`quantize`'s result.
    """
    spec, ax = _check(x, fmt, axis, scaling)
    x = np.moveaxis(_np_ftz(x), ax, -1)
    k = x.shape[-1]
    if spec.block and k % spec.block:
        if not pad:
            raise ValueError(f"length {k} along axis {axis} is not a multiple of the {fmt} "
                             f"block size {spec.block}; pass pad=True to zero-pad")
        x = np.concatenate([x, np.zeros((*x.shape[:-1], spec.block - k % spec.block),
                                        np.float32)], -1)
    absf = np.where(np.isfinite(x), np.abs(x), np.float32(0))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if fmt == "bf16":
            return {"data": x.astype(ml_dtypes.bfloat16), "scales": None, "tensor_scale": None}
        if fmt.startswith("fp8"):
            row = scaling == "row"
            amax = absf.max(axis=-1, keepdims=True) if row else absf.max()
            scale = np.where(amax == 0, np.float32(1),
                             np.maximum(np.float32(amax * np.float32(1 / spec.fmax)), TINY))
            scale = np.asarray(scale, np.float32)
            q = np.clip(_np_ftz(x / scale), -spec.fmax, spec.fmax).astype(spec.element)
            return {"data": q, "scales": scale, "tensor_scale": None}
        blocks = x.reshape(*x.shape[:-1], -1, spec.block)
        bad = ~np.isfinite(blocks).all(-1)
        amax_b = absf.reshape(blocks.shape).max(-1)
        if fmt == "mxfp4":
            _, ex = np.frexp(amax_b)  # amax = m * 2^ex, m in [0.5, 1): floor(log2) = ex - 1
            e = np.where(amax_b == 0, -127, np.clip(ex - 1 - 2, -127, 127))
            y = _np_ftz(blocks * np.ldexp(np.float32(1), -e)[..., None].astype(np.float32))
            codes8 = np.where(bad, 255, e + 127).astype(np.uint8)
            scales, tensor_scale = codes8.view(ml_dtypes.float8_e8m0fnu), None
        else:
            amax_t = absf.max()
            g = np.float32(1) if amax_t == 0 else max(np.float32(amax_t * np.float32(1 / 2688)),
                                                      TINY)
            s = np.clip(_np_ftz(_np_ftz(amax_b * np.float32(1 / 6)) / g), 0, 448)
            s8 = np.where(bad, np.float32(np.nan), s).astype(ml_dtypes.float8_e4m3fn)
            denom = _np_ftz(s8.astype(np.float32) * g)[..., None]
            y = np.where(denom == 0, np.float32(0),
                         _np_ftz(blocks / np.where(denom == 0, np.float32(1), denom)))
            scales, tensor_scale = s8, np.float32(g)
        y = np.where(bad[..., None], np.float32(0), np.clip(y, -6, 6)).astype(np.float32)
        codes = y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(*x.shape[:-1], -1, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)
    return {"data": packed, "scales": scales, "tensor_scale": tensor_scale}


def dequantize_reference(parts: dict, fmt: str, shape: tuple[int, ...], axis: int = -1):
    """Numpy reference of :func:`dequantize` for :func:`quantize_reference`'s output (float32)."""
    spec = get_format(fmt)
    data, scales = parts["data"], parts["scales"]
    if spec.block:
        lo, hi = data & 0xF, data >> 4
        codes = np.stack([lo, hi], -1).reshape(*data.shape[:-1], -1).astype(np.uint8)
        vals = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
        if fmt == "mxfp4":
            c = scales.view(np.uint8).astype(np.int64)
            s = np.where(c == 255, np.nan, np.where(c == 0, 0.0, np.ldexp(1.0, c - 127)))
        else:
            s = _np_ftz(scales.astype(np.float32) * parts["tensor_scale"])
        s = np.repeat(np.asarray(s, np.float32), spec.block, axis=-1)
    else:
        vals = data.astype(np.float32)
        s = np.float32(1) if scales is None else scales
    with np.errstate(invalid="ignore"):
        y = _np_ftz(vals * s)
    ax = axis % len(shape)
    return np.moveaxis(y[..., : shape[ax]], -1, ax)
