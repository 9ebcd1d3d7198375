"""The VLM zoo (lab.zoo.vlm): prompt and option encoding, the batched option posterior
against lab.nn.choice_posterior, bad input, the regime rules on fabricated results, and a
tiny model that learns and is cached; the named models' regime is a deep test."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from lab import zoo
from lab.data import video_qa
from lab.data.synthetic.render import BACKGROUND
from lab.nn import VLM, choice_posterior
from lab.zoo import vlm as V

TINY = V.vlm_config(32, 1, 1, max_frames=4, size=16)


@pytest.fixture(scope="module")
def tiny_model():
    return VLM(TINY, rngs=nnx.Rngs(0))


def _videos(b, f, size=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (b, f, size, size, 3)).astype(np.uint8)


def test_tokenizer_covers_every_question_and_option_word_of_the_generators():
    ds = video_qa(200, seed=1)
    tok = V.TOKENIZER
    for q, opts in zip(ds["question"], ds["options"], strict=True):
        assert tok.unk_id not in tok.encode(q), q
        for o in opts:
            assert tok.unk_id not in tok.encode(o), o
    assert tok.decode(tok.encode("In which order did the circle, the 7 and the cross appear?")
                      ) == "in which order did the circle the 7 and the cross appear"
    assert tok.encode("zebra") == [tok.unk_id]


def test_prompt_layout_question_then_frames_then_answer(tiny_model):
    enc = V.encode(TINY, _videos(2, 3), ["what colour was the circle", "how many 7s appeared"],
                   [["red", "blue"], ["1", "2"]])
    tok = V.TOKENIZER
    per = V.tokens_per_frame(TINY, 16)
    assert per == 4
    row = enc.ids[0][enc.valid[0]].tolist()
    assert row[0] == tok.bos_id and row[-1] == tok.answer_id
    assert tok.decode(row[1:6]) == "what colour was the circle"
    frames = row[6:-1]
    assert frames == [tok.vision_start_id, *[tok.video_id] * per, tok.vision_end_id] * 3
    assert not enc.valid[0][0]                           # left padding
    assert enc.options.shape == (2, 2, 5) and enc.opt_valid[0].sum() == 2


def test_batched_option_posterior_equals_choice_posterior_row_by_row(tiny_model):
    videos = _videos(2, 2)
    questions = ["what colour was the circle", "in which order did the circle appear"]
    options = [["red", "green blue", "white"], ["circle then 7 then cross", "7", "3"]]
    got = V.posteriors(tiny_model, videos, questions, options, batch_size=2)
    for b in range(2):
        enc = V.encode(TINY, videos[b:b + 1], questions[b:b + 1], options[b:b + 1])
        ids = enc.ids[0][enc.valid[0]][None]
        opts = [V.TOKENIZER.encode(o) for o in options[b]]
        want = choice_posterior(tiny_model, ids, opts, pixel_values_videos=enc.pixels,
                                video_grid_thw=np.array(enc.grid))
        np.testing.assert_allclose(got[b], np.asarray(want)[0], atol=2e-5)


def test_blank_frames_keeps_the_given_frames_and_empties_the_rest():
    v = _videos(2, 4)
    out = V.blank_frames(v, [[1, 3], np.array([True, False, False, False])])
    assert (out[0, [1, 3]] == v[0, [1, 3]]).all() and (out[0, [0, 2]] == BACKGROUND).all()
    assert (out[1, 0] == v[1, 0]).all() and (out[1, 1:] == BACKGROUND).all()
    with pytest.raises(ValueError, match=r"keep\[0\] has shape \(3,\)"):
        V.blank_frames(v, [np.array([True, False, True])])


def test_region_labels_name_the_kind_under_each_visual_token():
    ds = V.stage_data({"image_qa": {"size": 32, "low_size": 32, "object_size": 8,
                                    "distractors": 0}}, 20, 3)
    labels = V.region_labels(ds, V.vlm_config(32, 1, 1))
    assert labels.shape == (20, 1, 16)
    tok = V.TOKENIZER
    for row, lab in zip(ds, labels, strict=True):
        kind = row["objects"][-1]["kind"]
        named = set(lab.ravel().tolist()) - {tok.pad_id}
        assert named == {tok.vocab[V.KINDS[kind]]}, (row["objects"], lab)


def test_colour_region_labels_name_the_colour_at_the_same_tokens_as_the_kind():
    ds = V.stage_data({"image_qa": {"size": 32, "low_size": 32, "object_size": 8,
                                    "distractors": (0, 2)}}, 20, 4)
    config = V.vlm_config(32, 1, 1)
    kinds = V.region_labels(ds, config)
    colours = V.region_labels(ds, config, attribute="colour")
    tok = V.TOKENIZER
    assert ((kinds == tok.pad_id) == (colours == tok.pad_id)).all()
    colour_words = {tok.vocab[c] for c in V.COLOUR_NAMES}
    assert set(colours[colours != tok.pad_id].tolist()) <= colour_words
    one = [i for i, row in enumerate(ds) if len(row["objects"]) == 1]
    assert one
    for i in one:
        named = set(colours[i].ravel().tolist()) - {tok.pad_id}
        assert named == {tok.vocab[V.COLOUR_NAMES[ds[i]["objects"][0]["colour"]]]}
    with pytest.raises(ValueError, match="attribute='size'; expected 'kind' or 'colour'"):
        V.region_labels(ds, config, attribute="size")


def test_colour_term_is_a_softmax_over_the_colour_words_beside_the_kinds():
    """With ``colour_weight`` the loss adds, at each object token, the cross-entropy of the
    colour over the colour words only, and the kind term becomes a softmax over <pad> and
    the kinds: raising a colour word's logit leaves the kind term unchanged."""
    import jax.numpy as jnp
    import optax

    tok = V.TOKENIZER
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 5, tok.vocab_size)), jnp.float32)
    labels = np.array([[-1, tok.pad_id, tok.vocab["circle"], tok.vocab["7"], -1],
                       [tok.pad_id, tok.vocab["square"], -1, -1, -1]], np.int32)
    red, blue, c5 = (tok.vocab[V.COLOUR_NAMES[i]] for i in (2, 0, 5))
    colour = np.array([[-1, tok.pad_id, red, blue, -1], [tok.pad_id, c5, -1, -1, -1]], np.int32)
    colour_index = np.array([[-1, -1, 2, 0, -1], [-1, 5, -1, -1, -1]], np.int32)
    kind_ids = np.array([tok.pad_id, *(tok.vocab[k] for k in V.KINDS)])
    colour_ids = np.array([tok.vocab[c] for c in V.COLOUR_NAMES])

    def terms(lg):
        obj, empty = labels > tok.pad_id, labels == tok.pad_id
        ce = optax.softmax_cross_entropy_with_integer_labels(
            lg[..., kind_ids], np.array([[list(kind_ids).index(w) if w >= 0 else 0
                                          for w in row] for row in labels]))
        kind = (jnp.sum(jnp.where(obj, ce, 0)) / obj.sum()
                + 0.2 * jnp.sum(jnp.where(empty, ce, 0)) / empty.sum())
        cc = optax.softmax_cross_entropy_with_integer_labels(lg[..., colour_ids],
                                                             np.maximum(colour_index, 0))
        has = colour_index >= 0
        return kind, jnp.sum(jnp.where(has, cc, 0)) / has.sum()

    kind, col = terms(logits)
    bumped = logits.at[..., colour_ids[0]].add(5.0)
    assert float(terms(bumped)[0]) == pytest.approx(float(kind), abs=1e-6)
    assert float(terms(bumped)[1]) != pytest.approx(float(col), abs=1e-3)
    # the loss function's region terms are these (the QA term is the rest)
    got = V._region_terms(logits, jnp.asarray(labels), jnp.asarray(colour), 1.0, 0.5)
    assert float(got[0]) == pytest.approx(float(kind + 0.5 * col), rel=1e-5)
    got0 = V._region_terms(logits, jnp.asarray(labels), jnp.asarray(colour), 1.0, 0.0)
    full = optax.softmax_cross_entropy_with_integer_labels(logits, np.maximum(labels, 0))
    obj, empty = labels > tok.pad_id, labels == tok.pad_id
    want = (jnp.sum(jnp.where(obj, full, 0)) / obj.sum()
            + 0.2 * jnp.sum(jnp.where(empty, full, 0)) / empty.sum())
    assert float(got0[0]) == pytest.approx(float(want), rel=1e-5)


