"""image_qa: ground truth from the objects and the pixels, the target's size at the two
resolutions, blind baselines and one-hop rules near chance (bounds as in test_video.py),
bad input."""

import datasets
import numpy as np
import pytest

from lab.data import downsample, extract_answer, generate, image_qa, render_images
from lab.data.synthetic.image import IMAGE_QUESTION_TYPES
from lab.data.synthetic.render import (
    COLOUR_NAMES,
    COLOURS,
    KINDS,
    entity_name,
    glyph,
    object_box,
)
from lab.data.synthetic.shortcuts import text_baselines


@pytest.fixture(scope="module")
def ds():
    return image_qa(2000, seed=0)


def test_deterministic_and_ground_truth(ds):
    assert image_qa(20, 3).to_list() == image_qa(20, 3).to_list() == generate(
        "image_qa", 20, seed=3).to_list()
    for r in ds.select(range(500)):
        target, others = r["objects"][-1], r["objects"][:-1]
        ans = r["options"][r["answer_index"]]
        assert extract_answer(r["completion"]) == r["answer"]
        if r["question_type"] == "identify":
            assert KINDS[target["kind"]] == ans
            assert r["question"] == f"What is the {COLOUR_NAMES[target['colour']]} object?"
            assert all(o["colour"] != target["colour"] for o in others)   # the only one
        else:
            assert COLOUR_NAMES[target["colour"]] == ans
            assert all(o["kind"] != target["kind"] for o in others)
        assert 8 <= r["n_distractors"] == len(others) <= 16


def test_target_pixels_at_full_and_low_resolution(ds):
    sub = ds.select(range(100))
    hi, lo = render_images(sub), render_images(sub, low=True)
    assert hi.shape == (100, 128, 128, 3) and lo.shape == (100, 32, 32, 3)
    np.testing.assert_array_equal(downsample(hi, 4), lo)
    for r, img in zip(sub, hi, strict=True):
        x, y, w, h = r["target_box"]
        t = r["objects"][-1]
        m = glyph(t["kind"], t["size"])
        assert (h, w) == m.shape and h == 7
        assert (img[y:y + h, x:x + w][m] == COLOURS[t["colour"]]).all()     # legible at 128
        # at 32 px the 7-px target spans at most ceil(7 / 4) + 1 = 3 pixels per side
        assert (x + w - 1) // 4 - x // 4 + 1 <= 3 and (y + h - 1) // 4 - y // 4 + 1 <= 3


def test_downsample_is_the_block_mean():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    want = np.rint(img.reshape(2, 4, 2, 4, 2, 3).astype(float).mean(axis=(2, 4)))
    np.testing.assert_array_equal(downsample(img, 2), want.astype(np.uint8))
    with pytest.raises(ValueError, match=r"images has dtype float64; expected uint8"):
        downsample(img / 255.0, 2)
    with pytest.raises(ValueError, match=r"factor=3; expected a positive int dividing H=8"):
        downsample(img, 3)
    with pytest.raises(ValueError, match=r"images has shape \(2, 8, 8, 4\)"):
        downsample(np.zeros((2, 8, 8, 4), np.uint8), 2)


def test_blind_baselines_near_chance(ds):
    scores = text_baselines(ds)
    for name, acc in scores.items():
        assert abs(acc - 0.25) < 0.05, (name, acc)
    for qt in ("identify", "colour"):
        for name, acc in text_baselines(ds.filter(lambda r, q=qt: r["question_type"] == q)
                                        ).items():
            assert abs(acc - 0.25) < 0.07, (qt, name, acc)


@pytest.fixture(scope="module")
def negation():
    return image_qa(1500, seed=1, question_types="negation").to_list()


def test_negation_ground_truth(negation):
    # the drawn pairs are every option but the answer; no distractor is an option's pair
    for r in negation[:500]:
        assert r["question"] == "Which of these did not appear?"
        n_asked = len(r["options"]) - 1
        asked, distr = r["objects"][-n_asked:], r["objects"][:-n_asked]
        assert len(distr) == r["n_distractors"]
        shown = {entity_name(o["kind"], o["colour"]) for o in asked}
        answer = r["options"][r["answer_index"]]
        assert shown == set(r["options"]) - {answer}
        assert not {entity_name(o["kind"], o["colour"]) for o in distr} & set(r["options"])
        t = r["objects"][-1]
        assert r["target_box"][:2] == [t["x0"], t["y0"]]


def _unbound_negation(r, rng):
    """The option whose colour or kind is in no object (no colour-kind binding)."""
    cols = {COLOUR_NAMES[o["colour"]] for o in r["objects"]}
    kinds = {KINDS[o["kind"]] for o in r["objects"]}
    ok = [i for i, o in enumerate(r["options"])
          if not (o.split()[0] in cols and o.split()[1] in kinds)] or range(len(r["options"]))
    return list(ok)[int(rng.integers(len(ok)))] == r["answer_index"]


