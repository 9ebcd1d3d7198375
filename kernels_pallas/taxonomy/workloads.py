"""Workloads the taxonomy's examples and the Hawkeye search run: inputs, kernels, references.

A workload is an op (``matmul``, ``scaled_matmul``, ``attention``, ``rmsnorm``),
a shape, a dtype or low-precision format, and a target. A candidate kernel is
the op's Pallas kernel with a parameter dict (``MatmulConfig`` fields and
``fuse_epilogue`` for the matmuls, ``block_q``/``block_k`` for attention,
``block_rows`` for RMSNorm). :func:`run_kernel` runs one, :func:`run_reference`
the jnp/XLA reference of the same op, :func:`check` compares them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import lowp
from kernels_pallas import matmul as mm
from kernels_pallas import rmsnorm as rn

OPS = ("matmul", "scaled_matmul", "attention", "rmsnorm")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float8_e4m3fn": jnp.float8_e4m3fn}
MATMUL_KEYS = tuple(f.name for f in dataclasses.fields(mm.MatmulConfig)) + ("fuse_epilogue",)
PARAM_KEYS = {"matmul": MATMUL_KEYS, "scaled_matmul": MATMUL_KEYS,
              "attention": ("block_q", "block_k"), "rmsnorm": ("block_rows",)}
EPILOGUE = {"activation": "gelu", "scale": 0.5}


@dataclasses.dataclass(frozen=True)
class Workload:
    """An op at a shape: ``shape`` is (M, N, K) for matmuls, (B, H, T, S, D) for attention,
    (rows, D) for RMSNorm; ``dtype`` a key of DTYPES or, for scaled_matmul, a lowp format."""

    op: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    scaling: str = "tensor"

    def validate(self) -> Workload:
        if self.op not in OPS:
            raise ValueError(f"op={self.op!r} is unknown; expected one of {OPS}")
        ranks = {"matmul": 3, "scaled_matmul": 3, "attention": 5, "rmsnorm": 2}
        if len(self.shape) != ranks[self.op] or min(self.shape) < 1:
            raise ValueError(f"shape={self.shape} for op {self.op!r}; expected "
                             f"{ranks[self.op]} positive sizes")
        if self.op == "scaled_matmul":
            lowp.get_format(self.dtype)
        elif self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} for op {self.op!r}; expected one of "
                             f"{sorted(DTYPES)}")
        return self

    @property
    def flops(self) -> float:
        """Floating-point operations of the op (2 per multiply-add)."""
        s = self.shape
        if self.op in ("matmul", "scaled_matmul"):
            return 2.0 * s[0] * s[1] * s[2]
        if self.op == "attention":
            return 4.0 * s[0] * s[1] * s[2] * s[3] * s[4]
        return 4.0 * s[0] * s[1]


def make_inputs(w: Workload, seed: int = 0):
    """The inputs of ``w`` (deterministic in ``seed``), in the kernel's argument order."""
    w.validate()
    rs = np.random.RandomState(seed)
    if w.op in ("matmul", "scaled_matmul"):
        m, n, k = w.shape
        a = rs.randn(m, k).astype(np.float32)
        b = (rs.randn(k, n) / np.sqrt(k)).astype(np.float32)
        bias = rs.randn(n).astype(np.float32)
        if w.op == "scaled_matmul":
            return (lowp.quantize(a, w.dtype, axis=1, scaling=w.scaling),
                    lowp.quantize(b, w.dtype, axis=0, scaling=w.scaling), jnp.asarray(bias))
        dt = DTYPES[w.dtype]
        if dt == jnp.float8_e4m3fn:  # plain fp8 operands: values already in range
            return jnp.asarray(a).astype(dt), jnp.asarray(b * 8).astype(dt), jnp.asarray(bias)
        return jnp.asarray(a, dt), jnp.asarray(b, dt), jnp.asarray(bias)
    if w.op == "attention":
        bsz, h, t, s, d = w.shape
        dt = DTYPES[w.dtype]
        return tuple(jnp.asarray(rs.randn(bsz, h, n, d), dt) for n in (t, s, s))
    rows, d = w.shape
    return (jnp.asarray(rs.randn(rows, d), DTYPES[w.dtype]),
            jnp.asarray(rs.rand(d) + 0.5, jnp.float32),
            jnp.asarray(rs.randn(rows, d), DTYPES[w.dtype]))


def matmul_config(params: dict) -> mm.MatmulConfig:
    """The :class:`~kernels_pallas.matmul.MatmulConfig` of a candidate's parameters (its
    ``fuse_epilogue`` flag is an argument of the kernel, not of the config)."""
    return mm.MatmulConfig(**{k: v for k, v in params.items() if k != "fuse_epilogue"})


def check_params(op: str, params: dict) -> dict:
    """Raises ``ValueError`` naming an unknown parameter; returns ``params``."""
    unknown = sorted(set(params) - set(PARAM_KEYS[op]))
    if unknown:
        raise ValueError(f"unknown {op} parameters {unknown}; known: {list(PARAM_KEYS[op])}")
    return params