def test_recipe_adds_the_colour_term_only_when_asked():
    assert all("region_colour_weight" not in st for st in V.recipe(10, (5, 5)))
    weights = [st["region_colour_weight"] for st in V.recipe(10, (5, 5), colour_weight=1.0)]
    assert weights == [1.0, 0.5, 0.5]


def test_fresh_recipe_generates_a_row_per_draw_and_keeps_the_rest():
    plain, fresh = V.recipe(10, (5, 7)), V.recipe(10, (5, 7), fresh=True)
    assert [st["n_train"] for st in plain] == [8000, 4000, 4000]
    assert [st["n_train"] for st in fresh] == [10 * 32, 5 * 16, 7 * 16]
    assert [{k: v for k, v in st.items() if k != "n_train"} for st in fresh] == \
        [{k: v for k, v in st.items() if k != "n_train"} for st in plain]


@pytest.mark.parametrize("bad, match", [
    (lambda v: v.astype(np.float32), "videos has dtype float32; expected uint8"),
    (lambda v: v[:, 0], r"videos has shape \(2, 16, 16, 3\); expected \[B, F, H, W, 3\]"),
    (lambda v: v[:, :, :12, :12], "frames of 12x12; expected square frames whose side is a "
                                  "multiple of 2 x patch_size = 8"),
    (lambda v: np.concatenate([v] * 3, axis=1), "videos has 6 frames of 16x16: .* position "
                                                "budget \\(at most 5 frames\\)"),
])
def test_bad_frames_are_refused_naming_the_input_and_the_limit(bad, match):
    with pytest.raises(ValueError, match=match):
        V.encode(TINY, bad(_videos(2, 2)), ["what colour was the circle"] * 2,
                 [["red", "blue"]] * 2)


