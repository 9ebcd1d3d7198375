"""In-context classification: infer a labelling rule from a few labelled examples.

Each item has two attributes (a colour and a shape). In each sample one of the
two attributes decides the label, through a mapping to nonsense label words
drawn afresh for the sample, so nothing can be memorised across samples: the
rule (which attribute, which word for which value) must be read off the
shots, in the spirit of Chan et al. 2022 ("Data distributional properties
drive emergent in-context learning") and of the label-word remapping of Min
et al. 2022.
"""

from __future__ import annotations

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, draw, to_dataset

COLOURS = ("red", "blue", "green", "pink", "gray", "gold", "teal", "plum", "tan", "jade")
SHAPES = ("cube", "ring", "star", "cone", "disk", "drop", "leaf", "moon", "bolt", "knot")
LABELS = ("dax", "wug", "fep", "zup", "kiki", "blic", "toma", "vorp")


def _identifiable(shots: list[tuple[int, int]], labels: list[int], attr: int) -> bool:
    """True when the other attribute is contradicted: two shots share its value, labels differ."""
    other = 1 - attr
    seen: dict[int, int] = {}
    for item, y in zip(shots, labels, strict=True):
        v = item[other]
        if v in seen and seen[v] != y:
            return True
        seen.setdefault(v, y)
    return False


def _draw_sample(rng: np.random.Generator, k: int, n_classes: int, attr: int,
                 conflict: bool):
    """One sample's shots, labels, query (value indices) and query label; None to redraw."""
    m = n_classes + 2  # values per attribute: more than labels, so some label has several
    mapping = np.concatenate([rng.permutation(n_classes), rng.integers(n_classes, size=2)])
    labels = [int(y) for y in rng.permutation(np.resize(np.arange(n_classes), k))]
    counts = np.bincount(labels, minlength=n_classes)
    qy = int(rng.integers(n_classes))
    pre = np.flatnonzero(mapping == qy)
    if conflict and len(pre) < 2:
        return None
    dec, oth = int(rng.choice(pre)), int(rng.integers(m))
    rivals = [y for y in range(n_classes) if y != qy and counts[y] >= counts[qy] // 2]
    rival = int(rng.choice(rivals or [y for y in range(n_classes) if y != qy]))
    r = max(1, counts[qy] // 2)  # shots with the query's deciding value (conflict mode)
    seen = {qy: 0, rival: 0}
    not_oth = [v for v in range(m) if v != oth]
    shots = []
    for y in labels:
        d = int(rng.choice(np.flatnonzero(mapping == y)))
        o = int(rng.integers(m))
        if conflict:
            o = int(rng.choice(not_oth))
            if y == qy:  # r shots carry the deciding value, the rest another value of qy
                d = dec if seen[qy] < r else int(rng.choice(pre[pre != dec]))
                seen[qy] += 1
            elif y == rival and seen[rival] < r:  # r rival shots carry the other value
                o = oth
                seen[rival] += 1
        shots.append((d, o) if attr == 0 else (o, d))
    query = (dec, oth) if attr == 0 else (oth, dec)
    if conflict and seen[rival] < r:
        return None
    if not any(s[attr] == dec for s in shots) or query in shots:
        return None
    if not _identifiable(shots, labels, attr):
        return None
    return shots, labels, query, qy


def icl_classification(n: int, seed: int = 0, n_shots=(6, 12), n_classes: int = 2,
                       conflict: bool = True) -> datasets.Dataset:
    """Few-shot labelling: ``"red cube -> dax\\nblue ring -> wug\\n...\\npink ring -> ?\\n"``.

    In each sample both attributes take ``n_classes + 2`` values (so neither
    is told apart by how many values it has); one of them, chosen at random,
    decides the label through a random many-to-one map onto ``n_classes``
    fresh label words. Shot labels are balanced across classes and the query
    class is uniform, so the majority, first and last shot labels are at
    chance (``1 / n_classes``). The query's deciding value occurs in the shots
    but the query item itself never does (no copying a seen item), and the
    shots contradict the other attribute (two shots share its value, not
    their label), so the rule is identifiable. Samples are redrawn until
    these hold. With ``conflict`` (default) the shots are built so that
    surface similarity misleads: ``r`` shots carry the query's deciding value
    (label: the answer) and ``r`` shots of one rival class carry the query's
    other value (and no other shot does), so a vote over the shots that
    share a word with the query is a coin flip between the answer and the
    rival; only finding which attribute is consistent across the shots works.

    Columns: the common ones (``difficulty = n_classes``) plus ``n_shots``,
    ``n_classes``, ``rule`` (``"colour"`` or ``"shape"``), ``shots`` (list of
    ``[item, label]``), ``query`` and ``choices`` (the label words in use).
    """
    check_n(n, seed)
    s_rng = as_range("n_shots", n_shots, 2)
    if not isinstance(n_classes, int) or not 2 <= n_classes <= len(COLOURS) - 2:
        raise ValueError(f"n_classes={n_classes!r}; expected an int in [2, {len(COLOURS) - 2}]")
    if s_rng[0] < n_classes + 1:
        raise ValueError(f"n_shots={n_shots!r}; need at least n_classes + 1 = {n_classes + 1} "
                         "shots")
    rng = np.random.default_rng([seed, 505])
    rows = []
    for _ in range(n):
        k = draw(rng, s_rng)
        attr = int(rng.integers(2))
        for _attempt in range(1000):
            sample = _draw_sample(rng, k, n_classes, attr, conflict)
            if sample is not None:
                break
        else:
            raise ValueError(f"could not draw identifiable shots with n_shots={k}")
        shots, labels, query, qy = sample
        colours = rng.choice(len(COLOURS), n_classes + 2, replace=False)
        shapes = rng.choice(len(SHAPES), n_classes + 2, replace=False)
        words = rng.choice(len(LABELS), n_classes, replace=False)

        def text(item, colours=colours, shapes=shapes):
            return f"{COLOURS[colours[item[0]]]} {SHAPES[shapes[item[1]]]}"

        pairs = list(zip(shots, labels, strict=True))
        lines = [f"{text(s)} -> {LABELS[words[y]]}" for s, y in pairs]
        answer = LABELS[words[qy]]
        rows.append({
            "prompt": "\n".join(lines) + f"\n{text(query)} -> ?\n",
            "completion": answer_line(answer),
            "answer": answer,
            "difficulty": n_classes,
            "task": "icl_classification",
            "n_shots": k,
            "n_classes": n_classes,
            "rule": ("colour", "shape")[attr],
            "shots": [[text(s), LABELS[words[y]]] for s, y in pairs],
            "query": text(query),
            "choices": [LABELS[w] for w in words],
        })
    return to_dataset(rows)
