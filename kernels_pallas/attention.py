"""Attention: a Pallas flash-attention kernel, its jnp reference and a dispatcher.

Layout (head-major, like the KV cache): ``q [B, H, T, D]``, ``k, v [B, Hkv, S, D]``
with ``H`` a multiple of ``Hkv`` (grouped-query attention: query head ``h``
reads KV head ``h // (H // Hkv)``). ``mask`` is boolean, True = attend,
broadcastable to ``[B, Hm, T, S]`` with ``Hm`` in ``{1, Hkv, H}`` (a per-KV-head
mask is what an evicted cache needs). ``bias`` is additive, broadcastable to
``[B, H, T, S]``. A query row with no allowed key returns zeros.

The kernel (:func:`flash_attention`) is the blocked forward pass of
FlashAttention-2 (Dao, 2023, arXiv:2307.08691, Algorithm 1), written like
jax's ``jax/experimental/pallas/ops/gpu/attention.py``: a grid over
``(batch, head, q-block)``, a ``fori_loop`` over key blocks with the online
softmax (running max ``m``, normaliser ``l``, unnormalised accumulator), GQA by
mapping query head ``h`` to KV head ``h // (H // Hkv)`` in the BlockSpec index
map. Mask and bias are read block by block through their own BlockSpecs
(their batch, head and query axes stay at size 1 when given so). ``T`` and ``S`` are padded
to block multiples inside the wrapper and padded keys are masked in the kernel.

Column sums over queries, ``sum_t p[t, s]``, need each row's final normaliser,
which the online softmax only knows after the last key block. So the forward
pass also writes the row log-sum-exp ``lse = m + log l`` and a second Pallas
pass (grid over ``(batch, head, k-block)``, loop over q-blocks) recomputes the
logits of its key block and sums ``exp(s - lse)`` over the queries: one extra
``QK^T`` instead of a materialised ``[T, S]`` probability matrix (the way H2O
and SnapKV-style statistics are gathered without storing attention). A query
row with no allowed key gets ``lse = +inf`` and adds nothing.

On GPU the kernel is lowered with the Triton backend (explicit
``pallas.triton.CompilerParams``; the Mosaic GPU backend wants ``plgpu.kernel``
style kernels); on CPU it runs with ``interpret=True``. The tests run the
interpreter; the compiled GPU/TPU paths have not been run on hardware yet (TPU's
Mosaic also constrains block shapes more than Triton does).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import platform, select

NEG_INF = -1e30
# reference(causal=True) with T == S splits the queries into blocks of at least this many
# rows, and at most this many blocks (see causal_block).
CAUSAL_MIN_BLOCK = 64
CAUSAL_MAX_BLOCKS = 16


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


def reference(q, k, v, *, mask=None, bias=None, sm_scale=None, causal=False,
              return_probs=False, return_colsum=False):
    """Softmax attention in float32 with GQA, mask and bias.

    ``causal=True`` adds a causal mask aligned at the end (query ``i`` sees key
    ``j`` iff ``j <= i + S - T``, flash-attn 2's convention, which is the usual
    one for ``T == S`` and for decoding against a cache of ``S`` keys). With
    ``T == S`` and neither statistic asked for, the queries are then taken in
    blocks (:func:`causal_block`) that each read only their key prefix, which
    skips the masked upper triangle: the same numbers in about half the work.

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
    block = causal_block(t)
    if causal and k.shape[2] == t and block and not (return_probs or return_colsum):
        return _causal_blocks(q, k, v, mask, bias, scale, block)
    return _dense(q, k, v, mask, bias, scale, causal, return_probs, return_colsum)


