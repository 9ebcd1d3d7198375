"""Numpy rendering of the synthetic visual tasks: a palette, shape and digit glyphs, placement.

Objects are flat-coloured glyphs on a dark background: four shapes (square,
circle, triangle, cross) and the ten digits of a built-in 5x7 bitmap font (the
classic HD44780 LCD character set). Frames are ``uint8`` RGB arrays
``[..., H, W, 3]``; ``lab.data`` never needs PIL or OpenCV.

An object is a dict ``{kind, colour, size, t0, t1, x0, y0, x1, y1}``: kind and
colour index :data:`KINDS` and :data:`COLOURS`, the glyph is ``size`` pixels tall
(:func:`glyph_shape`), it is visible in frames ``t0 <= t < t1`` and its top-left
corner moves linearly from ``(x0, y0)`` at ``t0`` to ``(x1, y1)`` at ``t1 - 1``
(rounded to whole pixels). Still images use ``t0 = 0, t1 = 1``.
"""

from __future__ import annotations

import functools

import numpy as np

SHAPES = ("square", "circle", "triangle", "cross")
DIGITS = tuple(str(d) for d in range(10))
KINDS = SHAPES + DIGITS                      # kind index: 0-3 shapes, 4-13 digits
DIGIT_KINDS = tuple(range(len(SHAPES), len(KINDS)))

COLOUR_NAMES = ("red", "green", "blue", "yellow", "magenta", "cyan", "orange", "white")
COLOURS = np.array([
    [230, 40, 40], [40, 200, 60], [60, 90, 250], [240, 220, 40],
    [220, 60, 220], [40, 220, 230], [250, 140, 20], [240, 240, 240],
], np.uint8)
BACKGROUND = np.array([24, 24, 24], np.uint8)

# 5x7 digits, one string of 5 bits per row (HD44780 font).
_FONT = {
    "0": ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    "1": ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    "2": ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    "3": ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    "4": ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    "5": ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    "6": ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    "7": ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    "8": ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    "9": ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
}


def kind_name(kind: int) -> str:
    return KINDS[kind]


def plural(kind: int) -> str:
    """``"circles"``, ``"crosses"``, ``"7s"``."""
    name = KINDS[kind]
    return name + ("es" if name.endswith("s") else "s")


def glyph_shape(kind: int, size: int) -> tuple[int, int]:
    """``(height, width)`` of a glyph ``size`` pixels tall: shapes are square, digits 5:7."""
    return (size, size) if kind < len(SHAPES) else (size, max(3, round(size * 5 / 7)))


def object_box(obj: dict) -> list[int]:
    """``[x, y, w, h]`` of an image object (its first-frame top-left corner and glyph size,
    in pixels): what :func:`lab.data.image_qa` records as ``target_box``."""
    h, w = glyph_shape(obj["kind"], obj["size"])
    return [obj["x0"], obj["y0"], w, h]