def test_bad_options_and_questions_are_refused():
    v = _videos(1, 1)
    with pytest.raises(ValueError, match="options has 1 option\\(s\\) per row; .* at least 2"):
        V.encode(TINY, v, ["what colour was the circle"], [["red"]])
    with pytest.raises(ValueError, match=r"options\[0\]\[1\]='\?\!' has 0 words"):
        V.encode(TINY, v, ["what colour was the circle"], [["red", "?!"]])
    with pytest.raises(ValueError, match=r"questions\[0\] has 17 words"):
        V.encode(TINY, v, ["red " * 17], [["red", "blue"]])
    with pytest.raises(ValueError, match="questions \\(2\\) and options \\(1\\)"):
        V.encode(TINY, v, ["a", "b"], [["red", "blue"]])


LISTED = V.vlm_config(32, 1, 1, max_frames=4, size=16, prompt="listed")


def test_listed_prompt_shows_the_options_under_letters_and_scores_the_letter():
    tok = V.LISTED_TOKENIZER
    assert tok.vocab_size == V.TOKENIZER.vocab_size + len(V.LETTERS)
    assert all(tok.vocab[w] == i for w, i in V.TOKENIZER.vocab.items())   # old ids kept
    enc = V.encode(LISTED, _videos(1, 2), ["what colour was the circle"],
                   [["red", "green blue", "white"]], tokenizer=tok)
    row = enc.ids[0][enc.valid[0]].tolist()
    assert tok.decode(row[:13]) == "<bos> what colour was the circle a red b green blue c white"
    assert row[13] == tok.vision_start_id and row[-1] == tok.answer_id
    assert enc.options[0, :, 0].tolist() == [tok.vocab[c] for c in "abc"]
    assert enc.options.shape == (1, 3, 1) and enc.opt_valid.all()
    shown = V.prompt_tokenizer("shown")    # the same listing, each option scored by its words
    enc2 = V.encode(V.vlm_config(32, 1, 1, max_frames=4, size=16, prompt="shown"),
                    _videos(1, 2), ["what colour was the circle"],
                    [["red", "green blue", "white"]], tokenizer=shown)
    assert enc2.ids.tolist() == enc.ids.tolist() and enc2.options.shape == (1, 3, 5)
    assert tok.decode(enc2.options[0, 1][enc2.opt_valid[0, 1]]) == "green blue"


