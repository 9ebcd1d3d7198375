"""Fine-grained perception: a small target among many distractors in a high-resolution image.

The target is a few pixels tall on a ``size x size`` canvas (``object_size``,
7 px on 128 px by default): at full resolution its shape or digit is legible;
area-downsampled to ``low_size`` (:func:`downsample`, 32 px by default) it
covers about two pixels and only its colour survives. A model can be compared
at the two resolutions on the same questions (the V* / "high-resolution
perception" setting, Wu & Xie 2024).

Question types:

- ``identify``: "What is the red object?" (the only red one); options are
  kinds (shapes and digits), so the answer needs the target's form.
- ``colour``: "What colour is the triangle?" (the only triangle); the
  distractors are other kinds, so finding it needs the form, answering needs
  the colour.
- ``match``: "Which object has the same colour as the triangle?" (two hops: find the
  named kind, the only one of it; read its colour; find the one other object of that
  colour, the target; answer its kind). Options are kinds, and every wrong option is
  drawn in a pair of its own: an object of that kind and a partner in a shared colour,
  so "the option in the picture" and "the option with a same-coloured partner" answer
  at chance; only the pair through the named kind answers.
- ``negation``: "Which of these did not appear?" (``video_qa``'s question on one
  image): ``n_options`` colour-kind pairs, all but one drawn; the asked-about
  objects are the drawn pairs (the target is the last of them), and the
  distractors are never one of the options' pairs.

The first distractors are lures: each wrong option's kind (``identify``, in
another colour) or colour (``colour``, on another kind) is in the image, so
"the option that is in the picture" does not answer; for ``match`` each wrong
option's kind and a partner in a colour of their own (two lures an option, so six
distractors cover three wrong options); for ``negation`` the
absent pair's kind (in another colour) and its colour (on another kind), so
that from two distractors on "the option whose kind or colour is missing"
does not answer either. The answer and the wrong
options are drawn uniformly from their pools and the options shuffled
(:func:`lab.data.synthetic.render.multiple_choice`), so the question text and
the option letters carry no signal;
``tests/data/test_video_image.py`` measures it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, to_dataset
from lab.data.synthetic.render import (
    COLOUR_NAMES,
    KINDS,
    LETTERS,
    check_images,
    check_n_options,
    entity_name,
    kind_name,
    multiple_choice,
    object_box,
    place,
    render,
)

IMAGE_QUESTION_TYPES = ("identify", "colour", "match", "negation")
DEFAULT_IMAGE_QUESTION_TYPES = ("identify", "colour")


def image_qa(n: int, seed: int = 0, *, size: int = 128, low_size: int = 32,
             question_types: Sequence[str] = DEFAULT_IMAGE_QUESTION_TYPES, distractors=(8, 16),
             object_size=7, noise: float = 0.0, n_options: int = 4) -> datasets.Dataset:
    """``n`` images of ``size x size`` pixels, one multiple-choice question each.

    ``object_size`` (int or ``(lo, hi)``) is every object's height in pixels;
    ``distractors`` (int or ``(lo, hi)``) how many non-target objects;
    ``question_types`` the types drawn in equal shares (``identify`` and ``colour``
    unless ``negation`` is asked for);
    ``low_size`` (a divisor of ``size``) the resolution :func:`render_images`
    gives with ``low=True``; ``noise`` the std of Gaussian pixel noise.

    Columns: the common ones (``answer`` the option letter; ``difficulty =
    ceil(log2(size / target height)) + distractors // 4 + (noise > 0)``),
    ``question``, ``options``, ``answer_index``, ``question_type``,
    ``objects`` (drawing order: the distractors, then the asked-about objects (``match``'s
    named object, ``negation``'s drawn pairs), the target last), ``target_box`` (``[x, y, w,
    h]`` in full-resolution pixels), ``n_distractors``, ``size``,
    ``low_size``, ``frames`` (1), ``noise``, ``noise_seed``.
    """
    check_n(n, seed)
    if not isinstance(size, (int, np.integer)) or not 16 <= size <= 4096:
        raise ValueError(f"size={size!r}; expected an int in [16, 4096] (pixels per side)")
    if not isinstance(low_size, (int, np.integer)) or low_size < 1 or size % low_size:
        raise ValueError(f"low_size={low_size!r}; expected a positive divisor of size={size}")
    qts = (question_types,) if isinstance(question_types, str) else tuple(question_types)
    if not qts or any(q not in IMAGE_QUESTION_TYPES for q in qts):
        raise ValueError(f"question_types={question_types!r}; expected a non-empty subset of "
                         f"{IMAGE_QUESTION_TYPES}")
    osz = as_range("object_size", object_size, 3, size)
    d_rng = as_range("distractors", distractors, 0)
    if not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"noise={noise!r}; expected a float >= 0 (pixel std, 0-255 units)")
    pairs_pool = len(KINDS) * len(COLOUR_NAMES)
    check_n_options(n_options, *((pairs_pool, "colour-kind pairs") if set(qts) == {"negation"}
                                 else (len(COLOUR_NAMES), "colours")))
    rng = np.random.default_rng([seed, 606])
    types = [qts[int(i)] for i in rng.permutation(np.arange(n) % len(qts))]
    rows = []
    for qt in types:
        kind, colour = int(rng.integers(len(KINDS))), int(rng.integers(len(COLOUR_NAMES)))
        asked: list[dict] = []                  # the asked-about objects before the target
        if qt == "negation":
            flat = rng.choice(pairs_pool, size=n_options, replace=False)
            pairs = [(int(f) // len(COLOUR_NAMES), int(f) % len(COLOUR_NAMES)) for f in flat]
            (kind, colour), shown = pairs[-1], pairs[1:-1]
            for k, c in shown:
                asked.append(place(rng, k, c, (0, 1), size, osz, asked, max_speed=0.0))
        elif qt == "match":                     # the named object, in the target's colour
            anchor = int(rng.choice([k for k in range(len(KINDS)) if k != kind]))
            asked.append(place(rng, anchor, colour, (0, 1), size, osz, asked, max_speed=0.0))
        target = place(rng, kind, colour, (0, 1), size, osz, asked, max_speed=0.0)
        if qt == "negation":
            question = "Which of these did not appear?"
            correct, wrong = entity_name(*pairs[0]), [entity_name(*p) for p in pairs[1:]]
            forced = [(pairs[0][0], None), (None, pairs[0][1])]
            if rng.integers(2):
                forced.reverse()
        elif qt == "identify":
            question = f"What is the {COLOUR_NAMES[colour]} object?"
            pool = [k for k in range(len(KINDS)) if k != kind]
            picks = [int(k) for k in rng.choice(pool, size=n_options - 1, replace=False)]
            correct, wrong = kind_name(kind), [kind_name(k) for k in picks]
            forced = [(k, None) for k in picks]
        elif qt == "match":
            question = f"Which object has the same colour as the {kind_name(anchor)}?"
            pool = [k for k in range(len(KINDS)) if k not in (kind, anchor)]
            picks = [int(k) for k in rng.choice(pool, size=n_options - 1, replace=False)]
            correct, wrong = kind_name(kind), [kind_name(k) for k in picks]
            shared = rng.choice([c for c in range(len(COLOUR_NAMES)) if c != colour],
                                size=n_options - 1, replace=False)
            # each wrong option, then a partner of any kind, in a colour of their own
            forced = [p for k, c in zip(picks, shared, strict=True)
                      for p in ((k, int(c)), (None, int(c)))]
        else:
            question = f"What colour is the {kind_name(kind)}?"
            pool = [c for c in range(len(COLOUR_NAMES)) if c != colour]
            picks = [int(c) for c in rng.choice(pool, size=n_options - 1, replace=False)]
            correct, wrong = COLOUR_NAMES[colour], [COLOUR_NAMES[c] for c in picks]
            forced = [(None, c) for c in picks]
        nd = int(rng.integers(d_rng[0], d_rng[1] + 1))
        objects: list[dict] = []
        while len(objects) < nd:
            k, c = int(rng.integers(len(KINDS))), int(rng.integers(len(COLOUR_NAMES)))
            if len(objects) < len(forced):        # lures: every wrong option is in the image
                lk, lc = forced[len(objects)]
                k, c = (k if lk is None else lk), (c if lc is None else lc)
            if ((qt == "identify" and c == colour) or (qt == "colour" and k == kind)
                    or (qt == "match" and (c == colour or k == anchor))
                    or (qt == "negation" and (k, c) in pairs)):
                continue
            objects.append(place(rng, k, c, (0, 1), size, osz, objects + asked + [target],
                                 max_speed=0.0))
        options, answer, prompt = multiple_choice(rng, correct, wrong, question)
        rows.append({
            "prompt": prompt, "completion": answer_line(LETTERS[answer]),
            "answer": LETTERS[answer],
            "difficulty": max(0, math.ceil(math.log2(size / target["size"]))) + nd // 4
            + int(noise > 0),
            "task": "image_qa", "question": question, "options": options,
            "answer_index": answer, "question_type": qt, "objects": objects + asked + [target],
            "target_box": object_box(target), "n_distractors": nd,
            "size": int(size), "low_size": int(low_size), "frames": 1, "noise": float(noise),
            "noise_seed": int(rng.integers(2**31)),
        })
    return to_dataset(rows)


def downsample(images, factor: int) -> np.ndarray:
    """Area (box-filter) downsampling of ``uint8 [..., H, W, 3]`` by an integer ``factor``."""
    arr = np.asarray(images)
    check_images(arr, "images", ndim=max(arr.ndim, 3))
    h, w = arr.shape[-3:-1]
    if not isinstance(factor, (int, np.integer)) or factor < 1 or h % factor or w % factor:
        raise ValueError(f"factor={factor!r}; expected a positive int dividing H={h} and W={w}")
    lead = arr.shape[:-3]
    blocks = arr.reshape(*lead, h // factor, factor, w // factor, factor, 3)
    return np.rint(blocks.mean(axis=(-4, -2))).astype(np.uint8)


def render_images(ds, low: bool = False) -> np.ndarray:
    """Every row's image, ``uint8 [N, size, size, 3]``, or at ``low_size`` when ``low``."""
    sizes = set(zip(ds["size"], ds["low_size"], strict=True))
    if len(sizes) != 1:
        raise ValueError(f"rows have different (size, low_size) {sorted(sizes)}; expected one")
    size, low_size = sizes.pop()
    objs, noise, seeds = ds["objects"], ds["noise"], ds["noise_seed"]
    out = np.empty((len(objs), size, size, 3), np.uint8)
    for i, objects in enumerate(objs):
        out[i] = render(objects, 1, size, noise[i], seeds[i])[0]
    return downsample(out, size // low_size) if low else out