def _dense(q, k, v, mask, bias, scale, causal, return_probs, return_colsum):
    """:func:`reference` on the whole ``[T, S]`` logit matrix at once."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    # Query heads of a KV group are merged into the row axis ([B, Hkv, G*T, D]), so both
    # products are plain batched matmuls with one batch pair (no repeated K/V).
    qf = q.astype(jnp.float32).reshape(b, hkv, (h // hkv) * t, d)
    logits = jnp.einsum("bkmd,bksd->bkms", qf, k.astype(jnp.float32)) * scale
    logits = logits.reshape(b, h, t, -1)
    if bias is not None:
        logits = logits + expand_heads(jnp.asarray(bias, jnp.float32), h)
    if causal:
        s = k.shape[2]
        tri = jnp.arange(t)[:, None] + (s - t) >= jnp.arange(s)[None, :]
        mask = tri if mask is None else jnp.logical_and(jnp.asarray(mask, bool), tri)
    if mask is not None:
        m = expand_heads(jnp.asarray(mask, bool), h)
        logits = jnp.where(m, logits, NEG_INF)
    # The max is a constant shift (softmax is invariant to it), so no gradient flows
    # through it; a row with every key masked gets zero probabilities, not uniform ones.
    mx = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    p = jnp.exp(logits - mx)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    probs = p / denom
    if mask is not None:
        probs = jnp.where(jnp.any(m, axis=-1, keepdims=True), probs, 0.0)
    out = jnp.einsum("bkms,bksd->bkmd", probs.reshape(b, hkv, (h // hkv) * t, -1),
                     v.astype(jnp.float32)).reshape(b, h, t, d).astype(q.dtype)
    extras = []
    if return_colsum:
        extras.append(probs.sum(axis=2))
    if return_probs:
        extras.append(probs)
    return (out, *extras) if extras else out


def causal_block(t: int) -> int:
    """Query-block size of :func:`reference`'s causal path for ``t`` tokens (0 = one block):
    64, or more so that there are at most 16 blocks (each is its own pair of matmuls)."""
    if t <= CAUSAL_MIN_BLOCK:
        return 0
    return max(CAUSAL_MIN_BLOCK, _next_pow2(-(-t // CAUSAL_MAX_BLOCKS)))


def _rows_cols(x, start: int, end: int, t: int):
    """``x[..., start:end, :end]`` of a mask/bias broadcastable to ``[..., t, t]``, slicing
    only the axes that are not broadcast (size 1)."""
    if x is None or jnp.ndim(x) == 0:
        return x
    x = jnp.asarray(x)
    if x.ndim >= 2 and x.shape[-2] == t:
        x = x[..., start:end, :]
    if x.shape[-1] == t:
        x = x[..., :end]
    return x


def _causal_blocks(q, k, v, mask, bias, scale, block: int):
    """Causal attention (``T == S``) by query blocks: block ``[s, e)`` reads keys ``[0, e)``
    only, so the fully masked upper block triangle is never computed, nor differentiated
    (about half the logits and probabilities of the one-block path at 16 blocks). Exact: each
    block is the dense path on its rows and key prefix (end-aligned causal mask)."""
    t = q.shape[2]
    outs = []
    for start in range(0, t, block):
        end = min(start + block, t)
        outs.append(_dense(q[:, :, start:end], k[:, :, :end], v[:, :, :end],
                           _rows_cols(mask, start, end, t), _rows_cols(bias, start, end, t),
                           scale, True, False, False))
    return jnp.concatenate(outs, axis=2)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _head_index(n_heads: int, hx: int):
    """Index of the mask/bias head read by query head ``h`` (repeat semantics of expand_heads)."""
    if hx == 1:
        return lambda h: 0
    group = n_heads // hx
    return lambda h: h // group


def _operand(x, name: str, b: int, h: int, t: int, s: int, tp: int, sp: int, dtype, pad):
    """Shapes a mask/bias to ``[Bx, Hx, Tx, Sp]`` (Bx in {1,B}, Hx | H, Tx in {1,Tp}), padded."""
    x = jnp.asarray(x)
    given = x.shape
    if x.ndim > 4:
        raise ValueError(f"{name} has shape {x.shape}; expected at most 4 axes [B, H, T, S]")
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    xb, xh, xt, xs = x.shape
    if xb not in (1, b) or xh < 1 or h % xh or xt not in (1, t) or xs not in (1, s):
        raise ValueError(f"{name} has shape {given}; expected broadcastable to [B={b}, "
                         f"H={h} (or a divisor), T={t}, S={s}]")
    x = jnp.broadcast_to(x.astype(dtype), (xb, xh, xt, s))
    x = jnp.pad(x, ((0, 0), (0, 0), (0, tp - t if xt > 1 else 0), (0, sp - s)),
                constant_values=pad)
    return x


def _logits(q, k, sm_scale):
    """``q @ k.T * sm_scale`` in float32 (the contraction Triton lowers to a transposed MMA)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return s * sm_scale