def test_listed_posterior_is_the_softmax_of_the_option_letters_after_the_prompt():
    model = VLM(LISTED, rngs=nnx.Rngs(1))
    tok = V.LISTED_TOKENIZER
    videos = _videos(2, 2, seed=3)
    questions = ["what colour was the circle", "in which order did the circle appear"]
    options = [["red", "green blue", "white"], ["circle then 7 then cross", "7", "3"]]
    got = V.posteriors(model, videos, questions, options, batch_size=2, tokenizer=tok)
    for b in range(2):
        enc = V.encode(LISTED, videos[b:b + 1], questions[b:b + 1], options[b:b + 1],
                       tokenizer=tok)
        ids = enc.ids[0][enc.valid[0]][None]
        logits = model(ids, pixel_values_videos=enc.pixels, video_grid_thw=np.array(enc.grid))
        letters = np.asarray(logits)[0, -1, list(tok.letter_ids[:3])]
        want = np.exp(letters - letters.max()) / np.exp(letters - letters.max()).sum()
        np.testing.assert_allclose(got[b], want, atol=2e-5)


def test_listed_prompt_input_is_checked_against_the_model_and_the_letters():
    v = _videos(1, 1)
    with pytest.raises(ValueError, match="tokenizer has 75 ids .*'listed'.* vocab_size is 67"):
        V.encode(TINY, v, ["what colour was the circle"], [["red", "blue"]],
                 tokenizer=V.LISTED_TOKENIZER)
    with pytest.raises(ValueError, match="9 options per row; the listed prompt has 8 letters"):
        V.encode(LISTED, v, ["what colour was the circle"], [["red"] * 9],
                 tokenizer=V.LISTED_TOKENIZER)
    with pytest.raises(ValueError, match="prompt=.free.; expected one of"):
        V.vlm_config(32, 1, 1, prompt="free")
    spec = V.NAMED["vlm-test"]
    with pytest.raises(ValueError, match="prompt='listed' has 75 ids"):
        dataclasses.replace(spec, prompt="listed")
    listed = dataclasses.replace(spec, model=V.vlm_config(32, 1, 1, max_frames=4, size=16,
                                                           prompt="listed"), prompt="listed")
    assert listed.tokenizer is V.LISTED_TOKENIZER and listed.digest() != spec.digest()
    assert "prompt" not in spec.hashed_fields()      # scored entries keep their old keys


def _result(all_frames, evidence):
    types = ("lookup", "ordering", "counting", "negation", "summary")
    return {"all_frames": {**dict(zip(types, all_frames, strict=True)),
                           "all": float(np.mean(all_frames))},
            "evidence_only": {**dict(zip(types, evidence, strict=True)),
                              "all": float(np.mean(evidence))}}


def test_regime_rules_hold_and_fail_on_fabricated_results():
    good = V.regime_checks(_result([0.8, 0.45, 0.5, 0.6, 0.4], [0.9, 0.5, 0.6, 0.7, 0.5]))
    assert good["ok"] and not good["types_near_chance"]
    near = V.regime_checks(_result([0.8, 0.3, 0.5, 0.6, 0.4], [0.9, 0.5, 0.6, 0.7, 0.5]))
    assert not near["ok"] and near["types_near_chance"] == ["ordering"]
    ceiling = V.regime_checks(_result([0.8, 0.45, 0.95, 0.6, 0.4], [0.9, 0.5, 0.96, 0.7, 0.5]))
    assert not ceiling["below_ceiling"] and ceiling["hard_types_at_ceiling"] == ["counting"]
    worse = V.regime_checks(_result([0.8, 0.45, 0.5, 0.6, 0.4], [0.7, 0.4, 0.5, 0.6, 0.4]))
    assert not worse["evidence_at_least_all"] and not worse["ok"]
    small, large = _result([0.5] * 5, [0.5] * 5), _result([0.6] * 5, [0.6] * 5)
    assert V.family_checks([("xs", small), ("s", large)])["ordered"]
    assert V.family_checks([("xs", large), ("s", small)])["violations"] == [
        "xs 0.600 >= s 0.500"]
    with pytest.raises(ValueError, match="at least two"):
        V.family_checks([("xs", small)])