@functools.cache
def glyph(kind: int, size: int) -> np.ndarray:
    """Boolean mask ``[h, w]`` of ``kind`` at ``size`` pixels tall (cached)."""
    h, w = glyph_shape(kind, size)
    yy, xx = np.mgrid[0:h, 0:w]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    name = KINDS[kind]
    if name == "square":
        m = np.ones((h, w), bool)
    elif name == "circle":
        m = (yy - cy) ** 2 + (xx - cx) ** 2 <= (h / 2) ** 2 + 0.25
    elif name == "triangle":                  # apex up, base the bottom row
        m = np.abs(xx - cx) <= (yy + 1) * w / (2 * h)
    elif name == "cross":
        t = max(1, size // 3)
        lo = (size - t) // 2
        m = np.zeros((h, w), bool)
        m[lo:lo + t, :] = True
        m[:, lo:lo + t] = True
    else:                                     # a digit: nearest-neighbour scaled 5x7 bitmap
        bits = np.array([[c == "1" for c in row] for row in _FONT[name]])
        m = bits[(yy * 7) // h, (xx * 5) // w]
    m.setflags(write=False)
    return m


def positions(obj: dict, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-left ``(x, y)`` integer pixel of ``obj`` at frames ``t`` (inside its window)."""
    span = max(1, obj["t1"] - 1 - obj["t0"])
    a = np.clip((np.asarray(t) - obj["t0"]) / span, 0.0, 1.0)
    x = np.rint(obj["x0"] + a * (obj["x1"] - obj["x0"])).astype(int)
    y = np.rint(obj["y0"] + a * (obj["y1"] - obj["y0"])).astype(int)
    return x, y


def overlaps(a: dict, b: dict, margin: int = 1) -> bool:
    """True when the bounding boxes of ``a`` and ``b`` (plus ``margin``) meet in a common frame."""
    lo, hi = max(a["t0"], b["t0"]), min(a["t1"], b["t1"])
    if lo >= hi:
        return False
    ah, aw = glyph_shape(a["kind"], a["size"])
    bh, bw = glyph_shape(b["kind"], b["size"])
    # Fast exit: the boxes swept over each whole window (motion is linear) do not meet.
    if (max(a["x0"], a["x1"]) + aw + margin <= min(b["x0"], b["x1"])
            or max(b["x0"], b["x1"]) + bw + margin <= min(a["x0"], a["x1"])
            or max(a["y0"], a["y1"]) + ah + margin <= min(b["y0"], b["y1"])
            or max(b["y0"], b["y1"]) + bh + margin <= min(a["y0"], a["y1"])):
        return False
    if a["x0"] == a["x1"] and a["y0"] == a["y1"] and b["x0"] == b["x1"] and b["y0"] == b["y1"]:
        return True                                   # both still: the boxes meet
    t = np.arange(lo, hi)
    (ax, ay), (bx, by) = positions(a, t), positions(b, t)
    sep_x = (ax + aw + margin <= bx) | (bx + bw + margin <= ax)
    sep_y = (ay + ah + margin <= by) | (by + bh + margin <= ay)
    return bool(np.any(~(sep_x | sep_y)))


def place(rng: np.random.Generator, kind: int, colour: int, window: tuple[int, int],
          canvas: int, size_range: tuple[int, int], avoid: list[dict], *,
          max_speed: float = 1.0, tries: int = 30) -> dict:
    """An object of ``kind``/``colour`` visible in ``window``, moving at most ``max_speed``
    pixels per frame, kept inside the ``canvas`` and (after up to ``tries`` draws) off the
    boxes of the objects in ``avoid`` that are visible at the same time."""
    t0, t1 = int(window[0]), int(window[1])
    obj = {}
    for _ in range(tries):
        size = int(rng.integers(size_range[0], size_range[1] + 1))
        h, w = glyph_shape(kind, size)
        x0, y0 = int(rng.integers(0, canvas - w + 1)), int(rng.integers(0, canvas - h + 1))
        reach = max_speed * (t1 - 1 - t0)
        x1 = int(np.clip(x0 + rng.uniform(-reach, reach), 0, canvas - w))
        y1 = int(np.clip(y0 + rng.uniform(-reach, reach), 0, canvas - h))
        obj = {"kind": int(kind), "colour": int(colour), "size": size, "t0": t0, "t1": t1,
               "x0": x0, "y0": y0, "x1": x1, "y1": y1}
        if not any(overlaps(obj, o) for o in avoid):
            break
    return obj


def render(objects: list[dict], frames: int, canvas: int, noise: float = 0.0,
           noise_seed: int = 0) -> np.ndarray:
    """Draws ``objects`` in list order (later on top) -> ``uint8 [frames, canvas, canvas, 3]``.

    ``noise > 0`` adds i.i.d. Gaussian pixel noise of that standard deviation (in
    0-255 units, seeded by ``noise_seed``) before clipping to ``[0, 255]``.
    """
    out = np.empty((frames, canvas, canvas, 3), np.uint8)
    out[...] = BACKGROUND
    for obj in objects:
        m = glyph(obj["kind"], obj["size"])
        h, w = m.shape
        colour = COLOURS[obj["colour"]]
        t = np.arange(obj["t0"], min(obj["t1"], frames))
        xs, ys = positions(obj, t)
        for ti, x, y in zip(t, xs, ys, strict=True):
            out[ti, y:y + h, x:x + w][m] = colour
    if noise > 0:
        rng = np.random.default_rng([noise_seed, 77])
        noisy = out + rng.normal(0.0, noise, out.shape).astype(np.float32)
        out = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    return out


def check_images(images, name: str = "images", ndim: int = 4) -> np.ndarray:
    """``images`` as a ``uint8 [..., H, W, 3]`` array with ``ndim`` axes, else ValueError.

    Lab's visual data are ``uint8`` RGB (0-255); convert to float in ``[0, 1]``
    with ``x / 255`` where a model wants it.
    """
    arr = np.asarray(images)
    if arr.dtype != np.uint8:
        raise ValueError(f"{name} has dtype {arr.dtype}; expected uint8 RGB values in [0, 255]")
    if arr.ndim != ndim or arr.shape[-1] != 3:
        want = "[" + ", ".join(["N", "T"][:ndim - 3] + ["H", "W", "3"]) + "]"
        raise ValueError(f"{name} has shape {arr.shape}; expected {ndim} axes {want}")
    return arr


LETTERS = "ABCDEFGHIJ"


def check_n_options(n_options, limit: int, what: str) -> int:
    """``n_options`` in ``[2, limit]`` (``limit``: how many distinct ``what`` there are)."""
    if not isinstance(n_options, (int, np.integer)) or n_options < 2:
        raise ValueError(f"n_options={n_options!r}; expected an int >= 2 (a multiple-choice "
                         "question needs at least two options)")
    if n_options > limit:
        raise ValueError(f"n_options={n_options!r}; expected at most {limit} ({what})")
    return int(n_options)


def entity_name(kind: int, colour: int) -> str:
    """``"red circle"``: a colour-kind pair as the negation questions' options name it."""
    return f"{COLOUR_NAMES[colour]} {kind_name(kind)}"


def multiple_choice(rng: np.random.Generator, correct: str, wrong: list[str],
                    question: str) -> tuple[list[str], int, str]:
    """Shuffles ``[correct] + wrong`` -> ``(options, answer_index, prompt)``.

    The prompt is the question, then one ``"A. option"`` line per option (the
    Video-MME layout). With ``correct`` drawn uniformly from a pool and ``wrong`` a
    uniform subset of the rest, the answer is uniform over the option slots and
    over the ranks of the option set, so position and value heuristics stay at chance.
    """
    options = [correct] + list(wrong)
    order = rng.permutation(len(options))
    options = [options[int(i)] for i in order]
    answer = int(np.flatnonzero(order == 0)[0])
    lines = "".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(options))
    return options, answer, f"{question}\n{lines}"
