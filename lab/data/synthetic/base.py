"""What every synthetic generator shares: seeding, ranges, filler text, the record format.

Every generator returns a ``datasets.Dataset`` whose rows have at least

- ``prompt``: the text the model reads (it ends with a newline);
- ``completion``: what it should write, a chain of thought where the task has
  one, then the answer line ``"A: <answer>"`` (:data:`ANSWER_PREFIX`);
- ``answer``: the ground-truth answer string;
- ``difficulty``: an int, larger = harder; each generator's docstring defines it;
- ``task``: the generator's name;

plus task-specific ground-truth columns (needle depth, gold document, ...).
Rows are a pure function of ``seed`` (numpy ``default_rng``), so the same call
gives the same dataset on any machine.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import datasets
import numpy as np

ANSWER_PREFIX = "A: "
COMMON_COLUMNS = ("prompt", "completion", "answer", "difficulty", "task")

# RULER's noise sentences (Hsieh et al. 2024, "RULER: What's the real context size of
# your long-context language models?"), used as haystack filler.
FILLER_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

_ANSWER_RE = re.compile(r"A:\s*(.*?)\s*$", re.MULTILINE)


def answer_line(answer: str) -> str:
    return f"{ANSWER_PREFIX}{answer}"


def extract_answer(text: str) -> str | None:
    """Returns the answer after the last ``"A:"`` in a generated completion (None if absent)."""
    found = _ANSWER_RE.findall(text)
    return found[-1] if found else None


def check_n(n: int, seed: int) -> None:
    if not isinstance(n, (int, np.integer)) or n <= 0:
        raise ValueError(f"n={n!r}; expected a positive int (number of examples)")
    if not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r}; expected an int")


def as_range(name: str, value, low: int = 1, high: int | None = None) -> tuple[int, int]:
    """An int or an inclusive ``(lo, hi)`` pair -> ``(lo, hi)``, checked against ``[low, high]``."""
    if isinstance(value, (int, np.integer)):
        lo = hi = int(value)
    elif isinstance(value, Sequence) and len(value) == 2 and all(
            isinstance(v, (int, np.integer)) for v in value):
        lo, hi = int(value[0]), int(value[1])
    else:
        raise ValueError(f"{name}={value!r}; expected an int or an inclusive (lo, hi) pair")
    bound = f"[{low}, {high}]" if high is not None else f">= {low}"
    if lo > hi or lo < low or (high is not None and hi > high):
        raise ValueError(f"{name}={value!r}; expected values in {bound} with lo <= hi")
    return lo, hi


def draw(rng: np.random.Generator, rng_range: tuple[int, int]) -> int:
    return int(rng.integers(rng_range[0], rng_range[1] + 1))


def unique_names(rng: np.random.Generator, k: int, length: int = 3,
                 alphabet: str = string.ascii_lowercase) -> list[str]:
    """``k`` distinct random strings of ``length`` characters from ``alphabet``."""
    if len(alphabet) ** length < 2 * k:
        raise ValueError(f"cannot draw {k} distinct names of length {length}")
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < k:
        name = "".join(rng.choice(list(alphabet), size=length))
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def unique_numbers(rng: np.random.Generator, k: int, digits: int) -> list[int]:
    """``k`` distinct ``digits``-digit integers (no leading zero)."""
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10 ** digits
    if hi - lo < k:
        raise ValueError(f"cannot draw {k} distinct {digits}-digit numbers")
    return [int(x) for x in rng.choice(np.arange(lo, hi), size=k, replace=False)]


def weave(rng: np.random.Generator, statements: Sequence[str], context_len: int,
          reserved: int) -> tuple[str, list[int]]:
    """Places ``statements`` in order among filler sentences so the text is ~``context_len`` chars.

    ``reserved`` characters are kept free for what follows the context (the
    question). Statements keep their relative order and land at uniformly
    random filler boundaries. Returns ``(text, offsets)`` with each
    statement's character offset in ``text``.

    Raises ValueError when the statements alone do not fit.
    """
    body = sum(len(s) + 1 for s in statements)
    budget = context_len - reserved - body
    if budget < 0:
        raise ValueError(f"context_len={context_len} is too small: the statements and the "
                         f"question need {body + reserved} characters")
    fillers: list[str] = []
    while True:
        s = FILLER_SENTENCES[int(rng.integers(len(FILLER_SENTENCES)))]
        if len(s) + 1 > budget:
            break
        fillers.append(s)
        budget -= len(s) + 1
    slots = np.sort(rng.integers(0, len(fillers) + 1, size=len(statements)))
    pieces: list[str] = []
    offsets: list[int] = []
    pos, j = 0, 0
    for i in range(len(fillers) + 1):
        while j < len(statements) and slots[j] == i:
            offsets.append(pos)
            pieces.append(statements[j])
            pos += len(statements[j]) + 1
            j += 1
        if i < len(fillers):
            pieces.append(fillers[i])
            pos += len(fillers[i]) + 1
    return " ".join(pieces), offsets


def to_dataset(rows: list[dict]) -> datasets.Dataset:
    """Builds the Dataset, checking that every row has the common columns."""
    for i, row in enumerate(rows):
        missing = [c for c in COMMON_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"row {i} lacks columns {missing}")
    return datasets.Dataset.from_list(rows)
