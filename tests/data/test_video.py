"""video_qa: determinism, ground truth recomputed from the objects and from the pixels,
evidence frames sufficient, and every blind or one-frame shortcut near chance.

Bounds: with 4 options chance is 0.25; on M held-out rows a baseline at chance
has standard error sqrt(0.1875 / M): 0.011 for the 1500 rows of the whole set,
0.025 for the 300 rows of one question type. Bounds are chance + 0.05 overall
and chance + 0.08 per type (3 standard errors or more).
"""

import collections

import datasets
import numpy as np
import pytest

from lab.data import (
    GENERATORS,
    QUESTION_TYPES,
    check_images,
    extract_answer,
    generate,
    oracle_answer,
    render_video,
    render_videos,
    video_qa,
)
from lab.data.synthetic.render import COLOUR_NAMES, COLOURS, KINDS, glyph, positions
from lab.data.synthetic.shortcuts import text_baselines

N = 3000
CHANCE = 0.25


@pytest.fixture(scope="module")
def ds():
    return video_qa(N, seed=0)


@pytest.fixture(scope="module")
def rows(ds):
    return ds.to_list()


def test_deterministic_common_columns_and_balanced_types():
    a, b, c = video_qa(30, 5), video_qa(30, 5), video_qa(30, 6)
    assert a.to_list() == b.to_list() and a["prompt"] != c["prompt"]
    assert np.array_equal(render_videos(a), render_videos(b))
    for r in a:
        assert extract_answer(r["completion"]) == r["answer"] == "ABCD"[r["answer_index"]]
        assert r["prompt"].endswith("\n") and r["task"] == "video_qa"
        assert r["prompt"].count("\n") == 1 + len(r["options"])
    counts = collections.Counter(a["question_type"])
    assert counts == {q: 6 for q in QUESTION_TYPES}      # equal shares
    assert GENERATORS["video_qa"] is video_qa
    assert generate("video_qa", 5, seed=5).to_list() == video_qa(5, 5).to_list()


def _relevant(r):
    return r["objects"][r["n_distractors"]:]


def _entity(o):
    return f"{COLOUR_NAMES[o['colour']]} {KINDS[o['kind']]}"


def test_ground_truth_recomputed_from_objects(rows):
    for r in rows:
        rel, every = _relevant(r), r["objects"]
        ans = r["options"][r["answer_index"]]
        qt = r["question_type"]
        if qt == "lookup" and r["template"] == 0:
            kind = KINDS.index(r["question"].removeprefix("What colour was the ").rstrip("?"))
            hits = [o for o in every if o["kind"] == kind]
            assert len(hits) == 1 and COLOUR_NAMES[hits[0]["colour"]] == ans
        elif qt == "lookup":
            colour = COLOUR_NAMES.index(r["question"].split()[-1].rstrip("?"))
            hits = [o for o in every if o["kind"] >= 4 and o["colour"] == colour]
            assert len(hits) == 1 and KINDS[hits[0]["kind"]] == ans
        elif qt == "ordering":
            order = [KINDS[o["kind"]] for o in sorted(rel, key=lambda o: o["t0"])]
            assert ", then ".join(order) == ans
            assert all(o["kind"] not in r["query_kinds"] for o in every[:r["n_distractors"]])
        elif qt == "counting":
            kind = r["query_kinds"][0]
            assert sum(o["kind"] == kind for o in every) == int(ans)
            spans = sorted((o["t0"], o["t1"]) for o in rel)
            assert all(b[0] >= a[1] + 1 for a, b in zip(spans, spans[1:], strict=False))
        elif qt == "negation":
            present = {_entity(o) for o in every}
            assert ans not in present
            assert all(opt in present for opt in r["options"] if opt != ans)
        else:
            kind = r["query_kinds"][0]
            tally = collections.Counter(COLOUR_NAMES[o["colour"]] for o in every
                                        if o["kind"] == kind)
            (top, k1), (_, k2) = tally.most_common(2)
            assert top == ans and k1 == k2 + 1
        visible = sorted({t for o in rel for t in range(o["t0"], o["t1"])})
        assert r["evidence_frames"] == visible