def _valid(q_start, k_start, bq, bk, *, mask_blk, q_len, kv_len, tp, sp, causal, offset):
    """Boolean ``[bq|1, bk]`` of allowed pairs in a tile, or None when all are allowed."""
    valid = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    q_idx = q_start + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    k_idx = k_start + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    if mask_blk is not None:
        valid = mask_blk != 0
    if kv_len < sp:
        valid = both(valid, k_idx < kv_len)
    if q_len < tp:
        valid = both(valid, q_idx < q_len)
    if causal:
        valid = both(valid, q_idx + offset >= k_idx)
    return valid


def _fwd_kernel(q_ref, k_ref, v_ref, *refs, has_mask, has_bias, sm_scale, causal, offset,
                block_q, block_k, q_len, kv_len, tp, sp):
    refs = list(refs)
    mask_ref = refs.pop(0) if has_mask else None
    bias_ref = refs.pop(0) if has_bias else None
    o_ref, lse_ref = refs
    qi = pl.program_id(2)
    q = q_ref[...]
    n_k = sp // block_k

    def body(j, carry):
        acc, m, den = carry
        ks = pl.ds(j * block_k, block_k)
        s = _logits(q, k_ref[ks, :], sm_scale)
        if has_bias:
            s = s + bias_ref[:, ks].astype(jnp.float32)
        valid = _valid(qi * block_q, j * block_k, block_q, block_k,
                       mask_blk=mask_ref[:, ks] if has_mask else None, q_len=tp, kv_len=kv_len,
                       tp=tp, sp=sp, causal=causal, offset=offset)
        if valid is not None:
            s = jnp.where(valid, s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        if valid is not None:
            p = jnp.where(valid, p, 0.0)
        corr = jnp.exp(m - m_new)
        v = v_ref[ks, :]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
        return corr[:, None] * acc + pv, m_new, corr * den + jnp.sum(p, axis=1)

    if causal:  # key blocks wholly after this q-block's last query are skipped
        hi = lax.div((qi + 1) * block_q + offset + block_k - 1, block_k)
        hi = jnp.clip(hi, 0, n_k)
    else:
        hi = n_k
    init = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((block_q,), NEG_INF, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    acc, m, den = lax.fori_loop(0, hi, body, init)
    safe = jnp.where(den > 0, den, 1.0)
    o_ref[...] = (acc / safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(den > 0, m + jnp.log(safe), jnp.inf)


def _colsum_kernel(q_ref, k_ref, lse_ref, *refs, has_mask, has_bias, mask_rows, bias_rows,
                   sm_scale, causal, offset, block_q, block_k, q_len, kv_len, tp, sp):
    refs = list(refs)
    mask_ref = refs.pop(0) if has_mask else None
    bias_ref = refs.pop(0) if has_bias else None
    (out_ref,) = refs
    kj = pl.program_id(2)
    k = k_ref[...]

    def body(i, acc):
        qs = pl.ds(i * block_q, block_q)
        s = _logits(q_ref[qs, :], k, sm_scale)
        if has_bias:
            s = s + (bias_ref[qs, :] if bias_rows else bias_ref[...]).astype(jnp.float32)
        mask_blk = None
        if has_mask:
            mask_blk = mask_ref[qs, :] if mask_rows else mask_ref[...]
        valid = _valid(i * block_q, kj * block_k, block_q, block_k, mask_blk=mask_blk,
                       q_len=q_len, kv_len=sp, tp=tp, sp=sp, causal=causal, offset=offset)
        p = jnp.exp(s - lse_ref[qs][:, None])
        if valid is not None:
            p = jnp.where(valid, p, 0.0)
        return acc + jnp.sum(p, axis=0)

    lo = 0
    if causal:  # q-blocks wholly before the first query that sees this key block are skipped
        lo = lax.div(jnp.maximum(kj * block_k - offset, 0), block_q)
    out_ref[...] = lax.fori_loop(lo, tp // block_q, body, jnp.zeros((block_k,), jnp.float32))


def _compiler_params(head_dim: int, interpret: bool):
    if interpret or platform() != "gpu":
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


@functools.partial(jax.jit, static_argnames=("sm_scale", "causal", "return_colsum", "block_q",
                                             "block_k", "interpret"))
def flash_attention(q, k, v, *, mask=None, bias=None, sm_scale: float | None = None,
                    causal: bool = False, return_colsum: bool = False, block_q: int = 64,
                    block_k: int = 64, interpret: bool = False):
    """Blocked flash attention forward in Pallas; same inputs and outputs as :func:`reference`.

    Args:
      q: ``[B, H, T, D]``; k, v: ``[B, Hkv, S, D]``.
      mask: boolean (True = attend) broadcastable to ``[B, Hm, T, S]``, Hm | H.
      bias: additive, broadcastable to ``[B, Hb, T, S]``, Hb | H.
      sm_scale: logit scale, ``D ** -0.5`` by default.
      causal: adds the end-aligned causal mask and skips key blocks it removes.
      return_colsum: also return ``sum_t p[b, h, t, s]`` as ``[B, H, S]`` float32,
        computed by a second pass from the row log-sum-exp (module docstring).
      block_q, block_k: tile sizes (powers of two; clipped to the padded lengths,
        at least 16 when the length allows so that Triton's MMA tiles are legal).
      interpret: run the kernel with the Pallas interpreter (CPU).

    Returns:
      ``out [B, H, T, D]`` in ``q.dtype``, and ``colsum [B, H, S]`` with ``return_colsum``.
    """
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [B,H,T,D] and k, v [B,Hkv,S,D] of one shape; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {k.shape} does not match q {q.shape} in batch or head_dim")
    if h % hkv:
        raise ValueError(f"n_heads={h} is not a multiple of n_kv_heads={hkv}")
    for name, blk in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(blk, int) or blk < 1 or blk & (blk - 1):
            raise ValueError(f"{name}={blk!r}; expected a positive power of two")
    scale = float(d ** -0.5 if sm_scale is None else sm_scale)
    bq = min(block_q, max(16, _next_pow2(t)))
    bk = min(block_k, max(16, _next_pow2(s)))
    tp, sp = pl.cdiv(t, bq) * bq, pl.cdiv(s, bk) * bk
    dp = max(16, _next_pow2(d))
    qp = jnp.pad(q, ((0, 0), (0, 0), (0, tp - t), (0, dp - d)))
    kp = jnp.pad(k, ((0, 0), (0, 0), (0, sp - s), (0, dp - d)))
    vp = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, dp - d)))
    kv_head = _head_index(h, hkv)
    static = dict(has_mask=mask is not None, has_bias=bias is not None, sm_scale=scale,
                  causal=causal, offset=s - t, block_q=bq, block_k=bk, q_len=t, kv_len=s,
                  tp=tp, sp=sp)

    extra, fwd_specs, col_specs, rows = [], [], [], {}
    for name, x, dtype, pad in (("mask", mask, jnp.int8, 0), ("bias", bias, jnp.float32, 0.0)):
        if x is None:
            continue
        x = _operand(x, name, b, h, t, s, tp, sp, dtype, pad)
        xb, xh, xt = x.shape[:3]
        bmap = (lambda i: i) if xb > 1 else (lambda i: 0)
        hmap = _head_index(h, xh)
        rows[name] = xt > 1
        extra.append(x)
        if xt > 1:
            fwd_specs.append(pl.BlockSpec((None, None, bq, sp), lambda bi, hi, qi, bm=bmap,
                                          hm=hmap: (bm(bi), hm(hi), qi, 0)))
            col_specs.append(pl.BlockSpec((None, None, tp, bk), lambda bi, hi, kj, bm=bmap,
                                          hm=hmap: (bm(bi), hm(hi), 0, kj)))
        else:
            fwd_specs.append(pl.BlockSpec((None, None, 1, sp), lambda bi, hi, qi, bm=bmap,
                                          hm=hmap: (bm(bi), hm(hi), 0, 0)))
            col_specs.append(pl.BlockSpec((None, None, 1, bk), lambda bi, hi, kj, bm=bmap,
                                          hm=hmap: (bm(bi), hm(hi), 0, kj)))

    params = _compiler_params(dp, interpret)
    out, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, **static),
        grid=(b, h, tp // bq),
        in_specs=[pl.BlockSpec((None, None, bq, dp), lambda bi, hi, qi: (bi, hi, qi, 0)),
                  pl.BlockSpec((None, None, sp, dp), lambda bi, hi, qi: (bi, kv_head(hi), 0, 0)),
                  pl.BlockSpec((None, None, sp, dp), lambda bi, hi, qi: (bi, kv_head(hi), 0, 0)),
                  *fwd_specs],
        out_specs=[pl.BlockSpec((None, None, bq, dp), lambda bi, hi, qi: (bi, hi, qi, 0)),
                   pl.BlockSpec((None, None, bq), lambda bi, hi, qi: (bi, hi, qi))],
        out_shape=[jax.ShapeDtypeStruct((b, h, tp, dp), q.dtype),
                   jax.ShapeDtypeStruct((b, h, tp), jnp.float32)],
        compiler_params=params, interpret=interpret, name="lab_flash_attention_fwd",
    )(qp, kp, vp, *extra)
    out = out[:, :, :t, :d]
    if not return_colsum:
        return out

    colsum = pl.pallas_call(
        functools.partial(_colsum_kernel, mask_rows=rows.get("mask", False),
                          bias_rows=rows.get("bias", False), **static),
        grid=(b, h, sp // bk),
        in_specs=[pl.BlockSpec((None, None, tp, dp), lambda bi, hi, kj: (bi, hi, 0, 0)),
                  pl.BlockSpec((None, None, bk, dp), lambda bi, hi, kj: (bi, kv_head(hi), kj, 0)),
                  pl.BlockSpec((None, None, tp), lambda bi, hi, kj: (bi, hi, 0)),
                  *col_specs],
        out_specs=pl.BlockSpec((None, None, bk), lambda bi, hi, kj: (bi, hi, kj)),
        out_shape=jax.ShapeDtypeStruct((b, h, sp), jnp.float32),
        compiler_params=params, interpret=interpret, name="lab_flash_attention_colsum",
    )(qp, kp, lse, *extra)
    return out, colsum[:, :, :s]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash_vjp(q, k, v, mask, bias, static):
    return flash_attention(q, k, v, mask=mask, bias=bias, **dict(static))


def _flash_vjp_fwd(q, k, v, mask, bias, static):
    return _flash_vjp(q, k, v, mask, bias, static), (q, k, v, mask, bias)


def _flash_vjp_bwd(static, res, g):
    q, k, v, mask, bias = res
    kw = {name: value for name, value in static if name != "interpret"}
    _, vjp = jax.vjp(lambda q, k, v, bias: reference(q, k, v, mask=mask, bias=bias, **kw),
                     q, k, v, bias)
    dq, dk, dv, dbias = vjp(g)
    return dq, dk, dv, None, dbias


_flash_vjp.defvjp(_flash_vjp_fwd, _flash_vjp_bwd)


def flash_attention_differentiable(q, k, v, *, mask=None, bias=None, sm_scale=None,
                                   causal: bool = False, return_colsum: bool = False,
                                   interpret: bool = False):
    """:func:`flash_attention` with gradients for q, k, v and bias.

    The forward pass is the Pallas kernel; the backward pass is the VJP of
    :func:`reference` (it materialises the ``[T, S]`` probabilities: a Pallas
    backward kernel, FlashAttention-2's Algorithm 2, is not written yet).
    """
    static = (("sm_scale", sm_scale), ("causal", causal), ("return_colsum", return_colsum),
              ("interpret", interpret))
    mask = None if mask is None else jnp.asarray(mask, bool)
    bias = None if bias is None else jnp.asarray(bias)
    return _flash_vjp(q, k, v, mask, bias, static)


def attention(q, k, v, *, mask=None, bias=None, sm_scale=None, causal: bool = False,
              return_colsum: bool = False, impl: str | None = None):
    """Dispatching entry point: the Pallas kernel or the jnp reference.

    ``impl`` is ``"pallas"``, ``"xla"`` or ``None`` (compiled Pallas on GPU/TPU,
    the reference on CPU; ``LAB_KERNELS=xla|pallas`` overrides ``None``); see
    :func:`kernels_pallas.dispatch.backend`. ``"pallas"`` on CPU runs the kernel
    in interpret mode.

    Both are differentiable in q, k, v and bias (the kernel's backward pass is
    the reference's VJP, see :func:`flash_attention_differentiable`).

    Returns:
      ``out [B, H, T, D]``; with ``return_colsum`` also ``colsum [B, H, S]`` (float32).
    """
    fn, _ = select(flash_attention_differentiable, reference, impl)
    return fn(q, k, v, mask=mask, bias=bias, sm_scale=sm_scale, causal=causal,
              return_colsum=return_colsum)
