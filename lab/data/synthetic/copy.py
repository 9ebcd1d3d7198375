"""Copying a random string: the task that grows induction heads.

A small LM learns in-context retrieval (needles, key-value lookup, variable
tracking) through induction heads: attend to the earlier occurrence of the
current token and copy what followed it (Olsson et al. 2022, "In-context
learning and induction heads"). Every completion token of this task is such a
copy, so it gives that circuit a dense training signal, where the retrieval
tasks give a few tokens per long example. On lm-xs's model copy alone forms the
circuit within a few hundred steps, where the six-task mixture (or copy mixed
with associative recall) holds the model on its plateau, so the zoo grows the
circuit on copy first (``lm-xs-copy``, ``lm-s-copy``), then trains the mixture
from it (measurements in docs/zoo.md).
"""

from __future__ import annotations

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, draw, to_dataset

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def copy(n: int, seed: int = 0, length=(8, 32)) -> datasets.Dataset:
    """``"Copy: k3x9...\\n"`` -> ``"A: k3x9..."``: repeat a random string of ``length`` characters.

    Characters are uniform over lowercase letters and digits, so no token is
    predictable except by copying. Columns: the common ones (``difficulty`` =
    the string's length) plus ``length``.
    """
    check_n(n, seed)
    l_rng = as_range("length", length, 1)
    rng = np.random.default_rng([seed, 505])
    alphabet = np.array(list(ALPHABET))
    rows = []
    for _ in range(n):
        k = draw(rng, l_rng)
        s = "".join(rng.choice(alphabet, size=k))
        rows.append({"prompt": f"Copy: {s}\n", "completion": answer_line(s), "answer": s,
                     "difficulty": k, "task": "copy", "length": k})
    return to_dataset(rows)