def test_pixels_show_the_asked_about_objects_in_their_evidence_frames(ds):
    sub = ds.select(range(200))
    videos = render_videos(sub)
    assert videos.shape == (200, 16, 32, 32, 3) and videos.dtype == np.uint8
    checked = 0
    for r, video in zip(sub, videos, strict=True):
        for o in _relevant(r):               # drawn on top: every glyph pixel has its colour
            m = glyph(o["kind"], o["size"])
            t = np.arange(o["t0"], o["t1"])
            for ti, x, y in zip(t, *positions(o, t), strict=True):
                patch = video[ti, y:y + m.shape[0], x:x + m.shape[1]]
                assert (patch[m] == COLOURS[o["colour"]]).all()
                checked += 1
        if r["n_distractors"] == 0:          # no object outside the evidence frames
            outside = [t for t in range(16) if t not in r["evidence_frames"]]
            assert (video[outside] == video[outside][:, :1, :1]).all()
    assert checked > 1000
    assert np.mean(sub["apart"]) == 1.0
    np.testing.assert_array_equal(render_video(sub[0]), videos[0])


def test_asked_about_objects_rarely_touch(ds):
    assert np.mean(ds["apart"]) > 0.995                      # measured 0.9995 (seed 0)
    crowded = video_qa(300, 0, object_size=16)               # 16-px glyphs on 32 px
    assert 0.05 < 1 - np.mean(crowded["apart"]) < 0.4        # measured 0.18


def test_text_only_and_most_frequent_baselines_near_chance(ds):
    scores = text_baselines(ds)
    assert scores["chance"] == CHANCE
    for name, acc in scores.items():
        assert abs(acc - CHANCE) < 0.05, (name, acc)
    for qt in QUESTION_TYPES:
        sub = ds.filter(lambda r, q=qt: r["question_type"] == q)
        for name, acc in text_baselines(sub).items():
            assert abs(acc - CHANCE) < 0.08, (qt, name, acc)


def test_blind_baselines_catch_planted_shortcuts(rows):
    # The baselines have power: each finds the shortcut it is built for.
    first = [{**r, "options": [r["options"][r["answer_index"]]]
              + [o for i, o in enumerate(r["options"]) if i != r["answer_index"]],
              "answer_index": 0} for r in rows[:1000]]
    assert text_baselines(first)["most_frequent_letter"] == 1.0
    lookups = [r for r in rows if r["question_type"] == "lookup"][:600]
    # the answer's text named in the question (unseen question texts, 1 in 7 here, fall back
    # to a random option)
    fixed = [{**r, "question": r["question"] + " (pick " + r["options"][r["answer_index"]] + ")",
              "prompt": r["prompt"] + "hint " + r["options"][r["answer_index"]] + "\n"}
             for r in lookups]
    scores = text_baselines(fixed)
    assert scores["question_prior"] > 0.8
    # a word in the prompt that names the answer letter
    lettered = [{**r, "prompt": r["prompt"] + f"key{r['answer_index']}\n"} for r in rows[:1000]]
    assert text_baselines(lettered)["bag_of_words"] > 0.9


def _oracle(rows, pick, seed=0):
    rng = np.random.default_rng(seed)
    acc = collections.defaultdict(list)
    for r in rows:
        frames = pick(r, rng)
        acc[r["question_type"]].append(oracle_answer(r, frames, rng) == r["answer_index"])
    return {q: float(np.mean(v)) for q, v in acc.items()}


def test_evidence_frames_suffice_and_one_frame_does_not(rows):
    assert _oracle(rows, lambda r, _: range(r["frames"])) == {q: 1.0 for q in QUESTION_TYPES}
    assert _oracle(rows, lambda r, _: r["evidence_frames"]) == {q: 1.0 for q in QUESTION_TYPES}
    first = _oracle(rows, lambda r, _: [0])
    last = _oracle(rows, lambda r, _: [r["frames"] - 1])
    one = _oracle(rows, lambda r, rng: [int(rng.integers(r["frames"]))])
    for qt in ("ordering", "counting", "negation"):          # multi-frame types: chance
        for acc in (first[qt], last[qt], one[qt]):
            assert acc < CHANCE + 0.08, (qt, acc)
    assert one["summary"] < CHANCE + 0.15                    # a glimpse of a few objects
    # lookup's evidence is one event: a random frame finds it with P = |evidence| / T,
    # else guesses, so its accuracy is 0.25 + 0.75 * E[|evidence| / T].
    ev = np.mean([len(r["evidence_frames"]) / r["frames"] for r in rows
                  if r["question_type"] == "lookup"])
    assert abs(one["lookup"] - (CHANCE + (1 - CHANCE) * ev)) < 0.05
    lens = {q: np.mean([len(r["evidence_frames"]) for r in rows if r["question_type"] == q])
            for q in QUESTION_TYPES}
    assert lens["lookup"] < 3 and lens["summary"] > 2 * lens["lookup"]


