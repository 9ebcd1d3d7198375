"""GLR: the jitted latent loop against an unjitted step-by-step reference, training lowers
the loss, the continuation / anchors data, shortcut rules near chance, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.data import ByteTokenizer
from lab.data.synthetic.arithmetic import arithmetic
from lab.methods import glr
from lab.nn import Transformer, TransformerConfig

TOK = ByteTokenizer()


def _tiny(seed=0):
    cfg = TransformerConfig(vocab_size=264, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                            head_dim=16, d_ff=64, max_len=64)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    head = glr.TransitionHead(32, 32, rngs=nnx.Rngs(seed + 1))
    # a head that moves: the untrained one starts at zero update
    head.out.kernel[...] = 0.3 * jax.random.normal(jax.random.key(seed), head.out.kernel.shape)
    return model, head


def _prompts(n, steps=2, seed=0):
    ds = arithmetic(n, seed, steps=steps, digits=2)
    return ds, np.array([TOK.encode(p, add_bos=True) for p in ds["prompt"]], np.int32)


def test_jitted_latent_loop_equals_the_stepwise_reference():
    model, head = _tiny()
    _, ids = _prompts(3)
    lengths = np.full(3, ids.shape[1])
    for mode in glr.MODES:
        kw = dict(mode=mode, max_new_tokens=3, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
        before = glr._latent_jit._cache_size()
        got = {b: glr.latent_generate(model, head, ids, lengths, latent_steps=b,
                                      max_latent_steps=2, **kw) for b in (0, 2)}
        # every budget up to max_latent_steps shares one compiled program
        assert glr._latent_jit._cache_size() - before == 1
        ref = glr.reference_generate(model, head, ids, latent_steps=2, **kw)
        np.testing.assert_array_equal(np.asarray(got[2].tokens), np.asarray(ref.tokens))
        np.testing.assert_array_equal(np.asarray(got[2].lengths), np.asarray(ref.lengths))
        np.testing.assert_allclose(np.asarray(got[2].latents), np.asarray(ref.latents),
                                   atol=1e-4)
        # the latents moved (GLR's head updates the point, Coconut feeds a hidden state)
        assert float(jnp.abs(got[2].latents[:, 1] - got[2].latents[:, 0]).max()) > 1e-3
        # per-row budgets: each row as in its own scalar-budget run
        mixed = glr.latent_generate(model, head, ids, lengths, latent_steps=[2, 0, 2],
                                    max_latent_steps=2, **kw)
        for i, b in enumerate((2, 0, 2)):
            np.testing.assert_array_equal(np.asarray(mixed.tokens)[i],
                                          np.asarray(got[b].tokens)[i])


def test_continuation_drops_the_replaced_steps():
    c = "23+7=30;30-15=15;15+2=17\nA: 17"
    assert glr.chain_steps(c) == (["23+7=30", "30-15=15", "15+2=17"], "17")
    assert glr.continuation(c, 0) == c
    assert glr.continuation(c, 1) == "30-15=15;15+2=17\nA: 17"
    assert glr.continuation(c, 3) == "\nA: 17"
    with pytest.raises(ValueError, match="completion="):
        glr.chain_steps("23+7=30")


def test_stage_data_anchors_are_the_replaced_steps_tokens():
    ds, _ = _prompts(4)
    data = glr.stage_data(TOK, ds["prompt"], ds["completion"], 1, 32, n_anchors=2)
    steps, _ = glr.chain_steps(ds["completion"][0])
    assert data.anchors.shape == (4, 2, 16)
    n = len(steps[0])
    assert TOK.decode(data.anchors[0, 0, :n]) == steps[0] and data.anchor_mask[0, 0].sum() == n
    text = data.text[0][data.text_mask[0] > 0].tolist()
    assert text[-1] == TOK.eos_id and TOK.decode(text[:-1]) == glr.continuation(
        ds["completion"][0], 1)


def test_training_lowers_the_glr_and_coconut_losses():
    ds, _ = _prompts(64, seed=1)
    data = glr.stage_data(TOK, ds["prompt"], ds["completion"], 1, 32, n_anchors=1)
    batch = {f: jnp.asarray(getattr(data, f)[:32]) for f in glr.StageData._fields}
    for mode in glr.MODES:
        model, head = _tiny(seed=2)
        head.out.kernel[...] = jnp.zeros_like(head.out.kernel[...])
        opt = glr.make_optimizer(model, head, 1e-2, 25, warmup=2)
        hist = glr.train_stage(model, head, opt, data, k=1, max_k=1, mode=mode, steps=25,
                               batch_size=32, seed=0)
        first = np.mean([h["loss"] for h in hist[:3]])
        last = np.mean([h["loss"] for h in hist[-3:]])
        assert last < 0.7 * first, (mode, first, last)
    # GLR's anchor term: a latent within the margin of its anchor costs nothing
    model, head = _tiny(seed=3)
    head.out.kernel[...] = jnp.zeros_like(head.out.kernel[...])
    a = glr.anchor_points(model, batch["anchors"][:, :1], batch["anchor_mask"][:, :1])
    z0 = model.embed(batch["prompt"])[:, -1]
    rel = jnp.linalg.norm(z0 - a[:, 0], axis=-1) / jnp.linalg.norm(a[:, 0], axis=-1)
    loss = nnx.jit(lambda m, h, b, margin: glr.latent_loss(m, h, b, k=1, max_k=1, mode="glr",
                                                           margin=margin)[1]["anchor_loss"])
    np.testing.assert_allclose(float(loss(model, head, batch, 0.0)), float(jnp.mean(rel ** 2)),
                               rtol=1e-4)
    assert float(loss(model, head, batch, float(rel.max()) + 0.01)) == 0.0


def test_shortcut_rules_stay_near_chance():
    from experiments.glr import shortcuts

    train = arithmetic(2048, 0, steps=3, digits=2)
    ev = arithmetic(512, 5, steps=3, digits=2)
    got = shortcuts(train, ev)
    for name, r in got.items():
        if name != "unsigned_sum":
            assert r["accuracy"] < 0.03, (name, r)
    # the unsigned sum is right exactly when every operator is "+": 1/8 of 3-step chains
    all_plus = np.mean([o == "+++" for o in ev["ops"]])
    assert abs(got["unsigned_sum"]["accuracy"] - all_plus) < 1e-9 and all_plus < 0.2


def test_bad_input_gives_clear_errors():
    model, head = _tiny()
    _, ids = _prompts(2)
    kw = dict(max_new_tokens=4, eos_id=TOK.eos_id)
    lengths = np.full(2, ids.shape[1])
    with pytest.raises(ValueError, match="latent_steps=-1"):
        glr.latent_generate(model, head, ids, lengths, latent_steps=-1, **kw)
    with pytest.raises(ValueError, match="latent_steps=-1"):
        glr.reference_generate(model, head, ids, latent_steps=-1, **kw)
    with pytest.raises(ValueError, match="exceeds max_latent_steps=1"):
        glr.latent_generate(model, head, ids, lengths, latent_steps=2, max_latent_steps=1,
                            **kw)
    with pytest.raises(ValueError, match="does not take inputs_embeds"):
        glr.latent_generate(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), head, ids, lengths,
                            latent_steps=1, **kw)
    wrong = glr.TransitionHead(48, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model=48 does not match the model's d_model=32"):
        glr.latent_generate(model, wrong, ids, lengths, latent_steps=1, **kw)
    with pytest.raises(ValueError, match="mode='bogus'"):
        glr.latent_generate(model, head, ids, lengths, latent_steps=1, mode="bogus", **kw)
    with pytest.raises(ValueError, match="max_len=64"):
        glr.latent_generate(model, head, ids, lengths, latent_steps=1, max_new_tokens=60,
                            eos_id=TOK.eos_id)
    with pytest.raises(ValueError, match="prompts have lengths"):
        glr.stage_data(TOK, ["1+2=?\n", "12+2=?\n"], ["1+2=3\nA: 3", "12+2=14\nA: 14"], 1, 16)
    with pytest.raises(ValueError, match="TransitionHead d_model=0"):
        glr.TransitionHead(0, rngs=nnx.Rngs(0))
