"""lab.methods.geomem: the construction's log-dimension behaviour, training, probes, search."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.methods.geomem import capacity, construction, data, probes, sweeps, training
from lab.methods.geomem.model import OneLayer, accuracy, capture, predict


def perms(n, r, seed=0):
    return data.bijections(seed, n, r)


def test_bijections_and_queries():
    p = np.asarray(perms(64, 3))
    assert all(sorted(row) == list(range(64)) for row in p)
    tokens, answers, chains = data.queries(p, 2)
    assert tokens.shape == (9 * 64, 3) and chains.shape == (9, 2)
    row = 5 * 64 + 7  # chain 5 = (1, 2) asked of subject 7
    assert tuple(chains[5]) == (1, 2)
    assert int(answers[row]) == p[2][p[1][7]]
    assert list(np.asarray(tokens[row])) == [7, 64 + 1, 64 + 3 + 2]
    with pytest.raises(ValueError, match="n_entities=0; expected an int >= 2"):
        data.bijections(0, 0, 2)


def test_construction_accuracy_crosses_99_percent_around_c_log_n():
    # Crosstalk of R-1 superposed codes: m ~ 2 ln(N / 0.01) ~ 23 for N=1024, R=2.
    p = perms(1024, 2)
    assert construction.accuracy(0, p, 96) >= 0.99
    assert construction.accuracy(0, p, 12) < 0.99
    # More relations superposed need more room at the same m.
    assert construction.accuracy(0, perms(1024, 4), 32) < construction.accuracy(0, p, 32)


@pytest.mark.parametrize("hops", [1, 2])
def test_constructed_transformer_equals_closed_form_decode(hops):
    p = perms(128, 2)
    cons = construction.construct(0, p, 24, hops)
    model = construction.to_model(cons, hops)
    tokens, _, _ = data.queries(p, hops)
    direct = construction.decode(cons).reshape(-1)
    np.testing.assert_array_equal(np.asarray(predict(model, tokens)), direct)
    # The MLP's gates: every hidden unit fires only for the chain it serves.
    _, cap = capture(model, tokens)
    rel = np.repeat(np.arange(2 ** hops), 128)
    assert probes.gating_selectivity(cap["z"], rel, 2 ** hops)["selectivity"] > 0.999


def test_cot_beats_one_pass_for_two_hops_at_equal_width():
    p = perms(256, 2)
    # one pass superposes R^2 = 4 chains in m dims, CoT only R = 2.
    assert construction.cot_accuracy(0, p, 40, 2) > construction.accuracy(0, p, 40, 2) + 0.1


def test_gradient_descent_memorises_and_padding_stays_zero():
    n, r, d, width = 256, 2, 8, 16
    p = perms(n, r)
    tokens, answers, _ = data.queries(p, 1)
    model = OneLayer(n, r, d, 4 * d, rngs=nnx.Rngs(0), width=width, hidden_width=4 * width)
    stats = training.fit(model, tokens, answers,
                         training.FitConfig(steps=1500, segment=250, learning_rate=1e-2))
    assert stats["accuracy"] >= 0.99, stats
    assert accuracy(model, tokens, answers) == stats["accuracy"]
    # The zero padding beyond d is never touched: the model is exactly d wide.
    assert float(jnp.abs(model.subjects[...][:, d:]).max()) == 0.0
    assert float(jnp.abs(model.w1[...][:, 4 * d:]).max()) == 0.0
    assert model.d == d


def test_fit_only_subjects_leaves_the_rest_frozen():
    n, r = 64, 2
    p = perms(n, r)
    tokens, answers, _ = data.queries(p, 1)
    model = OneLayer(n, r, 8, 16, rngs=nnx.Rngs(0))
    w1 = np.asarray(model.w1[...])
    s0 = np.asarray(model.subjects[...])
    training.fit(model, tokens, answers, training.FitConfig(steps=20, segment=20),
                 only="subjects")
    np.testing.assert_array_equal(np.asarray(model.w1[...]), w1)
    assert np.abs(np.asarray(model.subjects[...]) - s0).max() > 1e-3


def test_superposition_probe_on_exact_and_random_embeddings():
    p = perms(512, 2)
    cons = construction.construct(0, p, 16, 1)
    exact = probes.superposition_r2(cons.embeddings, cons.codes, p)
    assert exact["r2_heldout"] > 1 - 1e-6 and exact["n_features"] == 2 * 16 + 1
    rand = np.random.default_rng(0).normal(size=cons.embeddings.shape)
    assert probes.superposition_r2(rand, cons.codes, p)["r2_heldout"] < 0.1
    # Half signal, half noise of equal variance: R^2 about one half.
    noisy = cons.embeddings + rand * cons.embeddings.std()
    assert 0.35 < probes.superposition_r2(noisy, cons.codes, p)["r2_heldout"] < 0.65


def test_gating_selectivity_values():
    rel = np.array([0, 0, 1, 1])
    z = np.array([[1.0, 1.0], [3.0, 1.0], [0.0, 1.0], [0.0, 1.0]])  # unit 0 gated, unit 1 not
    g = probes.gating_selectivity(z, rel, 2)
    # unit 0: mass 2 (mean 2 vs 0) sel 1; unit 1: mass 2, sel 0 -> weighted mean 0.5
    assert g["selectivity"] == pytest.approx(0.5) and g["gated_fraction"] == pytest.approx(0.5)


def test_smallest_dim_bisection_and_log_fit():
    calls = []

    def step(d):
        calls.append(d)
        return 1.0 if d >= 37 else 0.5

    grid = list(range(1, 101))
    d, seen = capacity.smallest_dim(step, grid, 0.99)
    assert d == 37 and len(calls) <= 8 and seen[37] == 1.0
    assert capacity.smallest_dim(lambda d: 0.0, grid)[0] is None
    # The walk from a guess: a good guess costs the answer and the point below it.
    calls.clear()
    assert capacity.smallest_dim(step, grid, 0.99, start=37)[0] == 37 and calls == [37, 36]
    calls.clear()
    assert capacity.smallest_dim(step, grid, 0.99, start=35)[0] == 37 and calls == [35, 36, 37]
    calls.clear()
    d, seen = capacity.smallest_dim(step, grid, 0.99, start=40)
    assert d == 37 and calls == [40, 39, 38, 37, 36] and seen[36] == 0.5
    assert capacity.smallest_dim(lambda d: 0.0, [2, 4, 8], start=4) == (None, {4: 0.0, 8: 0.0})
    with pytest.raises(ValueError, match="start=5; expected a point of the grid"):
        capacity.smallest_dim(step, [2, 4, 8], start=5)
    ns = [64, 256, 1024, 4096]
    fit = capacity.log_fit(ns, [3 + 2 * math.log(n) for n in ns])
    assert fit["c"] == pytest.approx(2) and fit["a"] == pytest.approx(3) and fit["r2"] == 1.0
    assert capacity.fact_bits(4, 2) == pytest.approx(2 * math.log2(24))
    assert capacity.bound_dim(1024, 2, 1.0) == pytest.approx(
        capacity.fact_bits(1024, 2) / 1024)


def test_log_rule_needs_a_positive_slope_five_n_values_and_log_beating_linear():
    ns = [64, 256, 1024, 4096, 16384]
    log_like = [4 + 3 * math.log(n) + e for n, e in zip(ns, [0.4, -0.3, 0.2, -0.4, 0.1],
                                                             strict=True)]
    held = capacity.log_rule(ns, log_like)
    assert held["holds"] and held["c_low"] > 0 and held["c_low"] < 3 < held["c_high"]
    assert held["r2"] > held["r2_linear"] and held["n_values"] == 5
    flat = capacity.log_rule(ns, [8, 8, 8, 8, 8])
    assert not flat["holds"] and flat["c"] == 0.0 and flat["c_low"] == 0.0
    falling = capacity.log_rule(ns, [10, 8, 6, 4, 2])
    assert not falling["holds"] and falling["c_high"] < 0
    # Three (or four) values of N are too few, however good the fit.
    assert not capacity.log_rule(ns[:3], log_like[:3])["holds"]
    assert not capacity.log_rule(ns[:4], log_like[:4])["holds"]
    assert capacity.log_rule(ns[:4], log_like[:4], min_points=4)["holds"]
    # A miss at one N (None) fails the rule; linear-in-N growth fails the comparison.
    assert not capacity.log_rule(ns, log_like[:4] + [None])["holds"]
    linear = capacity.log_rule(ns, [2 + n / 1000 for n in ns])
    assert linear["c"] > 0 and linear["r2_linear"] > linear["r2"] and not linear["holds"]
    # Noisy enough that the slope's interval reaches 0: fails although c > 0.
    noisy = capacity.log_rule(ns, [10, 4, 14, 2, 13])
    assert noisy["c"] > 0 and noisy["c_low"] < 0 and not noisy["holds"]


def test_log_fit_slope_interval_is_the_ols_t_interval():
    # Hand-checked: x = ln N, residual noise known -> se(c) = sqrt(SSR/(k-2) / Sxx).
    ns = [math.e ** k for k in (1, 2, 3, 4, 5)]
    dims = [1.0, 3.0, 2.0, 5.0, 4.0]  # OLS on x = 1..5: c = 0.8, a = 0.6, SSR = 3.6
    fit = capacity.log_fit(ns, dims)
    assert fit["c"] == pytest.approx(0.8) and fit["a"] == pytest.approx(0.6)
    se = math.sqrt(3.6 / 3 / 10.0)
    assert fit["c_high"] - fit["c"] == pytest.approx(3.182446 * se, rel=1e-5)
    with pytest.raises(ValueError, match="level=1.5"):
        capacity.log_fit(ns, dims, level=1.5)


def test_cot_steps_feed_each_intermediate_answer_back():
    p = perms(8, 2)
    tokens, targets, chain_list = data.cot_steps(p, 2)
    row = 1 * 8 + 3  # chain 1 = (0, 1) asked of subject 3
    e1 = p[0][3]
    assert tuple(chain_list[1]) == (0, 1)
    assert list(tokens[0, row]) == [-1, 3, 8 + 0, 8 + 2 + 1]
    assert list(tokens[1, row]) == [3, 8 + 0, 8 + 2 + 1, e1]
    assert list(targets[:, row]) == [e1, p[1][e1]]
    np.testing.assert_array_equal(targets[-1], data.queries(p, 2)[1])


def test_padding_is_invisible_to_the_model():
    model = OneLayer(16, 4, 8, 32, rngs=nnx.Rngs(0))
    t = np.array([[3, 16, 19]], np.int32)
    padded = np.array([[-1, -1, 3, 16, 19]], np.int32)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(t))),
                               np.asarray(model(jnp.asarray(padded))), rtol=1e-6, atol=1e-6)


def test_cot_generation_reads_the_models_own_emissions(monkeypatch):
    # A model that always emits entity 0 at step 1: step 2 must see 0, not the true e_1.
    n, r = 16, 2
    p = perms(n, r)
    model = OneLayer(n, 2 * r, 8, 32, rngs=nnx.Rngs(0))
    seen = []

    def fake(m, tokens, batch=8192):
        seen.append(np.asarray(tokens))
        return jnp.zeros(tokens.shape[0], jnp.int32)

    monkeypatch.setattr(sweeps, "predict", fake)
    emitted = sweeps.cot_generate(model, p, 2)
    assert emitted.shape == (2, r * r * n) and (emitted == 0).all()
    assert (seen[1][:, -1] == 0).all()
    steps, _, _ = data.cot_steps(p, 2)
    np.testing.assert_array_equal(seen[1][:, :-1], steps[1][:, :-1])
    assert (steps[1][:, -1] != 0).any()  # teacher forcing would have differed


def test_shortcut_baselines_stay_near_chance():
    for n, hops in ((64, 1), (256, 1), (256, 2)):
        b = data.shortcut_baselines(perms(n, 2), hops)
        assert b["relation_only"] == pytest.approx(1 / n)
        assert b["copy_subject"] <= 5 / n and b["chance"] == 1 / n


def test_construction_dims_averages_the_accuracy_over_draws():
    grid = [8, 16, 24, 32]
    one = [sweeps.construction_dims([64], 2, grid, seed=s)[0] for s in (0, 1)]
    both = sweeps.construction_dims([64], 2, grid, seed=0, seeds=2)[0]
    for m, acc in both["accuracy_at"].items():
        singles = [construction.accuracy(s, data.bijections(s, 64, 2), m) for s in (0, 1)]
        assert acc == pytest.approx(sum(singles) / 2)
    assert both["d"] == both["m"] + 2 and one[0]["d"] == one[0]["m"] + 2
    with pytest.raises(ValueError, match="seeds=0; expected a positive int"):
        sweeps.construction_dims([64], 2, grid, seeds=0)
