"""HUMOR's synthetic meme data: template images with scene / intent attributes, candidate
captions, a hidden preference function and noisy pairwise labels within template groups.

A template is a ``(scene, intent)`` pair: the scene is the colour of the one object in a
16x16 image (:data:`SCENES`), the intent its shape (:data:`INTENTS`); an image is one
rendering of a template (position and size drawn per image). A caption is
``"<subject> <twist> <tone>"`` followed by 0-2 filler words ``"lol"``: the subject word
belongs to one scene (:data:`SUBJECTS`), the twist to one intent (:data:`TWISTS`), the tone
is ``"dry"`` or ``"loud"``.

The hidden preference (:func:`hidden_score`), which a reward model has to learn from
labels: ``W_SUBJECT * [subject fits the scene] + W_TWIST * [twist fits the intent] +
W_TONE * [tone = incongruity(scene, intent)]``, where the incongruity tone is ``"loud"``
when ``scene + intent`` is odd (an interaction of the two attributes, so neither the
caption alone nor one attribute decides it). The weights make all eight agreement
patterns score differently. The filler words do not count: caption length is drawn
independently of the score, so a length heuristic stays at chance (a length penalty in
the preference would have made length a shortcut, so there is none).

A group (HUMOR, "group-wise preference": captions that share a template are compared)
is one image with ``n_captions`` candidate captions drawn uniformly; its labels are every
pair with distinct hidden scores, ``a`` preferred to ``b``, each flipped with probability
``noise``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from lab.data.synthetic.render import COLOUR_NAMES, SHAPES, place, render

SCENES = COLOUR_NAMES[:4]            # red green blue yellow (colour index = scene index)
INTENTS = SHAPES                     # square circle triangle cross (kind index)
SUBJECTS = ("fire", "leaf", "wave", "sun")       # SUBJECTS[s] fits scene s
TWISTS = ("box", "ball", "slice", "oops")        # TWISTS[i] fits intent i
TONES = ("dry", "loud")
FILLER = "lol"
MAX_FILLER = 2
W_SUBJECT, W_TWIST, W_TONE = 1.0, 0.7, 0.4
MAX_SCORE = W_SUBJECT + W_TWIST + W_TONE
IMAGE_SIZE = 16
OBJECT_SIZE = 8


def templates() -> list[tuple[int, int]]:
    """Every ``(scene, intent)`` template, scene-major."""
    return [(s, i) for s in range(len(SCENES)) for i in range(len(INTENTS))]


def template_name(scene: int, intent: int) -> str:
    return f"{SCENES[scene]}-{INTENTS[intent]}"


def incongruity(scene: int, intent: int) -> str:
    """The tone the hidden preference wants: ``"loud"`` when ``scene + intent`` is odd."""
    return TONES[(scene + intent) % 2]


def make_caption(subject: int, twist: int, tone: int, filler: int = 0) -> str:
    return " ".join([SUBJECTS[subject], TWISTS[twist], TONES[tone], *[FILLER] * filler])


def parse_caption(text: str) -> dict | None:
    """``{"subject", "twist", "tone", "filler"}`` (indices and the filler count) of a
    caption, None when it is outside the grammar."""
    if not isinstance(text, str):
        return None
    words = text.split()
    if len(words) < 3 or len(words) > 3 + MAX_FILLER or any(w != FILLER for w in words[3:]):
        return None
    if words[0] not in SUBJECTS or words[1] not in TWISTS or words[2] not in TONES:
        return None
    return {"subject": SUBJECTS.index(words[0]), "twist": TWISTS.index(words[1]),
            "tone": TONES.index(words[2]), "filler": len(words) - 3}


def hidden_score(scene: int, intent: int, caption: str) -> float:
    """The hidden preference of ``caption`` for template ``(scene, intent)`` (in ``[0,
    MAX_SCORE]``); ValueError for a caption outside the grammar."""
    p = parse_caption(caption)
    if p is None:
        raise ValueError(f"caption={caption!r}; expected '<subject> <twist> <tone> [lol..]' "
                         f"with subject in {SUBJECTS}, twist in {TWISTS}, tone in {TONES}")
    return (W_SUBJECT * (p["subject"] == scene) + W_TWIST * (p["twist"] == intent)
            + W_TONE * (TONES[p["tone"]] == incongruity(scene, intent)))


def best_caption(scene: int, intent: int) -> str:
    """The caption at the ceiling of the hidden preference (no filler)."""
    return make_caption(scene, intent, TONES.index(incongruity(scene, intent)))


def random_caption(rng: np.random.Generator) -> str:
    return make_caption(int(rng.integers(len(SUBJECTS))), int(rng.integers(len(TWISTS))),
                        int(rng.integers(len(TONES))), int(rng.integers(MAX_FILLER + 1)))


def render_template(scene: int, intent: int, rng: np.random.Generator) -> np.ndarray:
    """One ``uint8 [16, 16, 3]`` image of the template."""
    obj = place(rng, intent, scene, (0, 1), IMAGE_SIZE, (OBJECT_SIZE, OBJECT_SIZE), [],
                max_speed=0.0)
    return render([obj], 1, IMAGE_SIZE)[0]


def _check(name, value, ok, expected):
    if not ok:
        raise ValueError(f"{name}={value!r}; expected {expected}")


def meme_groups(n: int, seed: int = 0, *, n_captions: int = 6, noise: float = 0.0) -> dict:
    """``n`` groups (one image each, templates cycled in a shuffled order) with
    ``n_captions`` distinct candidate captions and their noisy pairwise labels.

    Returns ``{"images": uint8 [n, 16, 16, 3], "scene": [n], "intent": [n],
    "template": [n] names, "captions": [n][n_captions], "scores": [n, n_captions]
    hidden scores, "pairs": int [P, 3] (group, winner, loser) labels after noise,
    "clean": bool [P] whether a label agrees with the hidden preference}``.
    """
    _check("n", n, isinstance(n, int) and n >= 1, "an int >= 1")
    _check("n_captions", n_captions, isinstance(n_captions, int) and 2 <= n_captions <= 24,
           "an int in [2, 24]")
    _check("noise", noise, isinstance(noise, (int, float)) and 0 <= noise < 0.5,
           "a label-flip probability in [0, 0.5)")
    rng = np.random.default_rng([seed, 2028])
    temps = templates()
    order = np.concatenate([rng.permutation(len(temps)) for _ in range(n // len(temps) + 1)])
    images, scene, intent, names, captions, scores = [], [], [], [], [], []
    for g in range(n):
        s, i = temps[int(order[g])]
        images.append(render_template(s, i, rng))
        caps: list[str] = []
        while len(caps) < n_captions:
            c = random_caption(rng)
            if c not in caps:
                caps.append(c)
        scene.append(s)
        intent.append(i)
        names.append(template_name(s, i))
        captions.append(caps)
        scores.append([hidden_score(s, i, c) for c in caps])
    scores_arr = np.array(scores)
    pairs, clean = [], []
    for g in range(n):
        for a, b in itertools.combinations(range(n_captions), 2):
            if abs(scores_arr[g, a] - scores_arr[g, b]) < 1e-9:
                continue
            w, lo = (a, b) if scores_arr[g, a] > scores_arr[g, b] else (b, a)
            flip = bool(rng.random() < noise)
            pairs.append((g, lo, w) if flip else (g, w, lo))
            clean.append(not flip)
    return {"images": np.stack(images), "scene": np.array(scene), "intent": np.array(intent),
            "template": names, "captions": captions, "scores": scores_arr,
            "pairs": np.array(pairs, np.int64).reshape(-1, 3), "clean": np.array(clean, bool)}


def win_rates(groups: dict) -> np.ndarray:
    """``[n, n_captions]`` each caption's fraction of won comparisons among its group's
    (noisy) labels (0.5 for a caption in no labelled pair): the pointwise score targets."""
    n, k = groups["scores"].shape
    wins, total = np.zeros((n, k)), np.zeros((n, k))
    for g, w, lo in groups["pairs"]:
        wins[g, w] += 1
        total[g, w] += 1
        total[g, lo] += 1
    return np.where(total > 0, wins / np.maximum(total, 1), 0.5)


def noisy_best(groups: dict) -> list[str]:
    """Each group's caption with the highest noisy win rate (ties to the first): the
    "ground-truth caption" the CoT targets are traced back from."""
    rates = win_rates(groups)
    return [groups["captions"][g][int(np.argmax(rates[g]))] for g in range(len(rates))]


def caption_length(caption: str) -> int:
    return len(caption.split())


def caption_words(captions: Sequence[str]) -> np.ndarray:
    """``float32 [N, 11]`` the captions' structured features: one-hot subject, twist and
    tone, and the filler count (what a reward head reads of a caption)."""
    out = np.zeros((len(captions), len(SUBJECTS) + len(TWISTS) + len(TONES) + 1), np.float32)
    for r, c in enumerate(captions):
        p = parse_caption(c)
        if p is None:
            raise ValueError(f"captions[{r}]={c!r} is outside the caption grammar")
        out[r, p["subject"]] = 1
        out[r, len(SUBJECTS) + p["twist"]] = 1
        out[r, len(SUBJECTS) + len(TWISTS) + p["tone"]] = 1
        out[r, -1] = p["filler"]
    return out
