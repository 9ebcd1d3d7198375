"""Long-context retrieval in a haystack: multi-hop variable tracking and needles.

Both follow RULER (Hsieh et al. 2024): statements are woven into repeated
noise sentences up to a target length (``context_len`` characters, which is
the number of tokens under the byte tokenizer). Every sample has same-format
distractors, so that picking the first, last, most frequent or nearest
candidate stays at chance (``tests/data/test_synthetic.py`` measures it).
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
    unique_names,
    unique_numbers,
    weave,
)


def variable_tracking(n: int, seed: int = 0, hops=(1, 4), context_len=512, n_chains: int = 4,
                      value_digits: int = 3, cot: bool = True) -> datasets.Dataset:
    """Multi-hop variable tracking: ``abc=417. kfp=abc. qze=kfp.`` then ``qze=?``.

    Each sample has ``n_chains`` assignment chains of the same length
    ``hops`` (one literal assignment, then ``hops - 1`` copies); one chain is
    the target and its last variable is asked for. Chains are interleaved at
    random (each keeps its order) and woven into filler up to
    ``context_len`` characters. Values are distinct within a sample.

    With ``cot`` the completion walks the chain back to the literal:
    ``"qze=kfp;kfp=abc;abc=417\\nA: 417"``; without, it is ``"A: 417"``.

    Columns: the common ones (``difficulty = hops``) plus ``hops``,
    ``context_len`` (the prompt's length), ``n_chains``, ``query``,
    ``candidates`` (the literal values in text order), ``answer_rank`` (the
    answer's index in ``candidates``) and ``evidence_offsets`` (character
    offsets of the target chain's statements in the prompt).
    """
    check_n(n, seed)
    h_rng = as_range("hops", hops, 1, 64)
    c_rng = as_range("context_len", context_len, 16)
    if not isinstance(n_chains, int) or n_chains < 1:
        raise ValueError(f"n_chains={n_chains!r}; expected a positive int")
    rng = np.random.default_rng([seed, 202])
    rows = []
    for _ in range(n):
        h, length = draw(rng, h_rng), draw(rng, c_rng)
        names = unique_names(rng, n_chains * h)
        values = unique_numbers(rng, n_chains, value_digits)
        chains = [names[c * h:(c + 1) * h] for c in range(n_chains)]
        target = int(rng.integers(n_chains))
        order = rng.permutation(np.repeat(np.arange(n_chains), h))
        statements, owner, cursor = [], [], [0] * n_chains
        for c in order:
            j = cursor[c]
            rhs = str(values[c]) if j == 0 else chains[c][j - 1]
            statements.append(f"{chains[c][j]}={rhs}.")
            owner.append(int(c))
            cursor[c] += 1
        query = chains[target][-1]
        question = f"{query}=?\n"
        context, offsets = weave(rng, statements, length, len(question) + 1)
        trace = [f"{chains[target][j]}={chains[target][j - 1]}" for j in range(h - 1, 0, -1)]
        trace.append(f"{chains[target][0]}={values[target]}")
        answer = str(values[target])
        literal_order = [c for c, s in zip(owner, statements, strict=True)
                         if s.split("=")[1][:-1].isdigit()]
        rows.append({
            "prompt": f"{context}\n{question}",
            "completion": (";".join(trace) + "\n" if cot else "") + answer_line(answer),
            "answer": answer,
            "difficulty": h,
            "task": "variable_tracking",
            "hops": h,
            "context_len": len(context) + 1 + len(question),
            "n_chains": n_chains,
            "query": query,
            "candidates": [str(values[c]) for c in literal_order],
            "answer_rank": literal_order.index(target),
            "evidence_offsets": [o for o, c in zip(offsets, owner, strict=True) if c == target],
        })
    return to_dataset(rows)


def needle(n: int, seed: int = 0, context_len=512, n_needles: int = 4,
           value_digits: int = 4, cot: bool = True) -> datasets.Dataset:
    """Needle retrieval: ``"The number of kqzt is 4821."`` among ``n_needles - 1`` look-alikes.

    Each sample hides ``n_needles`` key-value sentences of the same format
    (distinct keys and values) in filler of ~``context_len`` characters and
    asks for one of them: ``"Number of kqzt?\\n"``. With ``cot`` the
    completion first restates the needle, ``"kqzt is 4821\\nA: 4821"`` (as
    RULER's answer prefix restates the key, so retrieval is a copy after the
    key); without, it is ``"A: 4821"``.

    Columns: the common ones (``difficulty = ceil(context_len / 256)``, the
    number of 256-character blocks to search) plus ``context_len``,
    ``n_needles``, ``key``, ``depth`` (the needle's character offset over the
    prompt length, in [0, 1)), ``needle_offset``, ``candidates`` (the values
    in text order) and ``answer_rank``.
    """
    check_n(n, seed)
    c_rng = as_range("context_len", context_len, 16)
    if not isinstance(n_needles, int) or n_needles < 1:
        raise ValueError(f"n_needles={n_needles!r}; expected a positive int")
    rng = np.random.default_rng([seed, 303])
    rows = []
    for _ in range(n):
        length = draw(rng, c_rng)
        keys = unique_names(rng, n_needles, length=4)
        values = unique_numbers(rng, n_needles, value_digits)
        target = int(rng.integers(n_needles))
        statements = [f"The number of {k} is {v}." for k, v in zip(keys, values, strict=True)]
        question = f"Number of {keys[target]}?\n"
        context, offsets = weave(rng, statements, length, len(question) + 1)
        prompt = f"{context}\n{question}"
        answer = str(values[target])
        rows.append({
            "prompt": prompt,
            "completion": (f"{keys[target]} is {answer}\n" if cot else "") + answer_line(answer),
            "answer": answer,
            "difficulty": math.ceil(len(prompt) / 256),
            "task": "needle",
            "context_len": len(prompt),
            "n_needles": n_needles,
            "key": keys[target],
            "depth": offsets[target] / len(prompt),
            "needle_offset": offsets[target],
            "candidates": [str(v) for v in values],
            "answer_rank": target,
        })
    return to_dataset(rows)
