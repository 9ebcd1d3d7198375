"""kernels_pallas.attention: the Pallas flash kernel (interpreted on CPU) against the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels_pallas import attention as A
from lab.nn import KVCache, Transformer, TransformerConfig

F32_ATOL = 2e-5
BF16_ATOL = 2e-2


def inputs(b, h, hkv, t, s, d, dtype=jnp.float32, seed=0):
    """numpy-drawn q, k, v (in ``dtype``), a per-KV-head mask with row 2 empty, a bias."""
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.normal(size=shape), dtype)
               for shape in ((b, h, t, d), (b, hkv, s, d), (b, hkv, s, d)))
    mask = r.random((b, hkv, t, s)) < 0.7
    mask[:, :, 2:3] = False  # query row 2 (when T > 2) sees no key in any head
    return q, k, v, mask, r.normal(size=(b, h, t, s)).astype(np.float32)


# The reference, jitted once per shape (eager op-by-op dispatch would dominate the test time).
reference = jax.jit(A.reference, static_argnames=("sm_scale", "causal", "return_probs",
                                                  "return_colsum"))


def kernel(q, k, v, **kw):
    """The kernel with small tiles, so that tiny shapes still span several blocks."""
    return A.flash_attention(q, k, v, block_q=8, block_k=8, interpret=True, **kw)


def assert_close(got, want, atol):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=atol, rtol=0)


# (B, H, Hkv, T, S, D): GQA groups 1, 2, 4; T != S; T and S not block multiples.
SHAPES = [(1, 2, 2, 13, 21, 8), (2, 4, 2, 16, 16, 8), (1, 4, 1, 9, 30, 16)]


@pytest.mark.parametrize("shape,masked", [(SHAPES[0], False), *[(x, True) for x in SHAPES]])
def test_kernel_matches_reference_float32(shape, masked):
    q, k, v, mask, bias = inputs(*shape)
    kw = dict(mask=mask, bias=bias) if masked else {}
    out, colsum = kernel(q, k, v, return_colsum=True, **kw)
    ref_out, ref_colsum = reference(q, k, v, return_colsum=True, **kw)
    assert out.shape == q.shape and colsum.shape == (shape[0], shape[1], shape[4])
    assert_close(out, ref_out, F32_ATOL)
    assert_close(colsum, ref_colsum, F32_ATOL)
    if masked:  # the fully masked query row gives zeros, as in the reference
        assert float(jnp.abs(out[:, :, 2]).max()) == 0.0
        # and every other row's probabilities sum to one: colsum totals = live rows
        live = shape[3] - 1
        assert_close(colsum.sum(-1), np.full(colsum.shape[:2], live), 1e-4)


def test_kernel_bfloat16():
    q, k, v, mask, bias = inputs(1, 4, 2, 13, 21, 16, dtype=jnp.bfloat16)
    out, colsum = kernel(q, k, v, mask=mask, bias=bias, return_colsum=True)
    ref_out, ref_colsum = reference(q, k, v, mask=mask, bias=bias, return_colsum=True)
    assert out.dtype == jnp.bfloat16
    assert_close(out, ref_out, BF16_ATOL)
    assert_close(colsum, ref_colsum, BF16_ATOL)


@pytest.mark.parametrize("form", ["per_query_head", "key_padding"])
def test_mask_and_bias_broadcast_forms(form):
    b, h, hkv, t, s, d = 2, 4, 2, 11, 19, 8
    q, k, v, _, _ = inputs(b, h, hkv, t, s, d, seed=3)
    r = np.random.default_rng(0)
    if form == "per_query_head":  # mask [B, H, T, S], bias shared by batch and heads
        kw = dict(mask=r.random((b, h, t, s)) < 0.6, bias=r.normal(size=(1, 1, t, s)))
    else:  # key padding [B, 1, 1, S] (never broadcast in memory), a 2-D bias [T, S]
        lengths = np.array([7, 19])[:, None, None, None]
        kw = dict(mask=np.arange(s)[None, None, None, :] < lengths, bias=r.normal(size=(t, s)))
    out, colsum = kernel(q, k, v, return_colsum=True, **kw)
    ref_out, ref_colsum = reference(q, k, v, return_colsum=True, **kw)
    assert_close(out, ref_out, F32_ATOL)
    assert_close(colsum, ref_colsum, F32_ATOL)


@pytest.mark.parametrize("t,s", [(7, 26), (1, 26), (26, 7)])
def test_causal_flag_equals_explicit_mask(t, s):
    # End-aligned causality: query i sees key j iff j <= i + S - T (T > S leaves early rows empty).
    q, k, v, _, _ = inputs(1, 2, 1, t, s, 8, seed=5)
    tri = np.arange(t)[:, None] + (s - t) >= np.arange(s)[None, :]
    out, colsum = kernel(q, k, v, causal=True, return_colsum=True)
    ref_out, ref_colsum = reference(q, k, v, mask=tri, return_colsum=True)
    assert_close(out, ref_out, F32_ATOL)
    assert_close(colsum, ref_colsum, F32_ATOL)


@pytest.mark.parametrize("t", [65, 200])
def test_causal_query_blocks_equal_one_block(t):
    # reference(causal=True, T == S) takes the queries in blocks that read only their key
    # prefix (65 tokens: blocks of 64 and 1; 200: 64, 64, 64, 8). Same outputs and the same
    # gradients in q, k, v and bias as the one-block path under the explicit mask, with a
    # per-KV-head mask (row 2 empty), a [T, S] bias and a key-only mask.
    assert A.causal_block(t) == 64 and A.causal_block(64) == 0 and A.causal_block(2048) == 128
    q, k, v, mask, bias = inputs(1, 4, 2, t, t, 8, seed=9)
    tri = np.tril(np.ones((t, t), bool))
    for m, bb in ((mask, bias[0, 0]), (mask[:, :1, :1], None)):
        def loss(q, k, v, bb, causal, m=m):
            full = m if causal else np.logical_and(m, tri)
            out = reference(q, k, v, mask=full, bias=bb, causal=causal)
            return jnp.sum(out * jnp.cos(out)), out
        args = (q, k, v, jnp.zeros((t, t)) if bb is None else jnp.asarray(bb))
        (_, got), g_got = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
            *args, True)
        (_, want), g_want = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
            *args, False)
        assert_close(got, want, F32_ATOL)
        for a, b in zip(g_got, g_want, strict=True):
            assert_close(a, b, F32_ATOL)


def test_default_blocks_and_sm_scale():
    # Default (GPU-sized) tiles, a non-default logit scale, under an outer jit.
    q, k, v, mask, bias = inputs(1, 2, 1, 40, 70, 24, seed=7)
    fn = jax.jit(lambda *a: A.attention(*a, mask=mask, sm_scale=0.3, impl="pallas"))
    assert_close(fn(q, k, v), reference(q, k, v, mask=mask, sm_scale=0.3), F32_ATOL)


def test_gradients_through_the_kernel_match_the_reference():
    # TCR learns attention biases through this entry point: q, k, v and bias get gradients.
    q, k, v, mask, bias = inputs(1, 4, 2, 9, 13, 8, seed=9)
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

    def loss(impl, q, k, v, bias):
        out, colsum = A.attention(q, k, v, mask=mask, bias=bias, return_colsum=True, impl=impl)
        return jnp.sum(out * w) + jnp.sum(colsum ** 2)

    got = jax.grad(lambda *a: loss("pallas", *a), argnums=(0, 1, 2, 3))(q, k, v, bias)
    want = jax.grad(lambda *a: loss("xla", *a), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g, r in zip(got, want, strict=True):
        assert g.shape == r.shape
        assert_close(g, r, 1e-5)
    assert float(jnp.abs(got[3]).max()) > 0


CFG = TransformerConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, d_ff=128, max_len=32)


@nnx.jit
def forward(model, tokens, pad):
    return model(tokens, mask=pad, capture=("attn_colsum",))


@nnx.jit
def prefill_then_decode(model, tokens, cache):
    _, cache = model(tokens[:, :-1], cache=cache)
    logits, _ = model(tokens[:, -1:], cache=cache)  # T=1 against a per-KV-head position mask
    return logits


def test_transformer_pallas_logits_equal_xla():
    xla = Transformer(CFG, rngs=nnx.Rngs(0))
    pal = Transformer(TransformerConfig(**{**CFG.__dict__, "attention_impl": "pallas"}),
                      rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, CFG.vocab_size)
    pad = jnp.arange(12)[None, :] < jnp.array([12, 9])[:, None]  # row 1 padded at the end
    want, want_inter = forward(xla, tokens, pad)
    got, got_inter = forward(pal, tokens, pad)
    assert float(jnp.abs(got - want).max()) <= 1e-4
    assert_close(got_inter.attn_colsum, want_inter.attn_colsum, 1e-4)
    cache = KVCache.init(CFG, batch=2, capacity=16)
    lx = prefill_then_decode(xla, tokens[:, :9], cache)
    lp = prefill_then_decode(pal, tokens[:, :9], cache)
    assert float(jnp.abs(lp - lx).max()) <= 1e-4


def test_lab_kernels_env_overrides_automatic_choice(monkeypatch):
    calls = []
    real = A.flash_attention

    def spy(*a, **kw):
        calls.append(kw["interpret"])
        return real(*a, **kw)  # reached through flash_attention_differentiable

    monkeypatch.setattr(A, "flash_attention", spy)
    q, k, v, mask, _ = inputs(1, 2, 1, 5, 9, 8)
    ref = reference(q, k, v, mask=mask)
    monkeypatch.setenv("LAB_KERNELS", "pallas")
    assert_close(A.attention(q, k, v, mask=mask), ref, F32_ATOL)
    assert calls == [jax.default_backend() == "cpu"]
    A.attention(q, k, v, mask=mask, impl="xla")  # an explicit request wins over the variable
    monkeypatch.setenv("LAB_KERNELS", "xla")
    assert_close(A.attention(q, k, v, mask=mask), ref, F32_ATOL)
    assert len(calls) == 1
    monkeypatch.setenv("LAB_KERNELS", "cuda")
    with pytest.raises(ValueError, match="LAB_KERNELS='cuda'"):
        A.attention(q, k, v)


def test_bad_arguments_name_the_problem():
    q, k, v, _, _ = inputs(1, 2, 1, 5, 9, 8)
    with pytest.raises(ValueError, match="impl='triton'"):
        A.attention(q, k, v, impl="triton")
    with pytest.raises(ValueError, match="block_q=24"):
        A.flash_attention(q, k, v, block_q=24, interpret=True)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 5, 9\)"):
        A.flash_attention(q, k, v, mask=jnp.ones((3, 5, 9), bool), interpret=True)
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        A.flash_attention(jnp.zeros((1, 4, 5, 8)), jnp.zeros((1, 3, 9, 8)),
                          jnp.zeros((1, 3, 9, 8)), interpret=True)
