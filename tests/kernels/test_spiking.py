"""The S²-Net spiking scan: Pallas kernel (interpret mode) vs. the jnp reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import spiking as sp

CFG = sp.ScanConfig(beta=0.9, threshold=1.0, omega0=2 * np.pi / 6, window=5, delay=3, slope=5.0,
                    block_b=2)


def _case(t=30, b=5, n=12, seed=0):
    k = jax.random.split(jax.random.key(seed), 6)
    return (jax.random.uniform(k[0], (t, b, n)) * 0.4,
            jax.random.normal(k[1], (n, n)) * 0.2,
            jax.random.normal(k[2], (n, n)) * 0.2,
            jax.random.normal(k[3], (n,)) * 0.02,
            jnp.float32(0.7),
            jax.random.uniform(k[4], (b, n)),
            jax.random.uniform(k[5], (b, n)) * 2 * np.pi)


def test_kernel_equals_reference_in_interpret_mode():
    args = _case()  # batch 5 with blocks of 2: the padded block must not leak in
    ref = sp.reference(*args, config=CFG)
    out = sp.kernel(*args, config=CFG, interpret=True)
    assert float(ref.spikes.sum()) > 20  # the case actually spikes
    for name, r, o in zip(ref._fields, ref, out, strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), atol=1e-5, rtol=1e-5,
                                   err_msg=name)


def test_dispatch_gradients_finite_and_equal_to_reference():
    args = _case(t=20, b=3, n=8, seed=1)

    def loss(fn, w, c, g):
        x, _, _, om, _, v0, p0 = args
        o = fn(x, w, c, om, g, v0, p0, config=CFG)
        return o.spikes.mean() + jnp.mean(o.zre[-1] * jnp.cos(o.psi[-1]))

    def pallas(*a, **k):
        return sp.spiking_scan(*a, impl="pallas", **k)

    g_ref = jax.grad(lambda *a: loss(sp.reference, *a), argnums=(0, 1, 2))(*args[1:3], args[4])
    g_pal = jax.grad(lambda *a: loss(pallas, *a), argnums=(0, 1, 2))(*args[1:3], args[4])
    for r, p in zip(g_ref, g_pal, strict=True):
        assert np.all(np.isfinite(np.asarray(p)))
        np.testing.assert_allclose(np.asarray(p), np.asarray(r), atol=1e-5)
    # Heaviside alone has zero gradient; the surrogate makes the weights learnable.
    assert float(jnp.abs(g_pal[0]).max()) > 1e-4


def test_surrogate_derivative_is_fast_sigmoid():
    x = jnp.array([-0.5, 0.0, 0.2])
    g = jax.grad(lambda x: sp.spike_fn(x, 5.0).sum())(x)
    np.testing.assert_allclose(np.asarray(g), 1.0 / (1.0 + 5.0 * np.abs(np.asarray(x))) ** 2,
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(sp.spike_fn(x, 5.0)), [0.0, 1.0, 1.0])


def test_lif_soft_reset_matches_a_python_loop():
    cfg = sp.ScanConfig(beta=0.5, threshold=1.0, window=4, delay=1)
    t, n = 12, 1
    x = jnp.full((t, 1, n), 0.6)
    zero = jnp.zeros((n, n))
    out = sp.reference(x, zero, zero, jnp.zeros((n,)), 0.0, jnp.zeros((1, n)), jnp.zeros((1, n)),
                       config=cfg)
    v, s, vs, ss = 0.0, 0.0, [], []
    for _ in range(t):
        v = 0.5 * v + 0.6 - s * 1.0
        s = float(v >= 1.0)
        vs.append(v)
        ss.append(s)
    np.testing.assert_allclose(np.asarray(out.membrane[:, 0, 0]), vs, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.spikes[:, 0, 0]), ss)


def test_phasor_is_the_windowed_spike_sum():
    args = _case(t=40, b=2, n=6, seed=2)
    out = sp.reference(*args, config=CFG)
    s = np.asarray(out.spikes)
    t_idx = np.arange(s.shape[0])
    z = np.zeros(s.shape[1:], complex)
    for t in range(s.shape[0]):
        lo = max(0, t - CFG.window + 1)
        z = (s[lo:t + 1] * np.exp(-1j * CFG.omega0 * t_idx[lo:t + 1])[:, None, None]).sum(0)
        np.testing.assert_allclose(np.asarray(out.zre[t]), z.real, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.zim[t]), z.imag, atol=1e-5)
    assert s.sum() > 10


def test_wrong_shapes_are_named():
    x, w, c, om, g, v0, p0 = _case(t=4, b=2, n=5)
    with pytest.raises(ValueError, match=r"weights has shape \(5, 4\); expected \(5, 5\)"):
        sp.reference(x, w[:, :4], c, om, g, v0, p0, config=CFG)
    with pytest.raises(ValueError, match="currents has shape"):
        sp.kernel(x[0], w, c, om, g, v0, p0, config=CFG, interpret=True)
    with pytest.raises(ValueError, match="window=0"):
        sp.ScanConfig(window=0)


def test_compiled_shape_guard():
    assert sp.compiled_shapes_ok(64, 32, 64, 16)
    assert not sp.compiled_shapes_ok(24, 32, 64, 16)  # T not a power of two
    assert not sp.compiled_shapes_ok(64, 4, 64, 16)  # batch block below Triton's 16 rows
