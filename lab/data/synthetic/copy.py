"""Copying a random string: the task that grows induction heads.

A small LM learns in-context retrieval (needles, key-value lookup, variable
tracking) through induction heads: attend to the earlier occurrence of the
current token and copy what followed it (Olsson et al. 2022, "In-context
learning and induction heads"). Every completion token of this task is such a
copy, so it gives that circuit a dense training signal, where the retrieval
tasks give a few tokens per long example. Mixed into lm-xs's data, it took the
2-layer model through the induction phase change at about 1,000 steps (held-out
copy exact match 1.0 after 4,000); key lookup, which needs several characters
matched at once, had not followed by then.
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
