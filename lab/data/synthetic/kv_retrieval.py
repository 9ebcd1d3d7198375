"""Multi-document key-value QA: the answer sits in exactly one of N documents.

The setting of "lost in the middle" (Liu et al. 2023) and of GOLD PANNING's
document-ordering search: documents are kept as a list so that a method can
re-order them and re-render the prompt with :func:`render_kv_prompt`.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import datasets
import numpy as np

from lab.data.synthetic.base import (
    answer_line,
    as_range,
    check_n,
    draw,
    to_dataset,
    unique_names,
    unique_numbers,
)

# Keys are lowercase letters only, disjoint from the values' digits: with shared symbols a
# small model learns the key -> value lookup several times slower (docs/zoo.md).
KEY_ALPHABET = string.ascii_lowercase


def render_kv_prompt(documents: Sequence[str], question: str) -> str:
    """The prompt for ``documents`` in the given order: ``"D1: ...\\nD2: ...\\n<question>\\n"``."""
    if not documents:
        raise ValueError("documents is empty; expected at least one document")
    lines = [f"D{i + 1}: {d}" for i, d in enumerate(documents)]
    return "\n".join(lines) + f"\n{question}\n"


GOLD_BIASES = ("uniform", "early", "late", "ends")


def kv_retrieval(n: int, seed: int = 0, n_docs=8, pairs_per_doc: int = 2,
                 gold_position: int | None = None, value_digits: int = 3,
                 cot: bool = True, gold_bias: str = "uniform") -> datasets.Dataset:
    """``n_docs`` documents of ``pairs_per_doc`` ``key=value`` pairs; ask one key's value.

    A document reads ``"kwfb=481, qczd=925."``; keys are distinct random
    4-letter strings and values distinct ``value_digits``-digit numbers, so
    the answer occurs in exactly one document (the gold one) and nowhere else.
    The question is ``"kwfb=?"``; the completion restates the pair before the
    answer line, ``"kwfb=481\\nA: 481"``, or is ``"A: 481"`` without ``cot``. The gold document's
    position is uniform over the ``n_docs`` slots, or ``gold_position``
    (0-based) when given, to measure a model's position bias. ``gold_bias``
    ``"early"`` / ``"late"`` draws it with probability falling / rising linearly
    over the slots (``nd - i`` / ``i + 1``), ``"ends"`` with probability rising
    linearly from the middle to both ends (``|i - (nd - 1) / 2| + 1``, "lost in
    the middle", Liu et al. 2023), to train a position bias into a model.
    ``n_docs`` may be an int or an inclusive ``(lo, hi)`` range.

    Columns: the common ones (``difficulty = ceil(log2(n_docs))``) plus
    ``documents`` (list[str], in prompt order), ``question``, ``gold_doc``
    (the gold document's 0-based index in ``documents``), ``n_docs``, ``key``
    and ``candidates`` (every value in text order).
    """
    check_n(n, seed)
    d_rng = as_range("n_docs", n_docs, 1)
    if not isinstance(pairs_per_doc, int) or pairs_per_doc < 1:
        raise ValueError(f"pairs_per_doc={pairs_per_doc!r}; expected a positive int")
    if gold_bias not in GOLD_BIASES:
        raise ValueError(f"gold_bias={gold_bias!r}; expected one of {GOLD_BIASES}")
    if gold_position is not None and gold_bias != "uniform":
        raise ValueError(f"gold_position={gold_position!r} pins the gold document; "
                         f"gold_bias={gold_bias!r} expects it drawn (give one of the two)")
    rng = np.random.default_rng([seed, 404])
    rows = []
    for _ in range(n):
        nd = draw(rng, d_rng)
        if gold_position is not None and not 0 <= gold_position < nd:
            raise ValueError(f"gold_position={gold_position!r}; expected an int in [0, {nd})")
        m = nd * pairs_per_doc
        keys = unique_names(rng, m, length=4, alphabet=KEY_ALPHABET)
        values = unique_numbers(rng, m, value_digits)
        documents = [
            ", ".join(f"{keys[j]}={values[j]}"
                      for j in range(d * pairs_per_doc, (d + 1) * pairs_per_doc)) + "."
            for d in range(nd)
        ]
        if gold_position is not None:
            gold = int(gold_position)
        elif gold_bias == "uniform":   # the original draw: uniform specs keep their data
            gold = int(rng.integers(nd))
        else:
            i = np.arange(nd)
            ramp = {"early": nd - i, "late": i + 1, "ends": np.abs(i - (nd - 1) / 2) + 1}[gold_bias]
            gold = int(rng.choice(nd, p=ramp / ramp.sum()))
        slot = gold * pairs_per_doc + int(rng.integers(pairs_per_doc))
        question = f"{keys[slot]}=?"
        answer = str(values[slot])
        rows.append({
            "prompt": render_kv_prompt(documents, question),
            "completion": (f"{keys[slot]}={answer}\n" if cot else "") + answer_line(answer),
            "answer": answer,
            "difficulty": max(1, math.ceil(math.log2(nd))) if nd > 1 else 0,
            "task": "kv_retrieval",
            "documents": documents,
            "question": question,
            "gold_doc": gold,
            "n_docs": nd,
            "key": keys[slot],
            "candidates": [str(v) for v in values],
        })
    return to_dataset(rows)
