"""IPG: the neuron-scale hooks, the integration rules, the policy-gradient estimator
against an exact gradient, recovery of a planted neuron on a hand-set model, bad input."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.methods import ipg
from lab.methods.ipg import plant
from lab.nn import SparseAutoencoder, Transformer, TransformerConfig, scale_neurons


def _model(seed=0, vocab=11, d_ff=16, layers=2, init_std=0.02, d_model=16):
    cfg = TransformerConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=2,
                            n_kv_heads=2, head_dim=d_model // 2, d_ff=d_ff, max_len=16,
                            init_std=init_std)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


# -- hooks ---------------------------------------------------------------------------


_plain = nnx.jit(lambda m, t: m(t))
_hooked = nnx.jit(lambda m, t, s: m(t, neuron_scale=s))
_none = nnx.jit(lambda m, t: m(t, neuron_scale=None))


def test_hooks_default_to_identity_and_fold_equals_the_forward_hook():
    model = _model(init_std=0.2)
    toks = jnp.asarray(np.random.default_rng(0).integers(0, 11, (3, 7)), jnp.int32)
    base = np.asarray(_plain(model, toks))
    np.testing.assert_array_equal(np.asarray(_none(model, toks)), base)
    ones = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(_hooked(model, toks, ones[:, None, None]), base, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(_plain(scale_neurons(model, ones), toks)),
                                  np.asarray(_plain(model, toks)))
    s = np.random.default_rng(1).uniform(0, 2, (2, 16)).astype(np.float32)
    hooked = np.asarray(_hooked(model, toks, s[:, None, None]))
    assert np.max(np.abs(hooked - base)) > 1e-3                  # the scale does act
    np.testing.assert_allclose(_plain(scale_neurons(model, s), toks), hooked, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(_plain(model, toks)), base)   # model untouched
    # the "mlp" capture: what the down projection reads, after the scale
    acts = ipg.activations(model, toks)
    assert acts.shape == (2, 3, 7, 16)
    # through lab.infer: greedy generation under the fold equals the hooked forward's argmax
    prompt = np.asarray(toks[:, :3])
    gen = infer.generate(scale_neurons(model, s), prompt, max_new_tokens=4)
    seq = np.concatenate([prompt, np.asarray(gen.tokens)], axis=1)
    tf = np.argmax(np.asarray(_hooked(model, jnp.asarray(seq[:, :-1]), s[:, None, None])),
                   -1)[:, 2:]
    np.testing.assert_array_equal(tf, np.asarray(gen.tokens))


def test_scale_neurons_rejects_a_bad_scale():
    model = _model()
    with pytest.raises(ValueError, match=r"neuron_scale has shape \(3, 16\)"):
        scale_neurons(model, np.ones((3, 16)))
    with pytest.raises(ValueError, match="NaN"):
        scale_neurons(model, np.full((2, 16), np.nan))
    with pytest.raises(ValueError, match="neuron_scale has 3 layers; expected n_layers=2"):
        model(jnp.zeros((1, 3), jnp.int32), neuron_scale=np.ones((3, 16)))


# -- integration rules ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_gauss_legendre_integrates_polynomials_exactly(n):
    rng = np.random.default_rng(n)
    coef = rng.normal(size=2 * n)                      # degree 2n - 1
    a, w = ipg.integration_points("gausslegendre", n)
    exact = sum(c / (i + 1) for i, c in enumerate(coef))   # integral over [0, 1]
    assert abs(np.dot(w, np.polynomial.polynomial.polyval(a, coef)) - exact) < 1e-12
    assert np.all((a > 0) & (a < 1)) and abs(w.sum() - 1) < 1e-12


def test_riemann_rules_are_first_or_second_order():
    f = lambda x: x ** 2  # noqa: E731
    a, w = ipg.integration_points("riemann_trapezoid", 3)
    assert abs(np.dot(w, f(a)) - 0.375) < 1e-12           # (0/2 + 1/4 + 1/2) / 2
    for m in ("riemann_left", "riemann_right", "riemann_middle"):
        a, w = ipg.integration_points(m, 200)
        assert abs(np.dot(w, f(a)) - 1 / 3) < 6e-3, m
    a, _ = ipg.integration_points("riemann_right", 4)
    np.testing.assert_allclose(a, [0.25, 0.5, 0.75, 1.0])


# -- the estimator against an exact gradient ------------------------------------------


def test_policy_gradient_matches_the_exact_gradient_of_an_enumerable_reward():
    model = _model(seed=3, vocab=3, d_ff=8, layers=1, init_std=0.6, d_model=8)
    prompt = np.array([[0, 1]], np.int32)
    table = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1]], np.float32)   # R(y1, y2)
    outs = np.array(list(itertools.product(range(3), repeat=2)), np.int32)   # 9 outcomes
    seqs = jnp.asarray(np.concatenate([np.repeat(prompt, 9, 0), outs], 1)[:, :-1])
    r = jnp.asarray(table[outs[:, 0], outs[:, 1]])

    def expected(s):
        logp = jax.nn.log_softmax(model(seqs, neuron_scale=s[:, None, None]), -1)[:, 1:]
        lp = jnp.take_along_axis(logp, jnp.asarray(outs)[..., None], -1)[..., 0].sum(1)
        return jnp.sum(jnp.exp(lp) * r)

    s0 = np.full((1, 8), 0.7, np.float32)
    exact = np.asarray(jax.jit(jax.grad(expected))(jnp.asarray(s0)))
    n = 8192
    comp, lens = ipg.sample(model, np.repeat(prompt, n, 0), s0, max_new_tokens=2,
                            temperature=1.0, seed=5)
    est = ipg.policy_gradient(model, np.repeat(prompt, n, 0), comp, lens,
                              table[comp[:, 0], comp[:, 1]], s0, temperature=1.0)
    assert np.linalg.norm(exact) > 0.05                      # a gradient worth estimating
    err = np.linalg.norm(est - exact) / np.linalg.norm(exact)
    assert err < 0.2, (err, est, exact)
    # with the rewards shuffled the estimate no longer matches: the test can fail
    rng = np.random.default_rng(0)
    bad = ipg.policy_gradient(model, np.repeat(prompt, n, 0), comp, lens,
                              rng.permutation(table[comp[:, 0], comp[:, 1]]), s0,
                              temperature=1.0)
    assert np.linalg.norm(bad - exact) / np.linalg.norm(exact) > 0.5


# -- recovery of a planted neuron on a hand-set model ----------------------------------

A = 1  # the rewarded token


def _hand_set(planted=2, loud=0):
    """One block; attention off; neuron ``planted`` reads a constant direction of the
    residual and writes dim 1, which the LM head turns into token A's logit; neuron
    ``loud`` fires strongly but writes nothing. Every other weight is 0."""
    cfg = TransformerConfig(vocab_size=3, d_model=4, n_layers=1, n_heads=1, n_kv_heads=1,
                            head_dim=4, d_ff=4, max_len=8, tie_embeddings=False, qk_norm=False)
    m = Transformer(cfg, rngs=nnx.Rngs(0))
    emb = np.zeros((3, 4), np.float32)
    emb[:, 0] = 1.0
    m.embed.embedding[...] = jnp.asarray(emb)
    blk = m.layers[0]
    blk.attn.o.kernel[...] = jnp.zeros_like(blk.attn.o.kernel[...])
    gu = np.zeros((4, 2, 4), np.float32)
    gu[0, :, planted] = 1.0
    gu[0, :, loud] = 5.0
    blk.mlp.gate_up.kernel[...] = jnp.asarray(gu)
    down = np.zeros((4, 4), np.float32)
    down[planted, 1] = 0.3  # J(alpha) rises smoothly: a 6-point rule integrates it
    blk.mlp.down.kernel[...] = jnp.asarray(down)
    head = np.zeros((4, 3), np.float32)
    head[1, A] = 3.0
    head[0, 2] = 1.0
    m.lm_head.kernel[...] = jnp.asarray(head)
    return m


def test_ipg_recovers_the_planted_neuron_where_activation_magnitude_does_not():
    model = _hand_set(planted=2, loud=0)
    prompts = np.zeros((256, 2), np.int32)

    def reward(rows, comp):          # both steps must choose A
        return ((comp[:, 0] == A) & (comp[:, 1] == A)).astype(np.float32)

    att = ipg.integrated_policy_gradient(model, prompts, reward, max_new_tokens=2, steps=6,
                                         samples=4, seed=1)
    assert ipg.top_components(att.scores, 1).tolist() == [[0, 2]]
    assert att.scores[0, 2] > 5 * np.abs(np.delete(att.scores[0], 2)).max()
    acts = ipg.activation_magnitude(model, np.zeros((4, 4), np.int32))
    assert ipg.top_components(acts, 1).tolist() == [[0, 0]]     # the loud, inert neuron
    assert ipg.precision_at_k(att.scores, [[0, 2]], 1) == 1.0
    assert ipg.precision_at_k(acts, [[0, 2]], 1) == 0.0
    # completeness: the attributions sum to J(1) - J(0) (here enumerable: 9 outcomes)
    outs = np.array(list(itertools.product(range(3), repeat=2)), np.int32)
    seqs = jnp.asarray(np.concatenate([np.zeros((9, 2), np.int32), outs], 1)[:, :-1])
    r = jnp.asarray(reward(None, outs))

    def expected(s):
        logp = jax.nn.log_softmax(model(seqs, neuron_scale=s[:, None, None]), -1)[:, 1:]
        return jnp.sum(jnp.exp(jnp.take_along_axis(logp, jnp.asarray(outs)[..., None],
                                                   -1)[..., 0].sum(1)) * r)

    expected = jax.jit(expected)
    delta = float(expected(jnp.ones((1, 4))) - expected(jnp.zeros((1, 4))))
    assert delta > 0.8
    assert abs(att.scores.sum() - delta) < 0.08, (att.scores.sum(), delta)
    # ablating the recovered neuron removes the behaviour; ablating the loud one does not
    kw = dict(max_new_tokens=2, temperature=1.0, seed=3)
    p = np.zeros((1024, 2), np.int32)
    on = ipg.outcome(model, p, reward, **kw)
    assert on - ipg.outcome(model, p, reward, ipg.set_scale((1, 4), [[0, 2]], 0.0), **kw) > 0.6
    assert abs(on - ipg.outcome(model, p, reward, ipg.set_scale((1, 4), [[0, 0]], 0.0),
                                **kw)) < 0.06


def test_attribution_patching_and_gradients_on_the_hand_set_model():
    model = _hand_set(planted=2, loud=0)
    seqs = np.zeros((2, 3), np.int32)
    gxa = ipg.gradient_x_activation(model, seqs, 2, A)
    assert ipg.top_components(gxa, 1).tolist() == [[0, 2]]
    ig = ipg.integrated_gradients(model, seqs, 2, A, steps=4)
    # IG completeness on the logit: sum = logit(s = 1) - logit(s = 0) of the scaled set
    full = ipg.answer_logits(model, seqs, 2, np.ones((1, 4)))[:, A].mean()
    off = ipg.answer_logits(model, seqs, 2, np.zeros((1, 4)))[:, A].mean()
    assert abs(ig.sum() - (full - off)) < 1e-3
    # identical clean and corrupt runs patch nothing
    atp = ipg.attribution_patching(model, seqs, seqs, 2, A, 2)
    np.testing.assert_allclose(atp, 0.0, atol=1e-7)


# -- sparse-autoencoder features on the residual stream ---------------------------------


def _hand_sae():
    """An SAE after the hand-set model's block: feature 2 reads and writes dim 1 (the
    planted neuron's write, which the LM head turns into A's logit); feature 0 reads the
    constant dim 0 fifty times over (loud) and writes a thousandth of dim 3, which only
    the final norm reads (removing it moves the norm by about 0.1%). The edit keeps the
    reconstruction error, so at scale 1 the model is unchanged."""
    sae = SparseAutoencoder(4, 4, rngs=nnx.Rngs(0))
    enc, dec = np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)
    enc[1, 2], dec[2, 1] = 1.0, 1.0
    enc[0, 0], dec[0, 3] = 50.0, 1e-3
    sae.w_enc[...], sae.w_dec[...] = jnp.asarray(enc), jnp.asarray(dec)
    return ipg.SAEFeatures({0: sae})


def test_ipg_recovers_the_planted_sae_feature_where_activation_magnitude_does_not():
    model, space = _hand_set(planted=2, loud=0), _hand_sae()
    prompts = np.zeros((256, 2), np.int32)

    def reward(rows, comp):
        return ((comp[:, 0] == A) & (comp[:, 1] == A)).astype(np.float32)

    att = ipg.integrated_policy_gradient(model, prompts, reward, max_new_tokens=2, steps=6,
                                         samples=4, seed=1, space=space)
    assert att.scores.shape == (1, 4)
    assert ipg.top_components(att.scores, 1).tolist() == [[0, 2]]
    assert att.scores[0, 2] > 5 * np.abs(np.delete(att.scores[0], 2)).max()
    acts = ipg.activation_magnitude(model, np.zeros((4, 4), np.int32), space)
    assert ipg.top_components(acts, 1).tolist() == [[0, 0]]
    # the same behaviour as the planted neuron's: J(1) - J(0) is the neuron test's
    kw = dict(max_new_tokens=2, temperature=1.0, seed=3)
    p = np.zeros((1024, 2), np.int32)
    on = ipg.outcome(model, p, reward, **kw)
    off = ipg.outcome(model, p, reward, ipg.set_scale((1, 4), [[0, 2]], 0.0), space=space, **kw)
    loud = ipg.outcome(model, p, reward, ipg.set_scale((1, 4), [[0, 0]], 0.0), space=space,
                       **kw)
    assert on - off > 0.6 and abs(on - loud) < 0.06
    assert abs(att.scores.sum() - (on - off)) < 0.1
    # answer-logit baselines on the features: the logit moves with feature 2 only
    seqs = np.zeros((2, 3), np.int32)
    gxa = ipg.gradient_x_activation(model, seqs, 2, A, space)
    assert ipg.top_components(gxa, 1).tolist() == [[0, 2]] and abs(gxa[0, 0]) < 1e-6
    full = ipg.answer_logits(model, seqs, 2, np.ones((1, 4)), space)[:, A].mean()
    zero = ipg.answer_logits(model, seqs, 2, np.zeros((1, 4)), space)[:, A].mean()
    ig = ipg.integrated_gradients(model, seqs, 2, A, steps=4, space=space)
    assert abs(ig.sum() - (full - zero)) < 1e-3


def test_attribution_patching_on_features_reads_features_off_in_the_clean_run():
    """AtP on SAE features uses the exact feature gradient: a feature that is 0 in the
    clean run and on in the corrupt one gets its first-order effect (the neuron hook's
    ratio form would give it 0)."""
    model, space = _hand_set(planted=2, loud=0), _hand_sae()
    sae = space.saes[0]
    enc = np.asarray(sae.w_enc[...]).copy()
    enc[2, 1] = 1.0              # feature 1 reads dim 2, which token 1's embedding sets
    dec = np.asarray(sae.w_dec[...]).copy()
    dec[1, 1] = 1.0              # and writes dim 1 (A's logit)
    sae.w_enc[...], sae.w_dec[...] = jnp.asarray(enc), jnp.asarray(dec)
    emb = np.asarray(model.embed.embedding[...]).copy()
    emb[1, 2] = 1.0
    model.embed.embedding[...] = jnp.asarray(emb)
    clean, corrupt = np.zeros((2, 3), np.int32), np.array([[0, 0, 1], [0, 0, 1]], np.int32)
    atp = ipg.attribution_patching(model, clean, corrupt, 2, A, 2, space)
    assert atp[0, 1] > 0.5                                  # off in clean, on in corrupt
    assert ipg.activations(model, clean, space)[0, :, 2, 1].max() == 0.0
    # identical runs patch nothing
    np.testing.assert_allclose(ipg.attribution_patching(model, clean, clean, 2, A, 2, space),
                               0.0, atol=1e-7)


def test_rank_correlation_on_hand_cases():
    assert ipg.rank_correlation([[1, 2, 3, 4]], [[10, 20, 30, 40]]) == pytest.approx(1.0)
    assert ipg.rank_correlation([[-4, 3, -2, 1]], [[1, 2, 3, 4]]) == pytest.approx(-1.0)
    assert ipg.rank_correlation([[1, 2, 3]], [[0, 0, 0]]) == 0.0          # flat truth
    # ties share their mean rank: scipy.stats.spearmanr([1, 1, 2], [1, 2, 3]) = 0.866
    assert ipg.rank_correlation([[1, 1, 2]], [[1, 2, 3]]) == pytest.approx(0.8660254)
    with pytest.raises(ValueError, match="truth has 2 entries"):
        ipg.rank_correlation([[1, 2, 3]], [[1, 2]])


def test_sae_features_check_the_model():
    space = _hand_sae()
    with pytest.raises(ValueError, match="the model has 1 blocks"):
        ipg.SAEFeatures({3: space.saes[0]}).shape(_hand_set())
    with pytest.raises(ValueError, match="d_model=4"):
        space.shape(_model())
    with pytest.raises(ValueError, match="saes is empty"):
        ipg.SAEFeatures({})
    with pytest.raises(ValueError, match="layer=1"):
        ipg.residual_stream(_hand_set(), np.zeros((1, 2), np.int32), 1)


# -- the task -------------------------------------------------------------------------


def test_chain_task_rewards_and_the_skip_chain():
    task = plant.ChainTask(n_operands=4, modulus=5)
    xs = np.array([[1, 2, 3, 4], [0, 0, 0, 1]])
    ok = task.chains(xs)
    np.testing.assert_array_equal(ok[0], [3 + 5, 1 + 5, 0 + 5, plant.ANS, 0 + 5, plant.EOS])
    skip = task.chains(xs, skip=np.array([True, False]))
    np.testing.assert_array_equal(skip[0, :3], [1 + 5, 4 + 5, 3 + 5])   # x2 left out
    np.testing.assert_array_equal(task.rewards(xs, ok), [1, 1])
    np.testing.assert_array_equal(task.rewards(xs, skip), [0, 1])


def test_chain_task_shortcuts_stay_near_chance():
    task = plant.ChainTask(n_operands=4, modulus=5)
    xs = task.operands(4000, seed=0)
    ans = task.answers(xs)
    chance = 1 / task.modulus
    majority = np.bincount(ans, minlength=5).max() / ans.size
    rules = {"majority": np.full_like(ans, np.bincount(ans).argmax()),
             "last operand": xs[:, -1], "first operand": xs[:, 0],
             "skip x2 (the ablated chain)": (xs.sum(1) - xs[:, 1]) % 5,
             "partial sum of two": (xs[:, 0] + xs[:, 1]) % 5}
    assert abs(majority - chance) < 0.03
    for name, guess in rules.items():
        assert abs(np.mean(guess == ans) - chance) < 0.04, name


# -- bad input ------------------------------------------------------------------------


def test_bad_input_names_the_field():
    model = _model()
    shape = (2, 16)
    with pytest.raises(ValueError, match="unknown layer 5"):
        ipg.set_scale(shape, [[5, 0]], 0.0)
    with pytest.raises(ValueError, match="unknown neuron 16"):
        ipg.set_scale(shape, [[0, 16]], 0.0)
    with pytest.raises(ValueError, match="components has shape"):
        ipg.component_mask(shape, components=[1, 2, 3])
    with pytest.raises(ValueError, match=r"layers=\[2\] has unknown layers"):
        ipg.component_mask(shape, layers=[2])
    with pytest.raises(ValueError, match="steps=0"):
        ipg.integration_points("gausslegendre", 0)
    with pytest.raises(ValueError, match="method='simpson'"):
        ipg.integration_points("simpson", 4)
    prompts = np.zeros((4, 2), np.int32)
    with pytest.raises(ValueError, match="steps=0"):
        ipg.integrated_policy_gradient(model, prompts, lambda r, c: np.ones(len(r)),
                                       max_new_tokens=2, steps=0)
    with pytest.raises(ValueError, match=r"reward has shape \(3,\); expected one per"):
        ipg.integrated_policy_gradient(model, prompts, lambda r, c: np.ones(3),
                                       max_new_tokens=2, steps=1)
    with pytest.raises(ValueError, match="reward contains NaN"):
        ipg.integrated_policy_gradient(model, prompts, lambda r, c: np.full(len(r), np.nan),
                                       max_new_tokens=2, steps=1)
    with pytest.raises(ValueError, match="unknown neuron"):
        ipg.integrated_policy_gradient(model, prompts, lambda r, c: np.ones(len(r)),
                                       max_new_tokens=2, steps=1, components=[[0, 99]])
    with pytest.raises(ValueError, match="k=0"):
        ipg.top_components(np.ones(shape), 0)
    with pytest.raises(ValueError, match="n_operands=2"):
        plant.ChainTask(n_operands=2)