def test_difficulty_knobs():
    base = video_qa(50, 1, distractors=0)
    more = video_qa(50, 1, distractors=4)
    long = video_qa(20, 1, frames=256, distractors=0, event_len=(2, 8))
    noisy = video_qa(20, 1, distractors=0, noise=20.0)
    assert set(base["difficulty"]) == {0} and set(more["difficulty"]) == {4}
    assert set(more["n_distractors"]) == {4}
    assert set(long["difficulty"]) == {4} and set(noisy["difficulty"]) == {1}
    assert max(max(e) for e in long["evidence_frames"]) < 256
    v = render_videos(long.select(range(2)))
    assert v.shape == (2, 256, 32, 32, 3)
    clean, dirty = render_videos(video_qa(5, 1)), render_videos(video_qa(5, 1, noise=20.0))
    assert 15 < np.std(dirty.astype(float) - clean) < 25
    big = video_qa(10, 2, size=64, object_size=(12, 16), frames=32)
    assert render_videos(big).shape == (10, 32, 64, 64, 3)
    assert all(o["size"] >= 12 for objs in big["objects"] for o in objs)


@pytest.mark.parametrize("kwargs,message", [
    ({"n_options": 1}, r"n_options=1; expected an int >= 2"),
    ({"n_options": 6}, r"n_options=6; expected at most 5 \(counts 1..max_count\)"),
    ({"frames": 8}, r"max_count=5 events of at least event_len=1 frames need 9 frames"),
    ({"question_types": ["lookup", "colour"]}, r"question_types=.*expected a non-empty subset"),
    ({"object_size": (9, 7)}, r"object_size=\(9, 7\); expected values in \[3, 32\]"),
    ({"noise": -1.0}, r"noise=-1.0; expected a float >= 0"),
])
def test_bad_arguments_name_the_input_and_the_limit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        video_qa(4, 0, **kwargs)


def test_check_images_rejects_wrong_dtype_and_shape():
    ok = np.zeros((2, 4, 8, 8, 3), np.uint8)
    assert check_images(ok, "frames", ndim=5).shape == (2, 4, 8, 8, 3)
    with pytest.raises(ValueError, match=r"frames has dtype float32; expected uint8"):
        check_images(ok.astype(np.float32), "frames", ndim=5)
    with pytest.raises(ValueError, match=r"frames has shape \(2, 4, 8, 8\); expected 5 axes "
                                         r"\[N, T, H, W, 3\]"):
        check_images(ok[..., 0], "frames", ndim=5)
    with pytest.raises(ValueError, match=r"different \(frames, size\)"):
        render_videos(datasets.concatenate_datasets([video_qa(2, 0), video_qa(2, 0, frames=32)]))


def _unbound(r, rng):
    """Answers from what is in the video without binding colour to kind: lookup, the option
    colour/digit seen anywhere; negation, the option whose colour or kind is missing;
    summary, the commonest option colour over all objects; counting, the option nearest
    the number of all objects."""
    objs, opts, qt = r["objects"], r["options"], r["question_type"]
    cols = {COLOUR_NAMES[o["colour"]] for o in objs}
    kinds = {KINDS[o["kind"]] for o in objs}
    if qt == "lookup":
        ok = [i for i, o in enumerate(opts) if o in (cols if r["template"] == 0 else kinds)]
    elif qt == "negation":
        ok = [i for i, o in enumerate(opts)
              if not (o.split()[0] in cols and o.split()[1] in kinds)]
    elif qt == "summary":
        n = {o: sum(COLOUR_NAMES[x["colour"]] == o for x in objs) for o in opts}
        ok = [i for i, o in enumerate(opts) if n[o] == max(n.values())]
    else:
        d = [abs(int(o) - len(objs)) for o in opts]
        ok = [i for i in range(len(opts)) if d[i] == min(d)]
    ok = ok or list(range(len(opts)))
    return ok[int(rng.integers(len(ok)))] == r["answer_index"]


def test_unbound_visual_heuristics_fall_to_chance_with_distractors():
    # Lures (distractors carrying the wrong options' colours / digits, the absent pair's
    # colour and kind) make "which option is in the video at all" uninformative.
    types = ["lookup", "negation", "summary", "counting"]
    rng = np.random.default_rng(0)
    acc = {}
    for nd in (0, 4):
        rows = video_qa(1200, 3, distractors=nd, question_types=types).to_list()
        acc[nd] = {q: np.mean([_unbound(r, rng) for r in rows if r["question_type"] == q])
                   for q in types}
    assert min(acc[0].values()) > 0.9           # no distractors: the easy end of the knob
    for q in types:
        assert acc[4][q] < CHANCE + 0.08, (q, acc[4][q])
