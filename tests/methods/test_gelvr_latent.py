"""GeLVR's reasoning steps on a zoo VLM: zero steps is the zoo's scoring; a teacher-forced
word chain equals the zoo's scoring of a prompt with those words spliced in (positions,
masks and M-RoPE rows of the steps); latent slots are the final-normed hidden states;
the rollout's recorded actions replay to the same trajectory; the zoom target and the
slots' targets in a chain's order (the named object, then the answer's)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.data import image_qa, render_images
from lab.data.synthetic.render import object_box
from lab.methods import gelvr
from lab.methods.gelvr import latent, training
from lab.methods.gelvr.policy import hybrid_log_prob
from lab.methods.gelvr.vmf import mean_resultant_length
from lab.nn import VLM
from lab.zoo import vlm as zvlm

SIZE = 16


@pytest.fixture(scope="module")
def setup():
    cfg = zvlm.vlm_config(32, 1, 1, max_frames=2, size=SIZE)
    model = VLM(cfg, rngs=nnx.Rngs(0))
    ds = image_qa(6, 0, size=SIZE, low_size=8, object_size=7, distractors=(0, 1))
    images = render_images(ds)
    return cfg, model, ds, images


def _batch(cfg, images, questions, options):
    return zvlm.encode(cfg, images[:, None], questions, options)


def test_zero_steps_is_the_zoo_scoring(setup):
    cfg, model, ds, images = setup
    b = _batch(cfg, images, ds["question"], ds["options"])
    st = latent.run_steps(model, latent.arrays(b), b.grid, 0)
    np.testing.assert_allclose(jax.nn.softmax(st.scores, -1), zvlm.option_posteriors(model, b),
                               atol=1e-5)
    assert st.means.shape == (6, 0, 32)


def test_teacher_forced_words_equal_the_spliced_prompt(setup):
    # "<bos> question <image> w1 w2 <answer>" scored the zoo's way (rope_index positions)
    cfg, model, ds, images = setup
    tok = zvlm.TOKENIZER
    words = [f"{c} {k}" for c, k in zip(["red"] * 6, ["circle", "7", "cross", "2", "square",
                                                       "triangle"], strict=True)]
    ids = jnp.asarray([tok.encode(w) for w in words])
    b = _batch(cfg, images, ds["question"], ds["options"])
    st = latent.run_steps(model, latent.arrays(b), b.grid, 2,
                          latent.teacher(model.language_model, ids))
    spliced = _batch(cfg, images, ds["question"], ds["options"])
    row_ids = spliced.ids.copy()
    t = row_ids.shape[1]
    new_ids = np.full((6, t + 2), tok.pad_id, np.int32)
    new_valid = np.zeros((6, t + 2), bool)
    for i in range(6):
        row = row_ids[i][spliced.valid[i]].tolist()
        row = row[:-1] + np.asarray(ids[i]).tolist() + row[-1:]
        new_ids[i, t + 2 - len(row):] = row
        new_valid[i, t + 2 - len(row):] = True
    rope, nxt = zvlm.rope_index(new_ids, cfg, None, np.array(spliced.grid))
    spliced.ids, spliced.valid, spliced.rope, spliced.nxt = new_ids, new_valid, rope, nxt
    np.testing.assert_allclose(jax.nn.softmax(st.scores, -1),
                               zvlm.option_posteriors(model, spliced), atol=1e-5)
    # the step logits are the spliced prompt's next-word logits before each word
    e = model.embed(new_ids, pixel_values_videos=spliced.pixels,
                    video_grid_thw=np.array(spliced.grid), rope_positions=(rope, nxt))
    full = model.language_model(inputs_embeds=e.inputs_embeds, positions=e.positions,
                                rope_positions=e.rope_positions, mask=jnp.asarray(new_valid))
    np.testing.assert_allclose(st.logits[:, 0], full[:, -4], atol=1e-4)
    np.testing.assert_allclose(st.logits[:, 1], full[:, -3], atol=1e-4)


def test_latent_slots_are_final_normed_states_fed_back(setup):
    cfg, model, ds, images = setup
    b = _batch(cfg, images, ds["question"], ds["options"])
    x = latent.arrays(b)
    st = latent.run_steps(model, x, b.grid, 3)
    np.testing.assert_allclose(st.inputs, st.means, atol=1e-6)
    # slot 0 is the state at <vision_end>: the norm of the last block output there
    e = model.embed(x["ids"][:, :-1], pixel_values_videos=x["pixels"],
                    video_grid_thw=np.array(b.grid),
                    rope_positions=(x["rope"][:, :, :-1], x["nxt"] - 1))
    _, inter = model.language_model(inputs_embeds=e.inputs_embeds, positions=e.positions,
                                    rope_positions=e.rope_positions, mask=x["valid"][:, :-1],
                                    capture=("hidden",))
    np.testing.assert_allclose(st.means[:, 0],
                               model.language_model.norm(inter.hidden[-1][:, -1]), atol=1e-5)
    assert not np.allclose(st.scores, latent.run_steps(model, x, b.grid, 0).scores)


@pytest.mark.parametrize("family", ["vmf", "gaussian"])
def test_rollout_replays_and_its_density(setup, family):
    cfg, model, ds, images = setup
    b = _batch(cfg, images, ds["question"], ds["options"])
    x = latent.arrays(b)
    ro = latent.sample_rollout(model, x, jax.random.key(1), grid=b.grid, num_steps=2,
                               family=family, kappa=50.0)
    assert ro.actions.shape == (6, 2, 32)
    if family == "vmf":
        np.testing.assert_allclose(np.linalg.norm(ro.actions, axis=-1), 1.0, atol=1e-5)
    out = latent.policy_output(model, x, b.grid, ro.actions, family=family, kappa=50.0)
    targets = jnp.concatenate([jnp.zeros((6, 2), jnp.int32), ro.answer[:, None]], 1)
    acts = jnp.concatenate([ro.actions, jnp.zeros((6, 1, 32))], 1)
    is_lat = jnp.array([[True, True, False]] * 6)
    lp = hybrid_log_prob(out, targets, acts, is_lat, family=family)
    np.testing.assert_allclose(lp[:, 2], ro.answer_logp, atol=1e-5)   # same trajectory
    assert np.isfinite(lp).all()
    # the Gaussian's spread matches the vMF's mean cosine to the mean direction
    c = latent.gaussian_scale(32, 50.0)
    a = float(mean_resultant_length(32, 50.0))
    assert abs(1 / np.sqrt(1 + c**2 * 32) - a) < 1e-6


def test_zoom_and_centre_tokens():
    img = np.zeros((1, 16, 16, 3), np.uint8)
    img[0, 2:4, 12:14] = 255
    z = latent.zoom(img, [[12, 2, 2, 2]], 8)      # moved inside: columns 8-15, rows 0-7
    assert z.shape == img.shape
    np.testing.assert_array_equal(z[0, 4:8, 8:12], 255)
    assert (z[0] == 255).sum() == 16 * 3
    np.testing.assert_array_equal(latent.centre_tokens(4), [5, 6, 9, 10])
    np.testing.assert_array_equal(latent.centre_tokens(2), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="side=5 must divide"):
        latent.zoom(img, [[0, 0, 1, 1]], 5)


def test_zoom_features_and_low_resolution(setup):
    cfg, model, ds, images = setup
    f = latent.zoom_features(model, images, ds["target_box"])
    assert f.shape == (6, 4, 32) and np.isfinite(f).all()
    low = latent.low_resolution(images, 2)
    assert low.shape == images.shape
    np.testing.assert_array_equal(low[:, ::2, ::2], render_images(ds, low=True))


def test_perception_targets_visit_the_named_object_then_the_answers(setup):
    cfg, model, _, _ = setup
    kw = dict(size=SIZE, low_factor=2, object_size=7, distractors=2)
    for qts in (("match",), ("identify", "colour")):
        data = training.perception_data(model, 4, 3, question_types=qts, **kw)
        ds = image_qa(4, 3, size=SIZE, low_size=8, object_size=7, distractors=2,
                      question_types=qts)
        answer = latent.zoom_features(model, data.high, ds["target_box"])
        assert data.target.shape == (4, 8, 32)
        if qts == ("match",):     # the anchor's tokens, then the answer's
            named = latent.zoom_features(model, data.high,
                                         [object_box(o[-2]) for o in ds["objects"]])
            np.testing.assert_allclose(data.target, np.concatenate([named, answer], 1),
                                       atol=1e-6)
            assert not np.allclose(named, answer)
        else:                     # one hop: each answer token twice, pooling back to them
            np.testing.assert_allclose(data.target, np.repeat(answer, 2, 1), atol=1e-6)
            np.testing.assert_allclose(gelvr.pool_slots(jnp.asarray(data.target), 4), answer,
                                       atol=1e-6)
