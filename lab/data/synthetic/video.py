"""Multiple-choice QA on synthetic videos of moving shapes and digits, with evidence frames.

A video is ``frames`` RGB frames of ``size x size`` pixels: coloured shapes and
digits (:mod:`lab.data.synthetic.render`) appear for a window of frames and
drift across the canvas. Each row asks one question whose evidence lives in a
known set of frames, the setting of long-video QA benchmarks (Video-MME, Fu et
al. 2024; LongVideoBench, Wu et al. 2024) and of frame selection: a method that
picks frames can be scored against ``evidence_frames``.

Question types (``question_types``):

- ``lookup``: one event: "What colour was the triangle?" (the only triangle,
  visible for ``event_len`` frames) or "Which digit was shown in red?" (the only
  red digit). Evidence: that object's frames.
- ``ordering``: "In which order did the circle, the 7 and the cross appear?"
  Three objects in disjoint windows; evidence: their frames.
- ``counting``: "How many squares appeared?" 1..``max_count`` squares, one after
  another in disjoint windows a frame apart or more (consecutive ones of
  different colours; windows shortened where they would not fit); evidence:
  all their frames, spread over the video.
- ``negation``: "Which of these did not appear?" ``n_options`` colour-shape
  pairs, all but one shown; evidence: the frames of the shown ones. Distractors
  share colours and shapes with the options, so both must be bound.
- ``summary``: "Which colour did most of the circles have?" circles over the
  whole video, ``m + 1`` of the winning colour and ``m`` of each other option
  colour (``m`` in ``summary_count``); evidence: every frame with a circle.

Every question also has ``distractors`` objects that the question is not about
(a kind, colour or pair the question excludes), drawn beneath the objects it is
about, which never touch each other where they are visible together (up to 30
placement tries). The first distractors are lures, one per wrong option's
colour or digit (lookup, summary) or the absent pair's kind and colour
(negation), and half of the rest are lures over all the options' parts, so
that "which option is in the video at all" or "the commonest colour" does not
answer once there are a few distractors. Half of the distractors are as brief
as the asked-about objects, half last 1..T frames, so brevity is no cue.

Shortcuts are closed by construction: the answer is drawn uniformly from its
pool and the wrong options uniformly from the rest, then the options are
shuffled, so the answer letter and the answer's rank among the options are
uniform, and the question text does not depend on the answer.
``tests/data/test_video.py`` measures the question-only, most-frequent-answer
and single-frame baselines (numbers in ``docs/vision_data.md``).

Frames are not stored: a row holds its objects, and :func:`render_videos` draws
a whole dataset as one ``uint8 [N, T, H, W, 3]`` array (``x / 255`` for float
inputs in ``[0, 1]``); rendering is a pure function of the row.
:func:`oracle_answer` answers a row from a subset of its frames with perfect
perception, the ceiling a frame selection allows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, to_dataset
from lab.data.synthetic.render import (
    COLOUR_NAMES,
    DIGIT_KINDS,
    KINDS,
    LETTERS,
    check_n_options,
    entity_name,
    kind_name,
    multiple_choice,
    overlaps,
    place,
    plural,
    render,
)

QUESTION_TYPES = ("lookup", "ordering", "counting", "negation", "summary")


def random_window(rng, frames: int, length: int) -> tuple[int, int]:
    t0 = int(rng.integers(0, frames - length + 1))
    return t0, t0 + length


def disjoint_windows(rng, frames: int, lengths: Sequence[int], gap: int = 1):
    """Windows of ``lengths`` in this order, at least ``gap`` frames apart, the spare
    frames split at random among the gaps (sorted uniform cut points)."""
    k = len(lengths)
    slack = frames - sum(lengths) - gap * (k - 1)
    cuts = np.sort(rng.integers(0, slack + 1, size=k))
    out, t = [], 0
    for i, length in enumerate(lengths):
        start = t + int(cuts[i]) - (int(cuts[i - 1]) if i else 0)
        out.append((start, start + length))
        t = start + length + gap
    return out


class _Scene:
    """What one question builder draws: the objects asked about and the question."""

    def __init__(self, rng, cfg: dict):
        self.rng, self.cfg = rng, cfg
        self.objects: list[dict] = []

    def add(self, kind: int, colour: int, window) -> None:
        c = self.cfg
        self.objects.append(place(self.rng, kind, colour, window, c["size"], c["object_size"],
                                  self.objects, max_speed=c["max_speed"]))

    def length(self) -> int:
        lo, hi = self.cfg["event_len"]
        return int(self.rng.integers(lo, hi + 1))


def _other_colours(rng, k: int, exclude: int) -> list[int]:
    pool = [c for c in range(len(COLOUR_NAMES)) if c != exclude]
    return [int(c) for c in rng.choice(pool, size=k, replace=False)]


def _lookup(s: _Scene, n_options: int):
    rng, frames = s.rng, s.cfg["frames"]
    if rng.integers(2) == 0:                                   # colour of a kind
        kind = int(rng.integers(len(KINDS)))
        colour = int(rng.integers(len(COLOUR_NAMES)))
        s.add(kind, colour, random_window(rng, frames, s.length()))
        wrong = _other_colours(rng, n_options - 1, colour)
        return dict(template=0, question=f"What colour was the {kind_name(kind)}?",
                    correct=COLOUR_NAMES[colour], wrong=[COLOUR_NAMES[c] for c in wrong],
                    query_kinds=[kind], query_colours=[],
                    excluded=lambda k, c: k == kind, forced=[(None, c) for c in wrong],
                    lures=[(None, c) for c in wrong + [colour]])
    colour = int(rng.integers(len(COLOUR_NAMES)))              # digit of a colour
    digit = int(rng.choice(DIGIT_KINDS))
    s.add(digit, colour, random_window(rng, frames, s.length()))
    wrong = [int(d) for d in rng.choice([d for d in DIGIT_KINDS if d != digit],
                                        size=n_options - 1, replace=False)]
    return dict(template=1, question=f"Which digit was shown in {COLOUR_NAMES[colour]}?",
                correct=kind_name(digit), wrong=[kind_name(d) for d in wrong],
                query_kinds=[], query_colours=[colour],
                excluded=lambda k, c: k in DIGIT_KINDS and c == colour,
                forced=[(d, None) for d in wrong], lures=[(d, None) for d in wrong + [digit]])


def _order_text(kinds) -> str:
    return ", then ".join(kind_name(k) for k in kinds)


def _ordering(s: _Scene, n_options: int):
    rng, frames = s.rng, s.cfg["frames"]
    kinds = [int(k) for k in rng.choice(len(KINDS), size=3, replace=False)]  # appearance order
    for kind, window in zip(kinds, disjoint_windows(rng, frames, [s.length() for _ in kinds]),
                            strict=True):
        s.add(kind, int(rng.integers(len(COLOUR_NAMES))), window)
    others = [p for p in itertools.permutations(kinds) if list(p) != kinds]
    wrong = [others[int(i)] for i in rng.choice(len(others), size=n_options - 1, replace=False)]
    listed = [kinds[int(i)] for i in rng.permutation(3)]
    question = (f"In which order did the {kind_name(listed[0])}, the {kind_name(listed[1])} "
                f"and the {kind_name(listed[2])} appear?")
    return dict(template=0, question=question, correct=_order_text(kinds),
                wrong=[_order_text(p) for p in wrong], query_kinds=listed, query_colours=[],
                excluded=lambda k, c: k in kinds, forced=[], lures=[])


def _counting(s: _Scene, n_options: int):
    rng, frames, max_count = s.rng, s.cfg["frames"], s.cfg["max_count"]
    kind = int(rng.integers(len(KINDS)))
    count = int(rng.integers(1, max_count + 1))
    lengths = [s.length() for _ in range(count)]
    while sum(lengths) + count - 1 > frames:                    # long videos only: shorten
        lengths[int(np.argmax(lengths))] -= 1
    colour = -1
    for window in disjoint_windows(rng, frames, lengths):
        colour = int(rng.choice([c for c in range(len(COLOUR_NAMES)) if c != colour]))
        s.add(kind, colour, window)
    wrong = [int(v) for v in rng.choice([v for v in range(1, max_count + 1) if v != count],
                                        size=n_options - 1, replace=False)]
    return dict(template=0, question=f"How many {plural(kind)} appeared?", correct=str(count),
                wrong=[str(v) for v in wrong], query_kinds=[kind], query_colours=[],
                excluded=lambda k, c: k == kind, forced=[], lures=[])


def _negation(s: _Scene, n_options: int):
    rng, frames = s.rng, s.cfg["frames"]
    flat = rng.choice(len(KINDS) * len(COLOUR_NAMES), size=n_options, replace=False)
    pairs = [(int(f) // len(COLOUR_NAMES), int(f) % len(COLOUR_NAMES)) for f in flat]
    absent, shown = pairs[0], pairs[1:]
    for kind, colour in shown:
        s.add(kind, colour, random_window(rng, frames, s.length()))
    forced = [(absent[0], None), (None, absent[1])]     # its kind and its colour do appear
    if rng.integers(2):
        forced.reverse()
    return dict(template=0, question="Which of these did not appear?",
                correct=entity_name(*absent), wrong=[entity_name(*p) for p in shown],
                query_kinds=[p[0] for p in pairs], query_colours=[p[1] for p in pairs],
                excluded=lambda k, c: (k, c) in pairs,
                forced=forced,
                lures=[(k, None) for k, _ in pairs] + [(None, c) for _, c in pairs])


def _summary(s: _Scene, n_options: int):
    rng, frames = s.rng, s.cfg["frames"]
    lo, hi = s.cfg["summary_count"]
    m = int(rng.integers(lo, hi + 1))
    kind = int(rng.integers(len(KINDS)))
    colours = [int(c) for c in rng.choice(len(COLOUR_NAMES), size=n_options, replace=False)]
    draws = [colours[0]] * (m + 1) + [c for c in colours[1:] for _ in range(m)]
    for colour in (draws[int(i)] for i in rng.permutation(len(draws))):
        s.add(kind, colour, random_window(rng, frames, s.length()))
    return dict(template=0, question=f"Which colour did most of the {plural(kind)} have?",
                correct=COLOUR_NAMES[colours[0]], wrong=[COLOUR_NAMES[c] for c in colours[1:]],
                query_kinds=[kind], query_colours=colours,
                excluded=lambda k, c: k == kind, forced=[(None, c) for c in colours[1:]],
                lures=[(None, c) for c in colours])


_BUILDERS = {"lookup": _lookup, "ordering": _ordering, "counting": _counting,
             "negation": _negation, "summary": _summary}


def _check(*, frames, size, question_types, object_size, noise, event_len, max_count,
           summary_count, n_options, max_speed):
    if not isinstance(frames, (int, np.integer)) or not 2 <= frames <= 1024:
        raise ValueError(f"frames={frames!r}; expected an int in [2, 1024]")
    if not isinstance(size, (int, np.integer)) or not 16 <= size <= 1024:
        raise ValueError(f"size={size!r}; expected an int in [16, 1024] (pixels per side)")
    qts = tuple(question_types) if not isinstance(question_types, str) else (question_types,)
    bad = [q for q in qts if q not in QUESTION_TYPES]
    if not qts or bad:
        raise ValueError(f"question_types={question_types!r}; expected a non-empty subset of "
                         f"{QUESTION_TYPES}")
    osz = as_range("object_size", object_size, 3, size)
    elen = as_range("event_len", event_len, 1, frames)
    if not isinstance(max_count, (int, np.integer)) or max_count < 2:
        raise ValueError(f"max_count={max_count!r}; expected an int >= 2")
    need = max_count * elen[0] + max_count - 1
    if "counting" in qts and need > frames:
        raise ValueError(f"max_count={max_count} events of at least event_len={elen[0]} frames "
                         f"need {need} frames; frames={frames}")
    if "ordering" in qts and 3 * elen[1] + 2 > frames:
        raise ValueError(f"ordering needs 3 * event_len + 2 = {3 * elen[1] + 2} frames; "
                         f"frames={frames}")
    scount = as_range("summary_count", summary_count, 1)
    if not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"noise={noise!r}; expected a float >= 0 (pixel std, 0-255 units)")
    if not isinstance(max_speed, (int, float)) or max_speed < 0:
        raise ValueError(f"max_speed={max_speed!r}; expected a float >= 0 (pixels per frame)")
    limits = {"lookup": (len(COLOUR_NAMES), "colours"), "ordering": (6, "orders of 3 objects"),
              "counting": (max_count, "counts 1..max_count"),
              "negation": (len(KINDS) * len(COLOUR_NAMES), "colour-shape pairs"),
              "summary": (len(COLOUR_NAMES), "colours")}
    limit, what = min(limits[q] for q in qts)
    check_n_options(n_options, limit, what)
    return qts, osz, elen, scount


def video_qa(n: int, seed: int = 0, *, frames: int = 16, size: int = 32,
             question_types: Sequence[str] = QUESTION_TYPES, distractors=(0, 4),
             object_size=(7, 9), noise: float = 0.0, event_len=(1, 3), max_count: int = 5,
             summary_count=(1, 2), n_options: int = 4, max_speed: float = 1.0
             ) -> datasets.Dataset:
    """``n`` videos, one multiple-choice question each (see the module docstring).

    Args:
      frames: T, frames per video (2-1024; counting needs ``max_count`` events).
      size: frame height = width in pixels.
      question_types: the types to draw from, in equal shares (shuffled).
      distractors: objects per video the question is not about, int or ``(lo, hi)``.
      object_size: glyph height in pixels, int or ``(lo, hi)``; digits stay
        legible from 7 (the font's height).
      noise: std of Gaussian pixel noise (0-255 units) added at render time.
      event_len: frames an asked-about object stays visible, int or ``(lo, hi)``.
      max_count: the largest answer of ``counting`` (answers 1..max_count).
      summary_count: ``m`` of ``summary`` (the winning colour has ``m + 1`` objects).
      n_options: options per question (2..the type's pool).
      max_speed: the fastest drift in pixels per frame.

    Columns: the common ones (``answer`` is the option letter, the completion
    ``"A: <letter>"``; ``difficulty = distractors + max(0, ceil(log2(frames /
    16))) + (noise > 0)``), ``question``, ``options`` (list[str]),
    ``answer_index``, ``question_type``, ``template`` (0/1, lookup's two
    questions), ``evidence_frames`` (sorted frame indices showing the objects
    the question is about), ``objects`` (every object in drawing order,
    the ``n_distractors`` distractors first), ``n_distractors``, ``frames``,
    ``size``, ``noise``, ``noise_seed``, ``query_kinds`` and ``query_colours``
    (the kinds / colours the question names; negation: the options' pairs in
    draw order, summary: the option colours, the winner first) and ``apart``
    (False in the rare row, crowded canvases mostly, where two asked-about
    objects touch in a frame after every placement try, so one may hide part
    of the other).
    """
    check_n(n, seed)
    qts, osz, elen, scount = _check(
        frames=frames, size=size, question_types=question_types, object_size=object_size,
        noise=noise, event_len=event_len, max_count=max_count, summary_count=summary_count,
        n_options=n_options, max_speed=max_speed)
    d_rng = as_range("distractors", distractors, 0)
    cfg = dict(frames=int(frames), size=int(size), object_size=osz, event_len=elen,
               max_count=int(max_count), summary_count=scount, max_speed=float(max_speed))
    rng = np.random.default_rng([seed, 505])
    types = [qts[int(i)] for i in rng.permutation(np.arange(n) % len(qts))]
    extra = max(0, math.ceil(math.log2(frames / 16))) + int(noise > 0)
    rows = []
    for qt in types:
        scene = _Scene(rng, cfg)
        q = _BUILDERS[qt](scene, int(n_options))
        evidence = sorted({t for o in scene.objects for t in range(o["t0"], o["t1"])})
        apart = not any(overlaps(a, b, margin=0)
                        for a, b in itertools.combinations(scene.objects, 2))
        nd = int(rng.integers(d_rng[0], d_rng[1] + 1))
        distr: list[dict] = []
        while len(distr) < nd:
            kind, colour = int(rng.integers(len(KINDS))), int(rng.integers(len(COLOUR_NAMES)))
            j = len(distr)
            lure = (q["forced"][j] if j < len(q["forced"]) else
                    q["lures"][int(rng.integers(len(q["lures"])))] if q["lures"] and rng.integers(2)
                    else (None, None))
            kind = kind if lure[0] is None else lure[0]
            colour = colour if lure[1] is None else lure[1]
            if q["excluded"](kind, colour):
                continue
            # half are brief events like the asked-about objects, so brevity is no cue
            length = scene.length() if rng.integers(2) else int(rng.integers(1, frames + 1))
            distr.append(place(rng, kind, colour, random_window(rng, frames, length), size, osz,
                               scene.objects + distr, max_speed=cfg["max_speed"]))
        options, answer, prompt = multiple_choice(rng, q["correct"], q["wrong"], q["question"])
        letter = LETTERS[answer]
        rows.append({
            "prompt": prompt, "completion": answer_line(letter), "answer": letter,
            "difficulty": nd + extra, "task": "video_qa",
            "question": q["question"], "options": options, "answer_index": answer,
            "question_type": qt, "template": q["template"], "evidence_frames": evidence,
            "objects": distr + scene.objects, "n_distractors": nd, "frames": int(frames),
            "size": int(size), "noise": float(noise), "noise_seed": int(rng.integers(2**31)),
            "query_kinds": q["query_kinds"], "query_colours": q["query_colours"],
            "apart": apart,
        })
    return to_dataset(rows)


def render_video(row: dict) -> np.ndarray:
    """One row's video, ``uint8 [frames, size, size, 3]``."""
    for field in ("objects", "frames", "size", "noise", "noise_seed"):
        if field not in row:
            raise ValueError(f"row lacks field {field!r}; expected a video_qa/image_qa row")
    return render(row["objects"], row["frames"], row["size"], row["noise"], row["noise_seed"])


def render_videos(ds) -> np.ndarray:
    """Every row's video stacked, ``uint8 [N, frames, size, size, 3]`` (one frames/size)."""
    cols = {c: ds[c] for c in ("objects", "frames", "size", "noise", "noise_seed")}
    shapes = set(zip(cols["frames"], cols["size"], strict=True))
    if len(shapes) != 1:
        raise ValueError(f"rows have different (frames, size) {sorted(shapes)}; expected one "
                         "(render rows one by one with render_video)")
    t, s = shapes.pop()
    out = np.empty((len(cols["objects"]), t, s, s, 3), np.uint8)
    for i, objects in enumerate(cols["objects"]):
        out[i] = render(objects, t, s, cols["noise"][i], cols["noise_seed"][i])
    return out


def _seen(row: dict, frames) -> list[tuple[int, dict, int]]:
    """``(index, object, first seen frame)`` of the asked-about objects visible in ``frames``."""
    fs = np.asarray(sorted(set(int(f) for f in frames)), int)
    out = []
    for i, o in enumerate(row["objects"][row["n_distractors"]:]):
        hit = fs[(fs >= o["t0"]) & (fs < o["t1"])]
        if hit.size:
            out.append((i, o, int(hit[0])))
    return out


def oracle_answer(row: dict, frames, rng: np.random.Generator) -> int:
    """The option index a perfect perceiver picks seeing only ``frames`` of ``row``'s video.

    It knows every asked-about object visible in those frames (kind, colour,
    identity, the frame it is first seen), takes what it did not see as absent (as
    a model shown only those frames must), and picks uniformly among the options
    that leaves (lookup: the seen colour or digit; ordering: orders consistent
    with the first-seen frames; counting: the seen count; negation: the unseen
    options; summary: the colours with the most seen objects; every option when
    none fits). With every frame, or only ``evidence_frames``, it is always right;
    with one frame it measures how much a single frame gives away.
    """
    seen = _seen(row, frames)
    opts, qt = row["options"], row["question_type"]
    if qt == "lookup":
        if row["template"] == 0:
            names = {COLOUR_NAMES[o["colour"]] for _, o, _ in seen}
        else:
            names = {kind_name(o["kind"]) for _, o, _ in seen}
        ok = [i for i, opt in enumerate(opts) if opt in names]
    elif qt == "ordering":
        first = {o["kind"]: f for _, o, f in seen}
        ok = []
        for i, opt in enumerate(opts):
            order = [KINDS.index(name) for name in opt.split(", then ")]
            times = [first[k] for k in order if k in first]
            if times == sorted(times):
                ok.append(i)
    elif qt == "counting":
        ok = [i for i, opt in enumerate(opts) if int(opt) == len(seen)]
    elif qt == "negation":
        shown = {entity_name(o["kind"], o["colour"]) for _, o, _ in seen}
        ok = [i for i, opt in enumerate(opts) if opt not in shown]
    else:                                                       # summary
        counts = {name: 0 for name in opts}
        for _, o, _ in seen:
            counts[COLOUR_NAMES[o["colour"]]] += 1
        best = max(counts.values())
        ok = [i for i, opt in enumerate(opts) if counts[opt] == best]
    ok = ok or list(range(len(opts)))
    return int(ok[int(rng.integers(len(ok)))])