def run_kernel(w: Workload, params: dict, args, *, interpret: bool,
               triton: bool | None = None):
    """Runs the op's Pallas kernel with ``params`` on ``args``; returns its output."""
    check_params(w.op, params)
    if w.op in ("matmul", "scaled_matmul"):
        cfg = matmul_config(params)
        fused = params.get("fuse_epilogue", True)
        kern = mm.matmul_kernel if w.op == "matmul" else mm.scaled_matmul_kernel
        a, b, bias = args
        kw = dict(config=cfg, interpret=interpret, triton=triton, out_dtype=jnp.float32)
        if fused:
            return kern(a, b, bias=bias, **kw, **EPILOGUE)
        return _unfused_epilogue(kern(a, b, **kw), bias)
    if w.op == "attention":
        from kernels_pallas import attention as attn

        return attn.flash_attention(*args, interpret=interpret, **params)
    x, weight, res = args
    return rn.rmsnorm_kernel(x, weight, residual=res, interpret=interpret, triton=triton,
                             **params)


@jax.jit
def _unfused_epilogue(acc, bias):
    """The epilogue as separate XLA ops after the kernel (the unfused baseline)."""
    return mm.ACTIVATIONS[EPILOGUE["activation"]](acc * EPILOGUE["scale"] + bias)


def run_reference(w: Workload, args):
    """The XLA (jnp) implementation of the same op: the baseline every kernel is timed against."""
    if w.op == "matmul":
        a, b, bias = args
        return mm.reference(a, b, bias=bias, out_dtype=jnp.float32, **EPILOGUE)
    if w.op == "scaled_matmul":
        a, b, bias = args
        return mm.scaled_reference(a, b, bias=bias, **EPILOGUE)
    if w.op == "attention":
        from kernels_pallas import attention as attn

        return jax.jit(attn.reference)(*args)
    x, weight, res = args
    return rn.reference(x, weight, residual=res)


def tolerance(w: Workload, params: dict | None = None) -> float:
    """Allowed max |kernel - reference| relative to max |reference|.

    Kernel and reference see the same (already rounded) inputs, so only the
    accumulation order differs: 1e-4 for float32 outputs; 1e-2 where the output
    itself is stored in bfloat16 (attention, RMSNorm, and a matmul through a Mosaic GPU
    backend, whose kernels store the product in the operand dtype), one bf16 ulp being 2^-8.
    """
    if w.op in ("attention", "rmsnorm") and w.dtype != "float32":
        return 1e-2
    if params and params.get("backend", "triton") != "triton":
        return 1e-2
    return 1e-4


def lowp_block(w: Workload) -> int:
    """K elements per scale block of a scaled_matmul's format (0 for other ops / no blocks)."""
    return lowp.get_format(w.dtype).block if w.op == "scaled_matmul" else 0


def proxy_workload(w: Workload, params: dict) -> Workload:
    """A small workload that keeps the candidate's structure: two CTA tiles along M and N
    (a Mosaic GPU CTA spans ``MatmulConfig.cta_tile``), two K steps per split, two blocks of
    queries/keys, two row blocks. The candidate's lowering and interpret-mode check run on it,
    since interpreting the full shape on a CPU would take hours."""
    s = w.shape
    if w.op in ("matmul", "scaled_matmul"):
        bk = lowp_block(w) or params["block_k"]
        tm, tn = matmul_config(params).cta_tile()
        shape = (min(s[0], 2 * tm), min(s[1], 2 * tn), min(s[2], 2 * bk * params["split_k"]))
    elif w.op == "attention":
        shape = (1, 1, min(s[2], 2 * params["block_q"]), min(s[3], 2 * params["block_k"]), s[4])
    else:
        shape = (min(s[0], 2 * params["block_rows"]), s[1])
    return dataclasses.replace(w, shape=shape)


def max_rel_error(out, ref) -> float:
    """max |out - ref| / max |ref| over all outputs (pytrees allowed), in float64."""
    errs = []
    for o, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref), strict=True):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if o.shape != r.shape:
            return float("inf")
        errs.append(np.abs(o - r).max() / max(np.abs(r).max(), 1e-30))
    return float(max(errs))


@functools.lru_cache(maxsize=256)
def _interpret_error(w: Workload, params_items: tuple, seed: int) -> float:
    args = make_inputs(w, seed)
    return max_rel_error(run_kernel(w, dict(params_items), args, interpret=True),
                         run_reference(w, args))


def check(w: Workload, params: dict, seed: int = 0) -> tuple[bool, float]:
    """Interpret-mode numerical check: ``(passes, max relative error)`` (cached per candidate)."""
    err = _interpret_error(w, tuple(sorted(params.items())), seed)
    return bool(err <= tolerance(w, params)), err
