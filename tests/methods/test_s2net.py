"""S²-Net: binding by synchronisation on a hand-built case, metrics, tasks, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.methods import s2net as s2
from lab.methods.s2net import metrics


def _axis_kernel(strength: float) -> jnp.ndarray:
    """Hand-built grid coupling: attract along rows/columns, repel on diagonals, so that
    a horizontal and a vertical bar each synchronise and push each other to anti-phase."""
    return jnp.array([strength if (dr == 0 or dc == 0) else -strength
                      for dr, dc in s2.grid_offsets(2)])


def _hand_built(sync: bool, strength: float = 0.3) -> s2.S2Net:
    model = s2.S2Net(64, {"grid": (8, 8, 2)}, sync=sync, drive=0.2, rngs=nnx.Rngs(0))
    model.w.kernel[...] = jnp.zeros(24)
    if sync:
        model.k.kernel[...] = _axis_kernel(strength)
        model.gain_logit[...] = jnp.asarray(5.0)
    return model


def test_synchronised_network_binds_two_crossing_bars():
    batch = s2.binding_batch(seed=3, index=0, batch=16, size=8, steps=96)
    bound = s2.evaluate(_hand_built(True), [batch], task="binding")
    no_coupling = _hand_built(True, strength=0.0)
    unsynced = s2.evaluate(no_coupling, [batch], task="binding")
    assert bound["ari"] >= 0.9, bound
    assert unsynced["ari"] <= 0.3, unsynced  # same spikes, no Kuramoto coupling: no binding
    assert bound["spikes"] > 0


def test_oscillators_bind_with_the_same_coupling():
    batch = s2.binding_batch(seed=3, index=0, batch=8, size=8, steps=64)
    model = s2.KuramotoNet(64, {"grid": (8, 8, 2)}, drive=1.0, rngs=nnx.Rngs(0))
    model.k.kernel[...] = _axis_kernel(0.3)
    assert s2.evaluate(model, [batch], task="binding")["ari"] >= 0.9


def test_adjusted_rand_index_hand_computed_and_sklearn():
    assert s2.adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert s2.adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)
    # sklearn's documented example: adjusted_rand_score([0, 0, 1, 2], [0, 0, 1, 1]) = 0.5714
    assert s2.adjusted_rand_index([0, 0, 1, 2], [0, 0, 1, 1]) == pytest.approx(4 / 7)
    sk = pytest.importorskip("sklearn.metrics", reason="sklearn not installed")
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 3, 50), rng.integers(0, 4, 50)
    assert s2.adjusted_rand_index(a, b) == pytest.approx(sk.adjusted_rand_score(a, b))


def test_circular_kmeans_and_pair_loss_on_antiphase_groups():
    angles = np.array([0.1, -0.1, 0.05, np.pi + 0.1, np.pi - 0.1])
    emb = np.stack([np.cos(angles), np.sin(angles)], -1)
    labels = np.array([1, 1, 1, 2, 2])
    assert s2.adjusted_rand_index(labels, s2.circular_kmeans(emb, 2)) == pytest.approx(1.0)
    perfect = jnp.asarray(np.stack([np.cos([0, 0, np.pi]), np.sin([0, 0, np.pi])], -1))[None]
    lab = jnp.array([[1, 1, 2]])
    assert float(s2.pair_phase_loss(perfect, lab)) == pytest.approx(0.0, abs=1e-6)
    assert float(s2.pair_phase_loss(jnp.zeros_like(perfect), lab)) == pytest.approx(0.5)


def test_binding_batch_crossing_bars_and_determinism():
    a = s2.binding_batch(seed=0, index=5, batch=6, size=8, steps=3)
    b = s2.binding_batch(seed=0, index=5, batch=6, size=8, steps=3)
    np.testing.assert_array_equal(a["labels"], b["labels"])
    assert a["inputs"].shape == (6, 3, 64)
    assert np.all((a["labels"] == 3).sum(1) == 1)  # exactly one crossing pixel
    assert np.all((a["labels"] == 1).sum(1) >= 3) and np.all((a["labels"] == 2).sum(1) >= 3)


def test_classification_tasks_shapes_and_labels():
    d = s2.spike_train_batch(0, 0, 8, n_in=10, steps=5, n_classes=3)
    assert d["inputs"].shape == (8, 5, 10) and set(np.unique(d["inputs"])) <= {0.0, 1.0}
    assert d["labels"].max() < 3
    s = s2.signal_batch(0, 0, 8, steps=20)
    assert s["inputs"].shape == (8, 20, 2) and np.all(s["inputs"] >= 0)


def test_s2net_classifier_forward_and_surrogate_gradient():
    adj = s2.ring_adjacency(12, 2)
    model = s2.S2Net(12, {"adjacency": adj}, n_in=3, n_out=4, coupling="scalar",
                     drive=1.0, rngs=nnx.Rngs(1))
    batch = s2.signal_batch(0, 0, 4, steps=10)
    batch["inputs"] = batch["inputs"][..., :2].repeat(2, -1)[..., :3]
    loss_fn = s2.classify_loss(0.1)
    (loss, m), grads = nnx.value_and_grad(
        lambda mdl: loss_fn(mdl, batch, jax.random.key(0)), has_aux=True)(model)
    assert np.isfinite(float(loss)) and m["spikes"] > 0
    g_enc = np.asarray(grads["encoder"]["kernel"][...])
    assert np.all(np.isfinite(g_enc)) and np.abs(g_enc).max() > 0


def test_adjacency_of_the_wrong_shape_is_rejected():
    with pytest.raises(ValueError, match=r"adjacency has shape \(8, 9\); expected \(8, 8\)"):
        s2.S2Net(8, {"adjacency": np.ones((8, 9))}, n_in=2, n_out=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="grid 4x4 has 16 cells; expected n_neurons=10"):
        s2.S2Net(10, {"grid": (4, 4, 1)}, rngs=nnx.Rngs(0))


def test_energy_proxy_counts():
    e = metrics.snn_energy(10.0, n_neurons=4, steps=5, recurrent_fanout=2.0, n_out=3)
    assert e["ac"] == pytest.approx(50.0) and e["mac"] == pytest.approx(20.0)
    assert e["pj"] == pytest.approx(4.6 * 20 + 0.9 * 50)
    sync = metrics.snn_energy(10.0, n_neurons=4, steps=5, recurrent_fanout=2.0, n_out=3,
                              sync=True, coupling_fanout=2.0)
    assert sync["mac"] == pytest.approx(20 + 3 * 20 + 2 * 20 * 2.0)


def test_binding_loss_adds_the_oscillator_term_only_for_s2net():
    batch = s2.binding_batch(seed=0, index=0, batch=2, size=8, steps=16)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    key = jax.random.key(0)
    model = _hand_built(True)
    out = model(batch["inputs"], key=key)
    base, _ = s2.binding_loss(0.0, 0.0)(model, batch, key)
    with_osc, aux = s2.binding_loss(0.0, 1.0)(model, batch, key)
    expected = float(s2.pair_phase_loss(out["osc_emb"], batch["labels"]))
    assert float(with_osc) - float(base) == pytest.approx(expected, abs=1e-5)
    assert float(aux["phase_loss"]) == pytest.approx(float(base), abs=1e-6)
    snn = _hand_built(False)
    a, _ = s2.binding_loss(0.0, 0.0)(snn, batch, key)
    b, _ = s2.binding_loss(0.0, 1.0)(snn, batch, key)
    assert float(a) == pytest.approx(float(b))  # no oscillators, no extra term


# --- temporal binding without a local cue (flicker_batch) and its shortcuts --------------

SHORTCUT_MAX_ARI = 0.2  # every shortcut must stay under this ARI on flicker_batch


def test_flicker_batch_groups_rates_and_determinism():
    a = s2.flicker_batch(seed=1, index=2, batch=64, size=8, steps=64, n_objects=2)
    b = s2.flicker_batch(seed=1, index=2, batch=64, size=8, steps=64, n_objects=2)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert a["inputs"].shape == (64, 64, 64) and set(np.unique(a["inputs"])) == {0.0, 1.0}
    lab = a["labels"].reshape(64, 8, 8)
    assert np.all(lab == lab[:, :, :1])  # objects are whole rows
    assert all(set(np.unique(row)) == {1, 2} for row in a["labels"])
    # both objects fire at the configured mean rate 0.2: no intensity cue
    rates = [a["inputs"].mean(1)[a["labels"] == k].mean() for k in (1, 2)]
    np.testing.assert_allclose(rates, [0.2, 0.2], atol=0.01)
    three = s2.flicker_batch(seed=0, index=0, batch=4, n_objects=3, steps=8)
    assert all(set(np.unique(row)) == {1, 2, 3} for row in three["labels"])


def test_flicker_batch_rejects_bad_knobs():
    with pytest.raises(ValueError, match="n_objects=9 must lie in"):
        s2.flicker_batch(0, 0, 2, size=8, n_objects=9)
    with pytest.raises(ValueError, match="rate=0.7 must lie in"):
        s2.flicker_batch(0, 0, 2, rate=0.7)
    with pytest.raises(ValueError, match="jitter=2 must lie in"):
        s2.flicker_batch(0, 0, 2, jitter=2)


def test_shortcuts_near_chance_on_flicker_and_oracle_solves_it():
    d = s2.flicker_batch(seed=5, index=0, batch=128, size=8, steps=64)
    x, y = d["inputs"], d["labels"]
    sh = s2.shortcuts
    scores = {"orientation": sh.orientation_rule(x, 8), "intensity": sh.intensity_kmeans(x),
              "components": sh.connected_components(x, 8), "frame": sh.frame_kmeans(x),
              "position": sh.position_kmeans(x, 8)}
    aris = {k: float(sh.group_ari(v, y).mean()) for k, v in scores.items()}
    assert max(aris.values()) < SHORTCUT_MAX_ARI, aris
    assert sh.group_ari(sh.temporal_oracle(x, 8), y).mean() >= 0.95
    # the same orientation rule solves the crossing bars, the task this one replaces
    bars = s2.binding_batch(seed=5, index=0, batch=64, size=8, steps=1)
    assert sh.group_ari(sh.orientation_rule(bars["inputs"], 8), bars["labels"]).mean() >= 0.99


def test_connected_components_and_kmeans_hand_built():
    img = np.zeros((1, 1, 16), np.float32)
    img[0, 0, [0, 1, 4, 10, 11, 15]] = 1.0  # 4x4: {0,1,4}, {10,11,15}
    comp = s2.shortcuts.connected_components(img, 4)[0]
    assert comp[0] == comp[1] == comp[4] != comp[10] == comp[11] == comp[15] and comp[2] == 0
    groups = s2.shortcuts.kmeans(np.array([[0.0], [0.1], [5.0], [5.2]]), 2)
    assert groups[0] == groups[1] != groups[2] == groups[3]


def test_trained_feedforward_conv_stays_near_chance_on_flicker():
    """A per-frame conv pooled over time learns the crossing bars (a local cue) but not
    the flicker task (only timing), with the same training."""
    def train(gen):
        model = s2.ConvEmbed(8, 8, 2, rngs=nnx.Rngs(0))
        s2.fit(model, s2.binding_loss(), lambda step: gen(0, step, 16), steps=40,
               learning_rate=0.05, seed=0)
        return s2.evaluate(model, [gen(99, 0, 64)], task="binding")["ari"]

    flicker = train(lambda s, i, b: s2.flicker_batch(s, i, b, steps=32))
    bars = train(lambda s, i, b: s2.binding_batch(s, i, b, steps=2))
    assert flicker < SHORTCUT_MAX_ARI, flicker
    assert bars >= 0.6, bars


def test_conv_rnn_can_represent_the_binding_solution():
    """With a rotation by the rhythm's angle per step as its self-recurrence, the ANN's
    state is a leaky resonator whose angle is the firing phase: it binds."""
    d = s2.flicker_batch(seed=3, index=0, batch=32, steps=64)
    model = s2.ConvRNN(8, 8, 2, rngs=nnx.Rngs(0))
    w = 2 * np.pi / 8
    model.a[...] = 0.95 * jnp.array([[np.cos(w), np.sin(w)], [-np.sin(w), np.cos(w)]])
    model.u[...] = jnp.array([0.2, 0.0])
    model.kernel[...] = jnp.zeros_like(model.kernel[...])
    assert s2.n_params(model) == 56
    assert s2.evaluate(model, [d], task="binding")["ari"] >= 0.85


# --- semantic reasoning over bound features (bound_query_batch) ---------------------------


def test_bound_query_rates_carry_no_answer_and_timing_does():
    q = s2.bound_query_batch(seed=0, index=0, batch=1024, steps=32, rate=0.3)
    assert q["inputs"].shape == (1024, 32, 8)
    assert abs(q["labels"].mean() - 0.5) < 0.05
    rates = q["inputs"].mean(1)
    # colour 0 and shape 0 are always present, at the same rate for both answers
    for label in (0, 1):
        np.testing.assert_allclose(rates[q["labels"] == label][:, [0, 4]].mean(0),
                                   [0.3, 0.3], atol=0.02)
    assert np.all((rates[:, :4] > 0).sum(1) == 3) and np.all((rates[:, 4:] > 0).sum(1) == 3)
    train = s2.bound_query_batch(seed=1, index=0, batch=2048, steps=32, rate=0.3)
    no_context = s2.shortcuts.no_context_readout(train["inputs"], train["labels"], q["inputs"])
    assert abs((no_context == q["labels"]).mean() - 0.5) < 0.06
    oracle = s2.shortcuts.query_oracle(q["inputs"], 4, 8, 3)
    assert (oracle == q["labels"]).mean() >= 0.9


def test_bound_query_rejects_bad_knobs():
    with pytest.raises(ValueError, match="n_objects=5 must lie in"):
        s2.bound_query_batch(0, 0, 2, n_objects=5, n_features=4)
    with pytest.raises(ValueError, match="depth=1.5 must lie in"):
        s2.bound_query_batch(0, 0, 2, depth=1.5)


def test_standard_error():
    assert metrics.standard_error([1.0, 3.0]) == pytest.approx(1.0)  # std 1.414 / sqrt 2
    assert metrics.standard_error([2.0]) == 0.0
