"""lab.methods.geomem: the construction's log-dimension behaviour, training, probes, search."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.methods.geomem import capacity, construction, data, probes, training
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
    ns = [64, 256, 1024, 4096]
    fit = capacity.log_fit(ns, [3 + 2 * math.log(n) for n in ns])
    assert fit["c"] == pytest.approx(2) and fit["a"] == pytest.approx(3) and fit["r2"] == 1.0
    assert capacity.fact_bits(4, 2) == pytest.approx(2 * math.log2(24))
    assert capacity.bound_dim(1024, 2, 1.0) == pytest.approx(
        capacity.fact_bits(1024, 2) / 1024)
