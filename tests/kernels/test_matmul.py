"""Tiled and block-scaled matmul: Pallas (interpret mode) against the jnp references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import lowp
from kernels_pallas.matmul import (
    MatmulConfig,
    matmul,
    reference,
    scaled_matmul,
    scaled_reference,
    tile_coords,
)

RS = np.random.RandomState(0)
A = jnp.asarray(RS.randn(40, 72), jnp.float32)     # M=40, K=72: not multiples of the tiles
B = jnp.asarray(RS.randn(72, 24), jnp.float32)
BIAS = jnp.asarray(RS.randn(24), jnp.float32)


@pytest.mark.parametrize("config", [
    MatmulConfig(32, 16, 16),                               # padding in M, N and K
    MatmulConfig(16, 16, 8, split_k=3, group_m=2),          # split-K, swizzle
    MatmulConfig(16, 16, 24, grid_order="nm", group_m=2),
])
def test_matmul_with_fused_epilogue_matches_reference(config):
    got = matmul(A, B, bias=BIAS, activation="gelu", scale=0.5, config=config, impl="pallas")
    want = reference(A, B, bias=BIAS, activation="gelu", scale=0.5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_bf16_inputs_accumulate_in_float32():
    a, b = A[:32, :32].astype(jnp.bfloat16), B[:32, :16].astype(jnp.bfloat16)
    got = matmul(a, b, config=MatmulConfig(16, 16, 16), impl="pallas", out_dtype=jnp.float32)
    want = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_swizzle_visits_every_tile_once():
    for order in ("mn", "nm"):
        for group in (1, 2, 3):
            seen = {tuple(int(v) for v in tile_coords(t, 5, 3, group, order)) for t in range(15)}
            assert seen == {(i, j) for i in range(5) for j in range(3)}, (order, group)
    # group_m=2: consecutive programs walk down two tile rows before moving right
    assert [tuple(int(v) for v in tile_coords(t, 4, 4, 2, "mn")) for t in range(4)] == [
        (0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize("fmt,scaling", [("bf16", "tensor"), ("fp8_e4m3", "row"),
                                         ("fp8_e5m2", "tensor"), ("mxfp4", "tensor"),
                                         ("nvfp4", "tensor")])
def test_block_scaled_matmul_equals_dequantize_then_matmul(fmt, scaling):
    qa = lowp.quantize(A[:32, :64], fmt, axis=1, scaling=scaling)
    qb = lowp.quantize(B[:64, :16], fmt, axis=0, scaling=scaling)
    got = scaled_matmul(qa, qb, bias=BIAS[:16], config=MatmulConfig(16, 16, 32), impl="pallas")
    want = scaled_reference(qa, qb, bias=BIAS[:16])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    # and the low-precision product approximates the float32 one
    exact = A[:32, :64] @ B[:64, :16] + BIAS[:16]
    rel = float(jnp.abs(want - exact).max() / jnp.abs(exact).max())
    assert rel < {"bf16": 0.01, "fp8_e4m3": 0.08, "fp8_e5m2": 0.15}.get(fmt, 0.3), rel


def test_dispatch_default_on_cpu_is_the_xla_reference():
    if jax.default_backend() != "cpu":
        pytest.skip("the automatic choice is the kernel on accelerators")
    np.testing.assert_array_equal(np.asarray(matmul(A, B)), np.asarray(reference(A, B)))


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match=r"a \[M, K\] and b \[K, N\]"):
        matmul(A, A, impl="pallas")
    with pytest.raises(ValueError, match="split_k=4 does not divide the 3 K tiles"):
        matmul(A, B, config=MatmulConfig(16, 16, 24, split_k=4), impl="pallas")
    with pytest.raises(ValueError, match="MatmulConfig.grid_order='km'"):
        matmul(A, B, config=MatmulConfig(grid_order="km"), impl="pallas")
    with pytest.raises(ValueError, match="activation='tanh2'"):
        matmul(A, B, activation="tanh2", impl="pallas")
    qa = lowp.quantize(A, "mxfp4", axis=1)
    with pytest.raises(ValueError, match="formats 'mxfp4' and 'nvfp4'"):
        scaled_matmul(qa, lowp.quantize(B, "nvfp4", axis=0), impl="pallas")
    with pytest.raises(ValueError, match="b along axis 0"):
        scaled_matmul(qa, lowp.quantize(B, "mxfp4", axis=1), impl="pallas")
