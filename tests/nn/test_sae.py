"""The residual-stream edit hook (``lab.nn.edit_residual``) and the sparse autoencoder whose
features it scales: identity at scale 1, the exact edit at scale 0, every path of the model
(forward, captures, the decode loop of ``lab.infer``) running the edit, dictionary
recovery on data with a known sparse code, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.nn import (
    FeatureScale,
    SparseAutoencoder,
    Transformer,
    TransformerConfig,
    edit_residual,
    fit_sae,
    sae_stats,
)


def _model():
    cfg = TransformerConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2,
                            head_dim=8, d_ff=32, max_len=32, init_std=0.3)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _sae(d=16, f=24, seed=1):
    sae = SparseAutoencoder(d, f, rngs=nnx.Rngs(seed))
    sae.b_enc[...] = jnp.full((f,), 0.05)   # most features active: the edit does something
    return sae


_fwd = nnx.jit(lambda m, t: m(t, capture=("hidden",)))
TOKS = jnp.asarray(np.random.default_rng(0).integers(0, 13, (3, 9)), jnp.int32)


def test_edit_at_scale_one_is_the_identity_and_the_original_is_untouched():
    model, sae = _model(), _sae()
    base, bh = _fwd(model, TOKS)
    edited = edit_residual(model, {0: FeatureScale(sae, jnp.ones(24))})
    got, gh = _fwd(edited, TOKS)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(base))
    np.testing.assert_array_equal(np.asarray(gh.hidden), np.asarray(bh.hidden))
    assert model.layers[0].edit is None and edited.layers[0].edit is not None


def test_edit_removes_exactly_the_scaled_features_contribution():
    model, sae = _model(), _sae()
    _, bh = _fwd(model, TOKS)
    scale = np.ones(24, np.float32)
    scale[[3, 7]] = [0.0, 2.5]
    _, gh = _fwd(edit_residual(model, {1: FeatureScale(sae, scale)}), TOKS)
    h = bh.hidden[2]                                   # the residual stream after block 1
    f = sae.encode(h)
    assert float(jnp.min(jnp.max(f[..., jnp.array([3, 7])], axis=(0, 1)))) > 0
    want = h + ((scale - 1.0) * f) @ sae.directions()
    np.testing.assert_allclose(np.asarray(gh.hidden[2]), np.asarray(want), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(gh.hidden[1]), np.asarray(bh.hidden[1]))
    # a shift moves the features by its amount
    shift = np.zeros(24, np.float32)
    shift[5] = 0.7
    _, sh = _fwd(edit_residual(model, {1: FeatureScale(sae, np.ones(24), shift)}), TOKS)
    np.testing.assert_allclose(np.asarray(sh.hidden[2]),
                               np.asarray(h + 0.7 * sae.directions()[5]), atol=1e-5)


def test_the_decode_loop_runs_the_edit():
    """Greedy generation on the edited model equals the teacher-forced argmax of the
    edited model's full forward, and differs from the unedited model's tokens."""
    model, sae = _model(), _sae()
    scale = np.ones(24, np.float32)
    scale[:12] = 0.0
    edited = edit_residual(model, {0: FeatureScale(sae, scale)})
    prompts = np.asarray(TOKS[:, :4])
    out = np.asarray(infer.generate(edited, prompts, max_new_tokens=6, temperature=0.0).tokens)
    seq = np.concatenate([prompts, out], axis=1)
    logits = np.asarray(nnx.jit(lambda m, t: m(t))(edited, jnp.asarray(seq[:, :-1])))
    np.testing.assert_array_equal(np.argmax(logits[:, 3:], axis=-1), out)
    plain = np.asarray(infer.generate(model, prompts, max_new_tokens=6, temperature=0.0).tokens)
    assert (plain != out).any()


def test_fit_sae_recovers_a_known_sparse_dictionary():
    """Data = a sparse non-negative code on 12 random unit atoms in 8 dims (about 1.5
    active per vector): the SAE explains the variance with a sparse code and finds most
    atoms."""
    rng = np.random.default_rng(0)
    atoms = rng.normal(size=(12, 8))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    code = rng.exponential(1.0, (6000, 12)) * (rng.random((6000, 12)) < 0.12)
    acts = code @ atoms
    sae = fit_sae(acts[:5000], 24, l1=0.1, steps=1500, batch=256, learning_rate=3e-3)
    st = sae_stats(sae, acts[5000:])
    assert st["fve"] > 0.9, st
    assert 0.5 < st["l0"] < 4, st                        # 1.4 atoms per vector
    dirs = np.array(sae.directions())
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    best = np.max(np.abs(atoms @ dirs.T), axis=1)        # each atom's closest feature
    assert np.mean(best > 0.9) >= 0.75, best
    # a dense Gaussian cloud of the same scale has no such dictionary
    noise = rng.normal(size=(6000, 8)) * acts.std()
    sae_n = fit_sae(noise[:5000], 24, l1=0.1, steps=1500, batch=256, learning_rate=3e-3)
    assert sae_stats(sae_n, noise[5000:])["l0"] > 2 * st["l0"]
    dn = np.array(sae_n.directions())
    dn /= np.linalg.norm(dn, axis=1, keepdims=True)
    assert np.mean(np.max(np.abs(atoms @ dn.T), axis=1) > 0.9) < 0.5


def test_bad_input_names_the_field():
    model, sae = _model(), _sae()
    with pytest.raises(ValueError, match="unknown layers \\[2\\]"):
        edit_residual(model, {2: FeatureScale(sae, np.ones(24))})
    with pytest.raises(ValueError, match="edits\\[0\\]"):
        edit_residual(model, {0: 3.0})
    with pytest.raises(ValueError, match="acts has shape"):
        fit_sae(np.ones(8), 4)
    with pytest.raises(ValueError, match="NaN"):
        fit_sae(np.full((4, 2), np.nan), 4)
    with pytest.raises(ValueError, match="n_features"):
        SparseAutoencoder(4, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="l1"):
        fit_sae(np.ones((4, 2)), 4, l1=-1.0)


def test_shift_gradient_is_the_feature_gradient():
    """Where a feature is active, d metric / d scale = f * d metric / d shift."""
    model, sae = _model(), _sae()

    def metric(s, d):
        return jnp.sum(edit_residual(model, {0: FeatureScale(sae, s, d)})(TOKS)[:, -1, 2])

    shape = (3, 9, 24)
    gs, gd = jax.grad(metric, argnums=(0, 1))(jnp.ones(shape), jnp.zeros(shape))
    f = np.asarray(sae.encode(_fwd(model, TOKS)[1].hidden[1]))
    np.testing.assert_allclose(np.asarray(gs), f * np.asarray(gd), atol=1e-5)
    assert np.abs(np.asarray(gd)[f == 0]).max() > 0      # defined where f is 0 too