def test_negation_shortcuts_near_chance(negation):
    # lures (the absent pair's kind and colour on other objects) close "the option that is
    # missing a part" from two distractors on; with none it answers nearly always
    rng = np.random.default_rng(0)
    assert np.mean([_unbound_negation(r, rng) for r in negation]) < 0.25 + 0.06
    easy = image_qa(300, seed=2, question_types="negation", distractors=0).to_list()
    assert np.mean([_unbound_negation(r, rng) for r in easy]) > 0.9
    for name, acc in text_baselines(datasets.Dataset.from_list(negation)).items():
        assert abs(acc - 0.25) < 0.06, (name, acc)


def test_default_types_unchanged_and_all_four_mix():
    assert set(image_qa(40, 0)["question_type"]) == {"identify", "colour"}
    mixed = image_qa(400, 0, question_types=IMAGE_QUESTION_TYPES)
    assert {q: mixed["question_type"].count(q) for q in IMAGE_QUESTION_TYPES} == {
        "identify": 100, "colour": 100, "match": 100, "negation": 100}


@pytest.fixture(scope="module")
def match():
    return image_qa(2000, seed=4, size=32, object_size=(7, 9), distractors=6,
                    question_types="match").to_list()


def test_match_ground_truth(match):
    # the named kind is unique; exactly it and the target share its colour
    for r in match[:500]:
        *distr, anchor, target = r["objects"]
        assert r["question"] == ("Which object has the same colour as the "
                                 f"{KINDS[anchor['kind']]}?")
        assert r["options"][r["answer_index"]] == KINDS[target["kind"]] != KINDS[anchor["kind"]]
        assert all(o["kind"] != anchor["kind"] for o in distr + [target])
        assert [o for o in r["objects"] if o["colour"] == anchor["colour"]] == [anchor, target]
        assert len(distr) == r["n_distractors"] == 6
        assert r["target_box"] == object_box(target)


def _match_shortcuts(r, rng):
    """Three one-hop rules: the option in the picture; the option drawn with a same-coloured
    partner; the option whose nearest object is nearest the named object."""
    *others, anchor, target = r["objects"]
    kinds = [KINDS[o["kind"]] for o in r["objects"]]
    paired = {KINDS[a["kind"]] for a in r["objects"]
              if sum(b["colour"] == a["colour"] for b in r["objects"]) >= 2}

    def draw(ok):
        ok = ok or list(range(len(r["options"])))
        return ok[int(rng.integers(len(ok)))] == r["answer_index"]

    def gap(option):
        return min([np.hypot(o["x0"] - anchor["x0"], o["y0"] - anchor["y0"])
                    for o in others + [target] if KINDS[o["kind"]] == option] or [np.inf])

    gaps = [gap(o) for o in r["options"]]
    return (draw([i for i, o in enumerate(r["options"]) if o in kinds]),
            draw([i for i, o in enumerate(r["options"]) if o in paired]),
            int(np.argmin(gaps)) == r["answer_index"])


def test_match_shortcuts_near_chance(match):
    rng = np.random.default_rng(0)
    scores = np.mean([_match_shortcuts(r, rng) for r in match], axis=0)
    assert np.all(np.abs(scores - 0.25) < 0.05), scores
    # without distractors the partner rule answers every time: the lures are what close it
    easy = image_qa(200, seed=5, distractors=0, question_types="match").to_list()
    assert np.mean([_match_shortcuts(r, rng)[1] for r in easy]) == 1.0
    for name, acc in text_baselines(datasets.Dataset.from_list(match)).items():
        assert abs(acc - 0.25) < 0.05, (name, acc)


@pytest.mark.parametrize("kwargs,message", [
    ({"n_options": 1}, r"n_options=1; expected an int >= 2"),
    ({"n_options": 9}, r"n_options=9; expected at most 8 \(colours\)"),
    ({"low_size": 48}, r"low_size=48; expected a positive divisor of size=128"),
    ({"question_types": "where"}, r"question_types='where'"),
    ({"question_types": "negation", "n_options": 300},
     r"n_options=300; expected at most \d+ \(colour-kind pairs\)"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        image_qa(4, 0, **kwargs)


def test_every_wrong_option_is_in_the_image(ds):
    # lures: "pick the option present in the picture" cannot beat chance
    for r in ds.select(range(300)):
        present = ({KINDS[o["kind"]] for o in r["objects"]} if r["question_type"] == "identify"
                   else {COLOUR_NAMES[o["colour"]] for o in r["objects"]})
        assert set(r["options"]) <= present
