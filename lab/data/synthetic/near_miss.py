"""Multi-document key-value QA with near-miss distractors (GOLD PANNING's harder regime).

:func:`lab.data.synthetic.kv_retrieval`'s task, where every key is random and
the question's key occurs once, is exact lookup: a reader that matches keys
follows the gold document wherever it sits. Here ``n_near`` of the other
documents hold keys that *look like* the gold key (one character substituted,
keeping a shared prefix: ``kwfb`` vs ``kwfc``, ``kwxb``) with their own,
conflicting values, so a reader that matches keys approximately is pulled to a
near miss, and which one wins depends on where the documents sit. This is the
"distractor" setting of Liu et al. 2023 ("Lost in the Middle"), where
retrieved-but-wrong passages resemble the relevant one.
"""

from __future__ import annotations

import math

import datasets
import numpy as np

from lab.data.synthetic.base import (
    answer_line,
    as_range,
    check_n,
    draw,
    to_dataset,
    unique_numbers,
)
from lab.data.synthetic.kv_retrieval import KEY_ALPHABET, render_kv_prompt

KEY_LENGTH = 4


def _one_off(rng: np.random.Generator, key: str, keep_prefix: int) -> str:
    """``key`` with one character at a position >= ``keep_prefix`` replaced by another letter."""
    pos = int(rng.integers(keep_prefix, len(key)))
    letter = key[pos]
    while letter == key[pos]:
        letter = KEY_ALPHABET[int(rng.integers(len(KEY_ALPHABET)))]
    return key[:pos] + letter + key[pos + 1:]


def _distance(a: str, b: str) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def kv_near_miss(n: int, seed: int = 0, n_docs=16, n_near=4, gold_position: int | None = None,
                 keep_prefix: int = 1, value_digits: int = 3,
                 cot: bool = True) -> datasets.Dataset:
    """``n_docs`` one-pair documents ``"kwfb=481."``; ``n_near`` of the non-gold ones hold
    near-miss keys of the asked key; ask the gold key's value.

    The gold key is a random 4-letter string; each near-miss key differs from it
    in exactly one character at a position ``>= keep_prefix`` (so the first
    ``keep_prefix`` letters are shared), the near-miss keys are distinct, and the
    remaining documents' keys differ from the gold key in at least two characters
    (so "one character off" is exactly the near misses). Values are distinct
    ``value_digits``-digit numbers, so an answer names at most one document. The
    gold position is uniform, or ``gold_position`` (0-based); the near-miss
    documents sit at uniformly random other slots. ``n_docs`` and ``n_near`` may be
    ints or inclusive ``(lo, hi)`` ranges (``n_near`` is capped at ``n_docs - 1``).

    Columns: as :func:`kv_retrieval` with ``pairs_per_doc=1`` (``documents``,
    ``question``, ``gold_doc``, ``n_docs``, ``key``, ``candidates``: document d's
    value is ``candidates[d]``) plus ``near_docs`` (the near-miss documents'
    indices, sorted) and ``n_near``. The completion restates the pair,
    ``"kwfb=481\\nA: 481"`` (or ``"A: 481"`` without ``cot``).
    """
    check_n(n, seed)
    d_rng = as_range("n_docs", n_docs, 2)
    m_rng = as_range("n_near", n_near, 0)
    if not isinstance(keep_prefix, int) or isinstance(keep_prefix, bool) or not (
            0 <= keep_prefix < KEY_LENGTH):
        raise ValueError(f"keep_prefix={keep_prefix!r}; expected an int in [0, {KEY_LENGTH})")
    rng = np.random.default_rng([seed, 405])
    rows = []
    for _ in range(n):
        nd = draw(rng, d_rng)
        nn = min(draw(rng, m_rng), nd - 1)
        if gold_position is not None and not 0 <= gold_position < nd:
            raise ValueError(f"gold_position={gold_position!r}; expected an int in [0, {nd})")
        key = "".join(rng.choice(list(KEY_ALPHABET), size=KEY_LENGTH))
        keys = {key}
        near = []
        while len(near) < nn:
            k = _one_off(rng, key, keep_prefix)
            if k not in keys:
                keys.add(k)
                near.append(k)
        far = []
        while len(far) < nd - 1 - nn:
            k = "".join(rng.choice(list(KEY_ALPHABET), size=KEY_LENGTH))
            if k not in keys and _distance(k, key) >= 2:
                keys.add(k)
                far.append(k)
        gold = int(gold_position) if gold_position is not None else int(rng.integers(nd))
        others = [d for d in range(nd) if d != gold]
        near_docs = sorted(int(d) for d in rng.choice(others, size=nn, replace=False))
        far_docs = [d for d in others if d not in set(near_docs)]
        doc_keys = [""] * nd
        doc_keys[gold] = key
        for d, k in zip(near_docs, near, strict=True):
            doc_keys[d] = k
        for d, k in zip(far_docs, far, strict=True):
            doc_keys[d] = k
        values = [str(v) for v in unique_numbers(rng, nd, value_digits)]
        documents = [f"{k}={v}." for k, v in zip(doc_keys, values, strict=True)]
        question = f"{key}=?"
        answer = values[gold]
        rows.append({
            "prompt": render_kv_prompt(documents, question),
            "completion": (f"{key}={answer}\n" if cot else "") + answer_line(answer),
            "answer": answer,
            "difficulty": max(1, math.ceil(math.log2(nd))),
            "task": "kv_near_miss",
            "documents": documents,
            "question": question,
            "gold_doc": gold,
            "n_docs": nd,
            "key": key,
            "candidates": values,
            "near_docs": near_docs,
            "n_near": nn,
        })
    return to_dataset(rows)
