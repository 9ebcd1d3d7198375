"""MATH500-format jsonl: one problem per line with ``problem, solution, answer, level, subject``.

The format of HuggingFaceH4/MATH-500 (Lightman et al. 2023, "Let's Verify Step
by Step", the 500-problem test split of Hendrycks et al.'s MATH). ``level``
is 1-5 there (int or ``"Level 3"`` in the original MATH files); both are read.
"""

from __future__ import annotations

import json
import os
import re

import datasets

MATH500_FIELDS = ("problem", "solution", "answer", "level", "subject")


def _parse_level(value, lineno: int) -> int:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        level = value
    elif isinstance(value, str) and re.fullmatch(r"\s*(Level\s*)?\d+\s*", value):
        level = int(re.search(r"\d+", value).group())
    else:
        raise ValueError(f"line {lineno}: field 'level'={value!r}; expected an int or 'Level N'")
    if level < 1:
        raise ValueError(f"line {lineno}: field 'level'={value!r}; expected a level >= 1")
    return level


def load_math500_jsonl(path: str) -> datasets.Dataset:
    """Reads a MATH500-format jsonl file into a Dataset.

    Returns columns ``problem, solution, answer, level (int), subject`` plus
    ``unique_id`` when present, and ``difficulty`` (= ``level``) and ``task``
    (``"math500"``) so that it sits beside Lab's synthetic sets. Blank lines
    are skipped. Raises ValueError naming the line number and the field for
    invalid JSON, a missing field or a field of the wrong type.
    """
    if not os.path.exists(path):
        raise ValueError(f"MATH500 file {path!r} does not exist")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"line {lineno}: invalid JSON ({e.msg})") from e
            if not isinstance(rec, dict):
                raise ValueError(f"line {lineno}: expected a JSON object, got "
                                 f"{type(rec).__name__}")
            for field in MATH500_FIELDS:
                if field not in rec:
                    raise ValueError(f"line {lineno}: missing field {field!r}")
            for field in ("problem", "solution", "answer", "subject"):
                if not isinstance(rec[field], str):
                    raise ValueError(f"line {lineno}: field {field!r}={rec[field]!r}; "
                                     "expected a string")
            level = _parse_level(rec["level"], lineno)
            row = {f: rec[f] for f in ("problem", "solution", "answer", "subject")}
            row.update(level=level, unique_id=str(rec.get("unique_id", f"line-{lineno}")),
                       difficulty=level, task="math500")
            rows.append(row)
    if not rows:
        raise ValueError(f"MATH500 file {path!r} has no records")
    return datasets.Dataset.from_list(rows)


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def normalize_answer(answer: str) -> str:
    """A comparison key for final answers: ``"$\\boxed{ \\frac12 }$."`` -> ``"\\frac12"``.

    Takes the last ``\\boxed{}`` if there is one, then removes ``$``, ``\\left``/``\\right``,
    ``\\!``, ``\\,``-style spacing, ``\\text{...}`` wrappers (keeping their content),
    ``^\\circ``, a trailing period and every whitespace; ``\\dfrac``/``\\tfrac`` become
    ``\\frac``. A light form of the normalisation in Hendrycks et al.'s MATH
    ``is_equiv``; it does not decide symbolic equality.
    """
    if not isinstance(answer, str):
        raise ValueError(f"answer={answer!r}; expected a string")
    s = last_boxed(answer)
    s = answer if s is None else s
    s = s.replace("$", "")
    s = re.sub(r"\\(left|right)\b", "", s)
    s = re.sub(r"\\[!,;: ]", "", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def answers_match(predicted: str, reference: str) -> bool:
    """True when the two answers have the same :func:`normalize_answer` key."""
    return normalize_answer(predicted) == normalize_answer(reference)
