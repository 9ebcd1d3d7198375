"""Fused RMSNorm: Pallas (interpret mode) against the jnp reference and lab.nn's RMSNorm."""

import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.rmsnorm import reference, rmsnorm

RS = np.random.RandomState(0)
X = jnp.asarray(RS.randn(2, 5, 32), jnp.float32)     # 10 rows: not a multiple of block_rows=4
W = jnp.asarray(RS.rand(32) + 0.5, jnp.float32)


def test_rmsnorm_matches_reference_and_formula():
    got = rmsnorm(X, W, block_rows=4, impl="pallas")
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference(X, W)), rtol=1e-6, atol=1e-6)
    x = np.asarray(X, np.float64)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(W)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_fused_residual_add_returns_normed_and_sum():
    res = jnp.asarray(RS.randn(2, 5, 32), jnp.float32)
    y, h = rmsnorm(X.astype(jnp.bfloat16), W, residual=res, block_rows=4, impl="pallas")
    y_ref, h_ref = reference(X.astype(jnp.bfloat16), W, residual=res)
    assert y.dtype == jnp.bfloat16 and h.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(h, np.float32), np.asarray(h_ref, np.float32))
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(y_ref, np.float32),
                               rtol=1e-2, atol=1e-2)


def test_matches_lab_nn_rmsnorm():
    from lab.nn.layers import RMSNorm

    norm = RMSNorm(32, eps=1e-6)
    norm.weight[...] = W
    np.testing.assert_allclose(np.asarray(rmsnorm(X, W, impl="pallas")), np.asarray(norm(X)),
                               rtol=1e-6, atol=1e-6)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"weight \[D\]"):
        rmsnorm(X, W[:16], impl="pallas")
    with pytest.raises(ValueError, match="block_rows=0"):
        rmsnorm(X, W, block_rows=0, impl="pallas")