def test_spec_keys_hash_the_recipe_not_the_name():
    spec = V.NAMED["vlm-xs"]
    assert spec.key.startswith("vlm-xs-") and V.NAMED["vlm-s"].key != spec.key
    renamed = dataclasses.replace(spec, name="other", description="x")
    assert renamed.digest() == spec.digest()
    stages = (dict(spec.stages[0], steps=1), *spec.stages[1:])
    assert dataclasses.replace(spec, stages=stages).digest() != spec.digest()
    listed = zoo.list()
    assert {"vlm-xs", "vlm-s"} <= set(listed) and listed["vlm-xs"]["key"] == spec.key
    with pytest.raises(ValueError, match="unknown"):
        V.get_spec("vlm-xxl")


def test_tiny_vlm_learns_a_colour_and_is_cached(tmp_path, monkeypatch):
    """vlm-test trains on first use (about 20 CPU-seconds), learns the colour of the one
    object held out, and a second load reads the cache."""
    monkeypatch.setenv("LAB_CACHE", str(tmp_path))
    monkeypatch.delenv(zoo.SOURCE_ENV, raising=False)
    spec = V.NAMED["vlm-test"]
    model, tok = zoo.load("vlm-test", progress=False)
    assert isinstance(model, VLM) and tok is V.TOKENIZER
    m = zoo.metrics("vlm-test")
    curve = [c["loss"] for c in m["curve"]]
    assert np.mean(curve[-2:]) < curve[0] - 0.3, curve
    assert m["held_out_images"]["all_frames"]["colour"] > 0.6, m["held_out_images"]
    assert set(m["held_out"]) == {"all_frames", "evidence_only", "no_frames", "n"}
    assert set(m["regime"]) >= {"above_chance", "below_ceiling", "evidence_at_least_all", "ok"}
    count = V.TRAININGS[spec.key]
    again, _ = zoo.load("vlm-test")
    assert V.TRAININGS[spec.key] == count and zoo.loads()[-1]["source"] == "trained"  # read
    a, b = V._flat(model), V._flat(again)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def _train_as_a_user_would(names, cache):
    """Loads (trains on first use) the named zoo VLMs into ``cache`` in a fresh process
    with the caller's XLA flags minus the suite's optimisation level 0
    (tests/conftest.py): the recipe's outcome moves with float rounding (vlm-xs trained at
    level 0 reached 0.343 with all frames, 0.407 at the default level), and the regime
    users get is the default level's."""
    import os
    import subprocess
    import sys

    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if "xla_backend_optimization_level" not in f)
    env = {**os.environ, "XLA_FLAGS": flags, "LAB_CACHE": str(cache), "LAB_ZOO": "cache"}
    code = "from lab import zoo\n" + "".join(f"zoo.load({n!r}, progress=False)\n"
                                             for n in names)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.deep
def test_named_vlms_see_the_frames_and_gain_from_the_evidence():
    """vlm-xs and vlm-s retrained from scratch (not the shipped weights) at XLA's default
    optimisation level, about 38 and 57 CPU-minutes, or cached under LAB_CACHE: the
    question alone is at chance, the frames lift accuracy well over it, evidence-only
    input is at least as accurate as all frames, and the image-stage negation questions
    carry over to the videos (measured all frames / evidence only: 0.703 / 0.750 and
    0.604 / 0.701; negation 0.905 and 0.865)."""
    import os

    names = ("vlm-xs", "vlm-s")
    _train_as_a_user_would(names, os.environ["LAB_CACHE"])
    for name in names:
        zoo.load(name, source="cache")
        h = zoo.metrics(name)["held_out"]
        assert abs(h["no_frames"]["all"] - 0.25) < 0.06, (name, h["no_frames"])
        assert h["all_frames"]["all"] > h["no_frames"]["all"] + 0.25, (name, h)
        assert h["evidence_only"]["all"] >= h["all_frames"]["all"], (name, h)
        assert h["all_frames"]["ordering"] > 0.75, (name, h["all_frames"])
        assert h["all_frames"]["negation"] > 0.75, (name, h["all_frames"])
