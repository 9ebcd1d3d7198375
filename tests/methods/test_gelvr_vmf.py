"""GeLVR / GePO pure parts: the vMF distribution against scipy, the Gram loss, the hybrid policy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import special, stats

from lab.methods import gelvr
from lab.methods.gelvr import vmf
from lab.train import TrainConfig, compiled_step, make_optimizer

DIMS = (2, 3, 4, 5, 10, 33, 100, 256, 512)
KAPPAS = np.array([1e-3, 1e-2, 0.1, 1.0, 5.0, 9.99, 10.01, 30.0, 100.0, 1e3, 1e4])


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _reference_log_prob(x, mu, kappa):
    """scipy's logpdf; where its ``ive`` under/overflows (large d, small kappa), the same
    formula with mpmath's Bessel function."""
    with np.errstate(divide="ignore"):
        ref = stats.vonmises_fisher(mu, kappa).logpdf(x)
    if np.all(np.isfinite(ref)):
        return ref
    mpmath = pytest.importorskip("mpmath")
    d = mu.shape[0]
    v = d / 2 - 1
    log_c = float(v * mpmath.log(kappa) - (d / 2) * mpmath.log(2 * mpmath.pi)
                  - mpmath.log(mpmath.besseli(v, kappa)))
    return log_c + kappa * (x @ mu)


def _grid_points(rng, d):
    """Per kappa: 4 uniform directions, 4 points near the mode, and the mode itself."""
    mu = _unit(rng.normal(size=(len(KAPPAS), d)))
    far = _unit(rng.normal(size=(4, len(KAPPAS), d)))
    near = _unit(mu + rng.normal(size=(4, len(KAPPAS), d)) / np.sqrt(KAPPAS[:, None] * d))
    return np.concatenate([far, near, mu[None]], 0), mu


def _references(x, mu):
    return np.stack([_reference_log_prob(x[:, i], mu[i], KAPPAS[i])
                     for i in range(len(KAPPAS))], 1)


