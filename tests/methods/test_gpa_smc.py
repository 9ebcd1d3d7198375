"""GPA's SMC pieces: resampling is unbiased, ESS is right, tempering hits its target."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lab.methods.gpa import smc

WEIGHTS = jnp.array([0.05, 0.3, 0.0, 0.15, 0.5])


@pytest.mark.parametrize("scheme", smc.SCHEMES)
def test_resampling_is_unbiased(scheme):
    # E[count_i] = N w_i; over 2,000 keys the mean count is within 4 standard errors.
    n, reps = 64, 2000
    keys = jax.random.split(jax.random.key(0), reps)
    w = jax.random.dirichlet(jax.random.key(1), jnp.ones(n))
    idx = jax.vmap(lambda k: smc.resample(k, w, n, scheme))(keys)
    counts = jax.vmap(lambda i: jnp.bincount(i, length=n))(idx)
    mean, se = counts.mean(0), counts.std(0) / np.sqrt(reps) + 1e-3
    assert np.all(np.abs(mean - n * w) < 4 * se + 0.02), scheme


@pytest.mark.parametrize("scheme", ["systematic", "residual"])
def test_low_variance_counts_within_floor_and_ceil(scheme):
    n = 100
    w = jax.random.dirichlet(jax.random.key(2), jnp.ones(n))
    for seed in range(20):
        counts = np.bincount(np.asarray(smc.resample(jax.random.key(seed), w, n, scheme)),
                             minlength=n)
        assert np.all(counts >= np.floor(n * np.asarray(w)) - 1e-9)
        if scheme == "systematic":
            assert np.all(counts <= np.ceil(n * np.asarray(w)) + 1e-9)


def test_matches_blackjax_bit_for_bit():
    resampling = pytest.importorskip("blackjax.smc.resampling")
    w = jax.random.dirichlet(jax.random.key(3), jnp.ones(257))
    for scheme in ("systematic", "stratified"):
        ours = smc.resample(jax.random.key(4), w, 300, scheme)
        ref = getattr(resampling, scheme)(jax.random.key(4), w, 300)
        np.testing.assert_array_equal(ours, ref)


def test_ess_of_uniform_and_one_hot():
    assert float(smc.ess(jnp.zeros(128))) == pytest.approx(128.0, rel=1e-5)
    one_hot = jnp.full(128, -jnp.inf).at[7].set(0.0)
    assert float(smc.ess(one_hot)) == pytest.approx(1.0, rel=1e-6)


def test_next_temperature_hits_the_target_ess():
    reward = jax.random.normal(jax.random.key(5), (1000,)) * 5.0
    beta = smc.next_temperature(reward, jnp.asarray(0.0), 0.5)
    assert 0.0 < float(beta) < 1.0
    assert float(smc.ess(beta * reward)) == pytest.approx(500.0, rel=1e-3)
    # A flat reward never lowers the ESS: jump straight to beta = 1.
    assert float(smc.next_temperature(jnp.zeros(10), jnp.asarray(0.2), 0.5)) == 1.0


def test_bad_weights_are_named():
    with pytest.raises(ValueError, match="sum to 0"):
        smc.resample(jax.random.key(0), jnp.zeros(4), 4)
    with pytest.raises(ValueError, match="NaN at index 1"):
        smc.resample(jax.random.key(0), jnp.array([0.5, jnp.nan, 0.5]), 3)
    with pytest.raises(ValueError, match="all -inf"):
        smc.normalize(jnp.full(3, -jnp.inf))
    with pytest.raises(ValueError, match="scheme='bogus'"):
        smc.resample(jax.random.key(0), WEIGHTS, 5, "bogus")


def test_annealed_sampler_reaches_the_enumerable_tilted_target():
    # Sequences of length 4 over ACGT (256 states), an independent-site prior and a
    # reward; the exact target p(x) exp(r(x) / tau) is enumerated and compared with the
    # population's empirical distribution by total variation.
    from lab.methods.gpa.sampler import GPAConfig, gpa

    length, tau = 4, 0.5
    site_logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (length, 4)))
    table = jax.random.normal(jax.random.key(1), (4 ** length,)) * 1.5
    code = lambda x: jnp.sum(x * (4 ** jnp.arange(length - 1, -1, -1)), -1)
    reward = jax.jit(lambda x: table[code(x)])
    init = lambda k, n: jax.random.categorical(k, site_logp, shape=(n, length))

    @jax.jit
    def propose(k, x):  # resample a suffix from the prior's own conditional: correction 0
        kc, ks = jax.random.split(k)
        cut = jax.random.randint(kc, (x.shape[0], 1), 0, length)
        fresh = jax.random.categorical(ks, site_logp, shape=x.shape)
        return jnp.where(jnp.arange(length)[None] >= cut, fresh, x), jnp.zeros(x.shape[0])

    pop = gpa(jax.random.key(2), init, propose, reward,
              GPAConfig(num_particles=4096, tau=tau, mutation_steps=3, final_steps=3))
    grid = jnp.meshgrid(*[jnp.arange(4)] * length, indexing="ij")
    all_x = jnp.stack(grid, -1).reshape(-1, length)
    log_target = jnp.sum(site_logp[jnp.arange(length), all_x], -1) + table[code(all_x)] / tau
    target = np.asarray(jax.nn.softmax(log_target))
    empirical = np.bincount(np.asarray(code(pop.x)), minlength=4 ** length) / pop.x.shape[0]
    prior = np.asarray(jax.nn.softmax(jnp.sum(site_logp[jnp.arange(length), all_x], -1)))
    tv, tv_prior = 0.5 * np.abs(empirical - target).sum(), 0.5 * np.abs(prior - target).sum()
    assert tv_prior > 0.4  # the tilt moves the distribution far from the prior ...
    assert tv < 0.08, (tv, tv_prior)  # ... and the sampler follows it
    assert pop.history[-1]["beta"] == 1.0 and pop.oracle_calls > 4096


def test_suffix_resampling_with_a_prefilled_prefix_equals_decoding_every_base():
    """keep= runs the kept prefix in one forward: the same samples (one key per position)
    and the same log-likelihoods as decoding all L positions one by one."""
    from flax import nnx

    from lab.methods.gpa import generators

    length, n = 24, 64
    ar = generators.Transformer(generators.generator_config("ar", length, d_model=32,
                                                            n_layers=2), rngs=nnx.Rngs(3))
    seqs = jax.random.randint(jax.random.key(0), (n, length), 0, 4)
    cut = length - jax.random.randint(jax.random.key(1), (n,), 1, 9)
    key = jax.random.key(2)
    slow, lp_slow = generators.ar_resample_suffix(ar, key, seqs, cut)
    fast, lp_fast = generators.ar_resample_suffix(ar, key, seqs, cut, keep=length - 8)
    assert np.array_equal(np.asarray(fast[:, :16]), np.asarray(seqs[:, :16]))
    assert np.mean(np.asarray(fast) == np.asarray(slow)) > 0.999
    np.testing.assert_allclose(np.asarray(lp_fast), np.asarray(lp_slow), atol=1e-4)
    assert not np.array_equal(np.asarray(fast), np.asarray(seqs))  # the suffixes were resampled
    with pytest.raises(ValueError, match="keep=20 but a row's cut is"):
        generators.ar_resample_suffix(ar, key, seqs, cut, keep=20)
    with pytest.raises(ValueError, match="keep=25; expected 0 <= keep"):
        generators.ar_resample_suffix(ar, key, seqs, cut, keep=25)
