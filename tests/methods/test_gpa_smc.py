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


def _np_cess(log_w, log_inc):
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    inc = np.exp(log_inc - log_inc.max())
    return len(w) * (w @ inc) ** 2 / (w @ inc ** 2)


def test_conditional_ess_and_its_bisection_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    log_w, r = rng.normal(size=300) * 1.5, rng.normal(size=300) * 3.0
    for delta in (0.0, 0.05, 0.3, 2.0):
        got = float(smc.conditional_ess(jnp.asarray(log_w), jnp.asarray(delta * r)))
        assert got == pytest.approx(_np_cess(log_w, delta * r), rel=1e-4), delta
    # uniform current weights: the CESS is the incremental weights' ESS
    assert float(smc.conditional_ess(jnp.zeros(300), jnp.asarray(0.3 * r))) == pytest.approx(
        float(smc.ess(jnp.asarray(0.3 * r))), rel=1e-4)
    lo, hi = 0.1, 1.0  # numpy bisection on beta' in (0.1, 1] for CESS = 0.5 N
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _np_cess(log_w, (mid - 0.1) * r) >= 150 else (lo, mid)
    beta = float(smc.next_temperature(jnp.asarray(r), jnp.asarray(0.1), 0.5,
                                      log_weights=jnp.asarray(log_w)))
    assert beta == pytest.approx(lo, abs=1e-4)
    # the plain incremental-weight ESS rule would pick another temperature here
    plain = float(smc.next_temperature(jnp.asarray(r), jnp.asarray(0.1), 0.5))
    assert abs(plain - beta) > 0.01, (plain, beta)


# --- the generator moves leave the tempered target invariant (length-4 sequences) -----------

L4, TAU = 4, 0.5


def _code(x):
    return jnp.sum(x * (4 ** jnp.arange(L4 - 1, -1, -1)), -1)


def _tiny(kind, sharpen):
    """A random length-4 generator whose weights are scaled so its conditionals are sharp."""
    from flax import nnx

    from lab.methods.gpa import generators

    model = generators.Transformer(generators.generator_config(kind, L4, d_model=16,
                                                               n_layers=1, n_heads=2),
                                   rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a * sharpen if a.ndim >= 2 else a, state))


def _chain_tv(prior_logp_table, propose, n=16384, steps=6):
    """Starts ``n`` chains exactly at the target ``p exp(r / TAU)`` (enumerated over the 256
    sequences), applies ``steps`` MH moves, returns the total variation to the target."""
    from lab.methods.gpa.sampler import mh_step

    grid = jnp.stack(jnp.meshgrid(*[jnp.arange(4)] * L4, indexing="ij"), -1).reshape(-1, L4)
    table = jax.random.normal(jax.random.key(1), (4 ** L4,))
    reward = jax.jit(lambda x: table[_code(x)])
    log_target = prior_logp_table + table / TAU
    target = np.asarray(jax.nn.softmax(log_target))
    x = grid[jax.random.categorical(jax.random.key(2), log_target, shape=(n,))]
    r, key = reward(x), jax.random.key(3)
    for _ in range(steps):
        key, k = jax.random.split(key)
        x, r, _ = mh_step(k, x, r, beta=1.0, tau=TAU, propose=propose, reward=reward)
    emp = np.bincount(np.asarray(_code(x)), minlength=4 ** L4) / n
    return 0.5 * np.abs(emp - target).sum()


def _grid():
    return jnp.stack(jnp.meshgrid(*[jnp.arange(4)] * L4, indexing="ij"), -1).reshape(-1, L4)


@pytest.mark.slow
def test_ar_span_move_leaves_the_tempered_target_invariant():
    # 16,384 chains started on the exact target stay within sampling noise of it (TV of an
    # exact sample of that size is ~0.03); the same proposal without the suffix
    # correction drifts away (the review's kernel: prefix resampling, reward-only MH).
    from lab.methods.gpa import design, generators

    ar = _tiny("ar", 4.0)
    logp = design.ar_loglik_fn(ar)(_grid())
    assert float(jnp.exp(logp).sum()) == pytest.approx(1.0, abs=1e-4)  # a normalised prior
    propose = generators.ar_span_proposal(ar, 2)
    tv = _chain_tv(logp, propose)
    tv_wrong = _chain_tv(logp, lambda k, x: (propose(k, x)[0], jnp.zeros(x.shape[0])))
    assert tv < 0.045, tv
    assert tv_wrong > tv + 0.02, (tv, tv_wrong)


@pytest.mark.slow
def test_diffusion_move_with_the_proposal_ratio_leaves_the_target_invariant():
    from lab.methods.gpa import generators

    diff = _tiny("diffusion", 4.0)
    prior = jax.nn.log_softmax(jax.random.normal(jax.random.key(7), (4 ** L4,)) * 1.5)
    propose = generators.diffusion_proposal(diff, 2, jax.jit(lambda x: prior[_code(x)]))
    tv = _chain_tv(prior, propose)
    no_ratio = lambda k, x: (lambda new, c: (new, prior[_code(new)] - prior[_code(x)]))(
        *propose(k, x))  # the prior ratio without the proposal ratio
    tv_wrong = _chain_tv(prior, no_ratio)
    assert tv < 0.045, tv
    assert tv_wrong > tv + 0.02, (tv, tv_wrong)


def test_span_move_changes_every_position_and_its_correction_is_exact():
    """Every position of a 16-base sequence changes with positive probability (the span
    starts anywhere), bases outside the span never change, and the correction equals
    log p(x') q(x|x') - log p(x) q(x'|x) with p and q from fresh forwards."""
    from flax import nnx

    from lab.methods.gpa import design, generators

    length, n = 16, 2048
    ar = generators.Transformer(generators.generator_config("ar", length, d_model=16,
                                                            n_layers=1, n_heads=2),
                                rngs=nnx.Rngs(0))
    x = jnp.broadcast_to(jax.random.randint(jax.random.key(0), (length,), 0, 4), (n, length))
    start = jax.random.randint(jax.random.key(1), (n,), 0, length)
    span = jax.random.randint(jax.random.key(2), (n,), 1, 5)
    new, corr, info = generators.ar_resample_span(ar, jax.random.key(3), x, start, span,
                                                  span_max=4)
    pos = np.arange(length)[None]
    inside = (pos >= np.asarray(start)[:, None]) & (pos < np.asarray(start + span)[:, None])
    changed = np.asarray(new) != np.asarray(x)
    assert not changed[~inside].any()
    assert changed.mean(0).min() > 0.02, changed.mean(0)  # the review's kernel: 0 at j < 48
    ll = design.ar_loglik_fn(ar)
    lp_new, lp_old = np.asarray(ll(new)), np.asarray(ll(x))
    # q(x|x') uses x's own conditionals on the span: log p(x) minus prefix and suffix terms
    np.testing.assert_allclose(np.asarray(info["logq_new"]), np.asarray(info["logq_new_forward"]),
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(info["logp_new"]), lp_new, atol=1e-3)
    per_pos = np.asarray(nnx.jit(generators.position_logp)(ar, x))
    logq_old = (inside * per_pos).sum(1)
    expected = lp_new - lp_old + logq_old - np.asarray(info["logq_new"])
    np.testing.assert_allclose(np.asarray(corr), expected, atol=1e-3)
    with pytest.raises(ValueError, match="start spans"):
        generators.ar_resample_span(ar, jax.random.key(3), x, start + length, span, span_max=4)
    with pytest.raises(ValueError, match="span_max=4"):
        generators.ar_resample_span(ar, jax.random.key(3), x, start, span + 4, span_max=4)