def test_log_prob_matches_scipy_over_dims_and_kappas():
    """float64: within 1e-5 relative of scipy (mpmath where scipy's ive underflows) for
    every dim 2..512 and kappa 1e-3..1e4."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for d in DIMS:
            x, mu = _grid_points(rng, d)
            got = np.asarray(vmf.vmf_log_prob(jnp.asarray(x), jnp.asarray(mu),
                                              jnp.asarray(KAPPAS)))
            ref = _references(x, mu)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=0, err_msg=f"d={d}")


def test_log_prob_float32_within_input_rounding():
    """float32: 1e-5 relative plus the rounding of ``kappa mu.x`` in float32 inputs
    (4 eps (1 + kappa)); the normaliser itself never overflows (d = 512, kappa = 1e-3)."""
    rng = np.random.default_rng(1)
    eps = float(np.finfo(np.float32).eps)
    for d in (2, 64, 512):
        x, mu = _grid_points(rng, d)
        got = np.asarray(vmf.vmf_log_prob(jnp.asarray(x, jnp.float32),
                                          jnp.asarray(mu, jnp.float32),
                                          jnp.asarray(KAPPAS, jnp.float32)))
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        ref = _references(x, mu)
        tol = 1e-5 * np.abs(ref) + 4 * eps * (1 + KAPPAS)
        assert np.all(np.abs(got - ref) <= tol), (d, np.max(np.abs(got - ref) / tol))


def test_log_ive_matches_mpmath_where_scipy_fails():
    mpmath = pytest.importorskip("mpmath")
    ks = np.array([1e-3, 0.5, 10.0, 10.5, 1e3, 1e5])
    for v in (0.0, 0.5, 7.5, 14.0, 255.0):
        with jax.enable_x64(True):
            got = np.asarray(vmf.log_ive(v, jnp.asarray(ks)))
        ref = np.array([float(mpmath.log(mpmath.besseli(v, k)) - k) for k in ks])
        np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-10, err_msg=f"v={v}")
    with np.errstate(divide="ignore"):
        assert not np.isfinite(np.log(special.ive(255.0, 1e-3)))  # scipy underflows here


def test_normaliser_gradient_is_minus_mean_resultant_length_and_finite():
    """d/dk log C_d(k) = -A_d(k) (Mardia & Jupp 9.3.9); finite for k up to 1e6."""
    ks = jnp.array([1e-3, 1.0, 10.0, 1e3, 1e4, 1e6])
    kk = np.asarray(ks, np.float64)
    for d in (3, 512):
        g = np.asarray(jax.jit(jax.vmap(jax.grad(lambda k, d=d: vmf.log_normalizer(d, k))))(ks))
        assert np.all(np.isfinite(g))
        with np.errstate(invalid="ignore", divide="ignore"):
            a = special.ive(d / 2, kk) / special.ive(d / 2 - 1, kk)
        ok = np.isfinite(a)
        np.testing.assert_allclose(-g[ok], a[ok], rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(vmf.mean_resultant_length(d, ks))[ok], a[ok],
                                   rtol=2e-5, atol=1e-7)
    mu = jnp.asarray(_unit(np.arange(1.0, 9.0)), jnp.float32)
    x = jnp.asarray(_unit(np.arange(1.0, 9.0) + 0.01), jnp.float32)
    grads = jax.jit(jax.grad(lambda x, m, k: jnp.sum(vmf.vmf_log_prob(x, m, k)),
                             argnums=(0, 1, 2)))(x, mu, jnp.array([1e4, 1e6]))
    assert all(np.all(np.isfinite(np.asarray(t))) for t in grads)


def _theta_cdf(d, kappa):
    """The exact CDF of the angle to mu, density ~ exp(k cos t) sin^{d-2} t on [0, pi]."""
    g = np.unique(np.concatenate([np.linspace(0, np.pi, 100_001),
                                  np.geomspace(1e-9, np.pi, 20_000)]))
    logf = kappa * (np.cos(g) - 1) + (d - 2) * np.log(np.maximum(np.sin(g), 1e-300))
    f = np.exp(logf - logf.max())
    cdf = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2 * np.diff(g))])
    return g, cdf / cdf[-1]


@pytest.mark.parametrize("d", [2, 64])
def test_samples_mean_resultant_length_and_cosine_distribution(d):
    """Unit vectors; mean of mu.x within 4 Monte Carlo standard errors of A_d(kappa); the
    angle to mu passes a Kolmogorov-Smirnov test against its exact law."""
    ks = np.array([1e-3, 1.0, 30.0, 1e4])
    n = 3000
    rng = np.random.default_rng(d)
    mu = _unit(rng.normal(size=(len(ks), d)))
    draw = jax.jit(lambda key, m, k: vmf.vmf_sample(key, m, k, (n, len(ks))))
    x = np.asarray(draw(jax.random.key(d), jnp.asarray(mu, jnp.float32),
                        jnp.asarray(ks, jnp.float32)), np.float64)
    assert x.shape == (n, len(ks), d)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=2e-6)
    w = np.einsum("nkd,kd->nk", x, mu)
    with np.errstate(invalid="ignore"):
        a = special.ive(d / 2, ks) / special.ive(d / 2 - 1, ks)
    a = np.where(np.isfinite(a), a, ks / d)  # A_d(k) ~ k / d for small k
    z = (w.mean(0) - a) / (w.std(0) / math.sqrt(n))
    assert np.all(np.abs(z) < 4), z
    theta = 2 * np.arcsin(np.clip(np.linalg.norm(x - mu[None], axis=-1) / 2, 0, 1))
    for i, k in enumerate(ks):
        g, cdf = _theta_cdf(d, k)
        p = stats.kstest(theta[:, i], lambda t, g=g, cdf=cdf: np.interp(t, g, cdf)).pvalue
        assert p > 1e-3, (d, k, p)


def test_sampler_under_vmap_matches_unbatched_calls():
    """vmap over keys, mus and kappas returns exactly the per-call samples (each sample's
    rejection loop runs until it is accepted, whatever its batch-mates do)."""
    d = 5
    rng = np.random.default_rng(3)
    mus = jnp.asarray(_unit(rng.normal(size=(3, d))), jnp.float32)
    ks = jnp.array([0.5, 50.0, 5e3], jnp.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    one = jax.jit(lambda key, m, k: vmf.vmf_sample(key, m, k, (16,)))
    batched = np.asarray(jax.vmap(one)(keys, mus, ks))
    looped = np.stack([np.asarray(one(keys[i], mus[i], ks[i])) for i in range(3)])
    np.testing.assert_allclose(batched, looped, atol=1e-6)  # same draws, fused differently
    assert batched.shape == (3, 16, d)
    # At kappa = 5e3 every sample lies within a few 1/sqrt(kappa) of mu.
    assert np.min(batched[2] @ np.asarray(mus[2])) > 1 - 20 / 5e3


def test_bad_input_is_rejected_eagerly_and_nan_under_jit():
    mu = jnp.array([0.6, 0.8, 0.0])
    x = jnp.array([1.0, 0.0, 0.0])
    for kappa in (0.0, -1.0):
        with pytest.raises(ValueError, match="kappa"):
            vmf.vmf_log_prob(x, mu, kappa)
        with pytest.raises(ValueError, match="kappa"):
            vmf.vmf_sample(jax.random.key(0), mu, kappa, (2,))
    with pytest.raises(ValueError, match="unit vector"):
        vmf.vmf_log_prob(x, 2.0 * mu, 1.0)
    with pytest.raises(ValueError, match="unit vector"):
        vmf.vmf_sample(jax.random.key(0), mu * 1.01, 1.0)
    with pytest.raises(ValueError, match="d >= 2"):
        vmf.vmf_log_prob(jnp.ones(1), jnp.ones(1), 1.0)
    with pytest.raises(ValueError, match="dimension"):
        vmf.vmf_log_prob(jnp.ones(4) / 2, mu, 1.0)
    with pytest.raises(ValueError, match="broadcast"):
        vmf.vmf_sample(jax.random.key(0), jnp.stack([mu, mu]), 1.0, (3,))
    traced = jax.jit(vmf.vmf_log_prob)(x, jnp.stack([mu, 2 * mu]), jnp.array([1.0, 1.0]))
    assert np.isfinite(traced[0]) and np.isnan(traced[1])
    traced = jax.jit(vmf.vmf_log_prob)(x, mu, jnp.array([1.0, 0.0]))
    assert np.isfinite(traced[0]) and np.isnan(traced[1])


# ----------------------------------------------------------------------------- Gram loss


def _orthogonal(rng, n):
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return q


def test_gram_loss_zero_for_aligned_structure_and_invariant():
    rng = np.random.default_rng(0)
    targets = rng.normal(size=(2, 6, 8)).astype(np.float32)
    # Slots of another width with the same structure: an isometric embedding 8 -> 12,
    # rotated, with per-slot positive scales.
    embed = _orthogonal(rng, 12)[:, :8].T  # [8, 12], orthonormal rows
    slots = (targets @ embed) * rng.uniform(0.5, 3.0, size=(2, 6, 1))
    assert float(gelvr.gram_alignment_loss(jnp.asarray(slots), jnp.asarray(targets))) < 1e-10
    random_slots = jnp.asarray(rng.normal(size=(2, 6, 12)), jnp.float32)
    base = float(gelvr.gram_alignment_loss(random_slots, jnp.asarray(targets)))
    assert base > 0.05
    moved = 7.5 * targets @ _orthogonal(rng, 8)  # rotated and rescaled targets
    np.testing.assert_allclose(
        float(gelvr.gram_alignment_loss(random_slots, jnp.asarray(moved))), base, rtol=1e-5)
    # Targets with twice the slots (each repeated) pool back to the same structure.
    doubled = np.repeat(targets, 2, axis=1)
    np.testing.assert_allclose(
        float(gelvr.gram_alignment_loss(random_slots, jnp.asarray(doubled))), base, rtol=1e-5)


def test_gram_loss_mask_ignores_padded_slots_and_rejects_bad_shapes():
    rng = np.random.default_rng(1)
    targets = rng.normal(size=(1, 4, 8)).astype(np.float32)
    slots = np.concatenate([targets, rng.normal(size=(1, 1, 8)).astype(np.float32)], 1)
    padded = np.concatenate([targets, targets[:, :1]], 1)
    mask = jnp.array([[1, 1, 1, 1, 0]])
    assert float(gelvr.gram_alignment_loss(jnp.asarray(slots), jnp.asarray(padded))) > 0
    assert float(gelvr.gram_alignment_loss(jnp.asarray(slots), jnp.asarray(padded),
                                           mask)) < 1e-10
    with pytest.raises(ValueError, match="S >= 2"):
        gelvr.gram_alignment_loss(jnp.ones((1, 1, 4)), jnp.ones((1, 3, 4)))
    with pytest.raises(ValueError, match="equal B"):
        gelvr.gram_alignment_loss(jnp.ones((2, 3, 4)), jnp.ones((1, 3, 4)))
    np.testing.assert_allclose(gelvr.pooling_matrix(5, 2),
                               [[1 / 3, 1 / 3, 1 / 3, 0, 0], [0, 0, 1 / 3, 1 / 3, 1 / 3]])


def test_slot_loss_is_one_minus_each_slots_cosine_with_its_pooled_target():
    rng = np.random.default_rng(2)
    targets = rng.normal(size=(2, 8, 6)).astype(np.float32)
    pooled = targets.reshape(2, 4, 2, 6).mean(2)             # 8 targets -> 4 slots
    aligned = pooled * rng.uniform(0.5, 3.0, size=(2, 4, 1))
    assert float(gelvr.slot_alignment_loss(jnp.asarray(aligned), jnp.asarray(targets))) < 1e-6
    slots = rng.normal(size=(2, 4, 6)).astype(np.float32)
    cos = (slots * pooled).sum(-1) / np.linalg.norm(slots, axis=-1) / np.linalg.norm(
        pooled, axis=-1)
    np.testing.assert_allclose(
        float(gelvr.slot_alignment_loss(jnp.asarray(slots), jnp.asarray(targets))),
        np.mean(1 - cos), rtol=1e-5)
    # unlike the Gram loss it is not rotation invariant: a rotated target moves it
    rotated = jnp.asarray(aligned @ _orthogonal(rng, 6))
    assert float(gelvr.slot_alignment_loss(rotated, jnp.asarray(targets))) > 0.1
    assert float(gelvr.gram_alignment_loss(rotated, jnp.asarray(targets))) < 1e-8
    with pytest.raises(ValueError, match=r"equal B, d"):
        gelvr.slot_alignment_loss(jnp.ones((1, 2, 4)), jnp.ones((1, 2, 5)))


# ----------------------------------------------------------------------------- hybrid policy


def _hand_case(family):
    """B=1, T=3: token, latent, token; d=3, V=4."""
    logits = jnp.array([[[1.0, 2.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 1.0, 2.0]]])
    h = jnp.array([[[9.0, 9.0, 9.0], [0.0, 3.0, 4.0], [1.0, 1.0, 1.0]]])
    param = jnp.array([[1.0, 2.5, 1.0]])
    z = np.array([0.0, 0.6, 0.8]) if family == "vmf" else np.array([0.5, 2.0, 3.0])
    latents = jnp.zeros((1, 3, 3)).at[0, 1].set(z)
    tokens = jnp.array([[1, 0, 3]])
    is_latent = jnp.array([[False, True, False]])
    return gelvr.HybridPolicyOutput(logits, h, param), tokens, latents, is_latent, z


@pytest.mark.parametrize("family", ["vmf", "gaussian"])
def test_hybrid_log_prob_is_the_sum_of_its_parts(family):
    out, tokens, latents, is_latent, z = _hand_case(family)
    step = gelvr.hybrid_log_prob(out, tokens, latents, is_latent, family=family,
                                 temperature=2.0)
    l0, l2 = np.array([1.0, 2.0, 0.0, -1.0]) / 2, np.array([3.0, 0.0, 1.0, 2.0]) / 2
    tok = (l0[1] - special.logsumexp(l0)) + (l2[3] - special.logsumexp(l2))
    if family == "vmf":
        lat = stats.vonmises_fisher(np.array([0.0, 0.6, 0.8]), 2.5).logpdf(z)
    else:
        lat = stats.multivariate_normal(np.array([0.0, 3.0, 4.0]), 2.5**2).logpdf(z)
    total = float(gelvr.trajectory_log_prob(step, jnp.ones((1, 3)))[0])
    np.testing.assert_allclose(total, tok + lat, rtol=1e-5)
    np.testing.assert_allclose(float(step[0, 1]), lat, rtol=1e-5)
    with pytest.raises(ValueError, match="family"):
        gelvr.hybrid_log_prob(out, tokens, latents, is_latent, family="normal")


class _TinyPolicy(nnx.Module):
    """A hybrid policy over fixed per-step features: token logits, a latent head, and a
    fixed concentration."""

    def __init__(self, d_in, vocab, d_latent, param, *, rngs):
        self.tok = nnx.Linear(d_in, vocab, rngs=rngs)
        self.lat = nnx.Linear(d_in, d_latent, rngs=rngs)
        self.param = param

    def __call__(self, feats):
        return gelvr.HybridPolicyOutput(self.tok(feats), self.lat(feats),
                                        jnp.full(feats.shape[:2], self.param))


def _forward(model, batch):
    return model(batch["features"])


def _rollout_batch(model, family, seed=0):
    b, t, s = 4, 6, 3
    rng = np.random.default_rng(seed)
    feats = jnp.asarray(rng.normal(size=(b, t, 5)), jnp.float32)
    is_latent = jnp.zeros((b, t), bool).at[:, 1:1 + s].set(True)
    out = model(feats)
    tokens, latents = gelvr.hybrid_sample(jax.random.key(seed), out, is_latent,
                                          family=family)
    return {"features": feats, "targets": tokens, "latents": latents, "is_latent": is_latent,
            "slot_positions": jnp.tile(jnp.arange(1, 1 + s), (b, 1)),
            "mask": jnp.ones((b, t)), "advantages": jnp.array([1.0, -1.0, 0.5, -0.5]),
            "geometry_target": jnp.asarray(rng.normal(size=(b, 2 * s, 7)), jnp.float32)}


def test_gepo_gradients_finite_at_large_kappa():
    """d loss / d (logits, head, kappa) of the full GePO loss (clipped ratio, KL, Gram
    regulariser) stays finite at kappa = 1e4 with non-unit head outputs."""
    out, tokens, latents, is_latent, _ = _hand_case("vmf")
    rng = np.random.default_rng(0)
    batch = {"mask": jnp.ones((1, 3)), "advantages": jnp.array([1.5]),
             "old_logp": jnp.full((1, 3), -1.0), "ref_logp": jnp.full((1, 3), -2.0),
             "kl_coef": jnp.array([0.1]),
             "geometry_target": jnp.asarray(rng.normal(size=(1, 4, 5)), jnp.float32)}

    def loss(logits, h, kappa):
        o = gelvr.HybridPolicyOutput(logits, h, kappa)
        step = gelvr.hybrid_log_prob(o, tokens, latents, is_latent)
        slots = gelvr.gather_slots(h, jnp.array([[0, 1]]))
        return gelvr.gepo_loss(step, batch, slots, geometry_coef=1.0)[0]

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(out.logits, out.latent_mean,
                                                      jnp.full((1, 3), 1e4))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
    assert float(jnp.abs(grads[1]).sum()) > 0


@pytest.mark.deep
def test_gepo_loss_in_the_learners_step_finite_at_large_kappa_and_regulariser_moves_geometry():
    """GePOLoss runs in lab.train's jitted step (the RL learner's update) at kappa = 1e4 with
    finite metrics; with zero advantages its updates lower the Gram loss (the regulariser
    acts), and at geometry_coef = 0 the same updates leave the parameters unchanged."""
    model = _TinyPolicy(5, 11, 8, 1e4, rngs=nnx.Rngs(0))
    batch = _rollout_batch(model, "vmf")
    assert np.allclose(np.linalg.norm(np.asarray(batch["latents"]), axis=-1), 1, atol=1e-5)
    tcfg = TrainConfig(steps=30, learning_rate=0.05, optimizer="adam", grad_clip=0.0,
                       progress=False)
    geo_batch = dict(batch, advantages=jnp.zeros(4))
    results = {}
    for coef in (1.0, 0.0):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        opt_state = make_optimizer(tcfg).init(params)
        step = compiled_step(graphdef, gelvr.GePOLoss(_forward, geometry_coef=coef), tcfg,
                             False)
        params, rest = jax.tree.map(jnp.copy, (params, rest))
        start = jax.tree.map(np.asarray, params)
        history = []
        batches = [batch] + [geo_batch] * 29 if coef else [geo_batch] * 3
        for u, b in enumerate(batches):
            params, rest, opt_state, metrics = step(params, rest, opt_state, b, jnp.int32(u),
                                                    jax.random.key(0))
            history.append(jax.device_get(metrics))
        results[coef] = history, start, params
    history = results[1.0][0]
    assert all(np.isfinite(v) for v in history[0].values()), history[0]
    assert history[0]["ratio"] == pytest.approx(1.0)
    before, after = history[1]["geometry"], history[-1]["geometry"]
    assert after < 0.8 * before, (before, after)
    # geometry_coef = 0 with zero advantages: no gradient at all, parameters stay put.
    flat, start, end = results[0.0]
    assert flat[-1]["geometry"] == pytest.approx(history[0]["geometry"], rel=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, np.asarray(b), atol=1e-7),
                 start, end)


@pytest.mark.parametrize("family", ["vmf", "gaussian"])
def test_policy_gradient_step_raises_the_log_prob_of_a_rewarded_latent(family):
    """One REINFORCE step with advantage +1 on a trajectory raises its log-probability and
    -1 lowers it, for both latent families (no regulariser: the ablation baselines)."""
    loss_fn = gelvr.GePOLoss(_forward, family=family, geometry_coef=0.0)

    @nnx.jit
    def logp(m, batch):
        out = m(batch["features"])
        return jnp.sum(gelvr.hybrid_log_prob(out, batch["targets"], batch["latents"],
                                             batch["is_latent"], family=family))

    @nnx.jit
    def sgd(m, batch):
        grads = nnx.grad(lambda m_: loss_fn(m_, batch)[0])(m)
        nnx.update(m, jax.tree.map(lambda p, g: p - 0.01 * g, nnx.state(m, nnx.Param), grads))

    for sign in (1.0, -1.0):
        model = _TinyPolicy(5, 11, 8, 5.0 if family == "vmf" else 0.5, rngs=nnx.Rngs(1))
        batch = _rollout_batch(model, family, seed=2)
        batch = dict(batch, advantages=jnp.full(4, sign))
        batch.pop("geometry_target")
        before = float(logp(model, batch))
        sgd(model, batch)
        assert sign * (float(logp(model, batch)) - before) > 0, (family, sign)
    with pytest.raises(ValueError, match="geometry_target"):
        gelvr.GePOLoss(_forward, geometry_coef=0.5)(model, batch)
    with pytest.raises(ValueError, match="family"):
        gelvr.GePOLoss(_forward, family="cauchy")
