"""Multi-query associative recall (MQAR): many key-value lookups per example.

Zoology's MQAR (Arora et al. 2023, "Zoology: measuring and improving recall in
efficient language models") is the synthetic task that isolates in-context
recall: a list of key-value pairs, then several keys to look up. Every value in
the completion is a retrieval, so it gives the lookup that needle, key-value QA
and variable tracking need (match a multi-character key, copy what follows)
many times their training signal per token.

A small Transformer learns this lookup slowly with plain attention and quickly
with ``TransformerConfig.qk_smear``; keys that share symbols with the values
slow it several times, so keys are letters only (``KEY_ALPHABET``).
Measurements in docs/zoo.md.
"""

from __future__ import annotations

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
from lab.data.synthetic.kv_retrieval import KEY_ALPHABET


def associative_recall(n: int, seed: int = 0, n_pairs=(8, 32), n_queries=(2, 6),
                       key_len: int = 4, value_digits: int = 3) -> datasets.Dataset:
    """``"kwfb=481, qczd=925, ...\\nRecall qczd kwfb\\n"`` -> ``"qczd=925;kwfb=481\\nA: 925 481"``.

    Keys are distinct ``key_len``-letter strings (lowercase, disjoint from the
    values' digits), values distinct ``value_digits``-digit numbers; the queried keys
    are distinct and in random order. Columns: the common ones (``difficulty``
    = the number of pairs to search) plus ``n_pairs``, ``keys`` (queried, in
    order) and ``values`` (their answers).
    """
    check_n(n, seed)
    p_rng = as_range("n_pairs", n_pairs, 1)
    q_rng = as_range("n_queries", n_queries, 1)
    if q_rng[1] > p_rng[0]:
        raise ValueError(f"n_queries={n_queries!r} can exceed n_pairs={n_pairs!r}; expected at "
                         f"most {p_rng[0]} queries")
    rng = np.random.default_rng([seed, 606])
    rows = []
    for _ in range(n):
        m, q = draw(rng, p_rng), draw(rng, q_rng)
        keys = unique_names(rng, m, length=key_len, alphabet=KEY_ALPHABET)
        values = unique_numbers(rng, m, value_digits)
        asked = [int(i) for i in rng.choice(m, size=q, replace=False)]
        pairs = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
        answer = " ".join(str(values[i]) for i in asked)
        rows.append({
            "prompt": f"{pairs}\nRecall {' '.join(keys[i] for i in asked)}\n",
            "completion": ";".join(f"{keys[i]}={values[i]}" for i in asked) + "\n"
                          + answer_line(answer),
            "answer": answer,
            "difficulty": m,
            "task": "associative_recall",
            "n_pairs": m,
            "keys": [keys[i] for i in asked],
            "values": [str(values[i]) for i in asked],
        })
    return to_dataset(rows)
