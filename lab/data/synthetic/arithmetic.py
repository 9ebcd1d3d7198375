"""Multi-step arithmetic with a chain of thought, at controlled difficulty, and the parser
that checks a written chain step by step (:func:`parse_chain`, :func:`check_chain`)."""

from __future__ import annotations

import dataclasses
import re

import datasets
import numpy as np

from lab.data.synthetic.base import (
    ANSWER_PREFIX,
    answer_line,
    as_range,
    check_n,
    draw,
    to_dataset,
)

OPS = ("+", "-", "*")
STEP_SEPARATOR = ";"
_STEP_RE = re.compile(r"(-?\d+)([+*-])(\d+)=(-?\d+)")
_PROMPT_RE = re.compile(r"(-?\d+)((?:[+*-]\d+)+)=\?")
_INT_RE = re.compile(r"-?\d+")


def evaluate_chain(operands: list[int], ops: list[str]) -> list[int]:
    """Left-to-right partial results of ``operands[0] op0 operands[1] op1 ...``."""
    acc, out = operands[0], []
    for op, x in zip(ops, operands[1:], strict=True):
        acc = acc + x if op == "+" else acc - x if op == "-" else acc * x
        out.append(acc)
    return out


def arithmetic(n: int, seed: int = 0, steps=(1, 4), digits=(1, 2),
               ops: str = "+-") -> datasets.Dataset:
    """Chains of ``steps`` operations on ``digits``-digit operands, solved left to right.

    Prompt ``"23+7-15=?\\n"`` (evaluated strictly left to right; ``*`` binds
    no tighter, and its operand is always one digit so values stay small);
    completion ``"23+7=30;30-15=15\\nA: 15"``: one line of partial results, then
    the answer. Each example draws ``steps`` and ``digits`` uniformly from the
    given inclusive ranges (or uses the ints).

    Columns: the common ones (``difficulty = steps * digits``, the number of
    digit-level operations in the chain) plus ``steps``, ``digits``,
    ``operands`` (list[int]) and ``ops`` (str).
    """
    check_n(n, seed)
    s_rng, d_rng = as_range("steps", steps, 1, 32), as_range("digits", digits, 1, 9)
    if not ops or any(o not in OPS for o in ops):
        raise ValueError(f"ops={ops!r}; expected a non-empty string of characters from {OPS}")
    rng = np.random.default_rng([seed, 101])
    rows = []
    for _ in range(n):
        k, d = draw(rng, s_rng), draw(rng, d_rng)
        chain_ops = [ops[int(rng.integers(len(ops)))] for _ in range(k)]
        lo = 10 ** (d - 1) if d > 1 else 1
        operands = [int(rng.integers(lo, 10 ** d))]
        for op in chain_ops:
            high = 10 if op == "*" else 10 ** d
            operands.append(int(rng.integers(2 if op == "*" else lo, high)))
        partial = evaluate_chain(operands, chain_ops)
        pairs = zip(chain_ops, operands[1:], strict=True)
        expr = str(operands[0]) + "".join(f"{o}{x}" for o, x in pairs)
        prev, steps_text = operands[0], []
        for o, x, r in zip(chain_ops, operands[1:], partial, strict=True):
            steps_text.append(f"{prev}{o}{x}={r}")
            prev = r
        answer = str(partial[-1])
        rows.append({
            "prompt": f"{expr}=?\n",
            "completion": ";".join(steps_text) + "\n" + answer_line(answer),
            "answer": answer,
            "difficulty": k * d,
            "task": "arithmetic",
            "steps": k,
            "digits": d,
            "operands": operands,
            "ops": "".join(chain_ops),
        })
    return to_dataset(rows)


def _apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right if op == "-" else left * right


@dataclasses.dataclass(frozen=True)
class ChainStep:
    """One step ``"<left><op><right>=<result>"`` of a written chain, as parsed.

    text: the step as written. left, op, right, result: its parts, all None when the
    text is not of that form (a malformed step). ``well_formed``: it parsed;
    ``arithmetic_ok``: it parsed and ``left op right == result``.
    """

    text: str
    left: int | None = None
    op: str | None = None
    right: int | None = None
    result: int | None = None

    @property
    def well_formed(self) -> bool:
        return self.result is not None

    @property
    def arithmetic_ok(self) -> bool:
        return self.well_formed and _apply(self.left, self.op, self.right) == self.result


def parse_step(text: str) -> ChainStep:
    """The :class:`ChainStep` of one step's text (surrounding spaces ignored); a text
    that is not ``<int><op><digits>=<int>`` gives a malformed step, never an error."""
    m = _STEP_RE.fullmatch(text.strip())
    if m is None:
        return ChainStep(text)
    return ChainStep(text, int(m[1]), m[2], int(m[3]), int(m[4]))


def parse_answer(text: str) -> int | None:
    """The integer after the last ``"A: "`` line of a completion; None when there is no
    answer line or what follows is not one integer."""
    lines = [ln for ln in text.split("\n") if ln.startswith(ANSWER_PREFIX.strip())]
    if not lines:
        return None
    value = lines[-1][len(ANSWER_PREFIX.strip()):].strip()
    return int(value) if _INT_RE.fullmatch(value) else None


def parse_chain(text: str) -> tuple[list[ChainStep], int | None]:
    """``(steps, answer)`` of a completion in :func:`arithmetic`'s format,
    ``"23+7=30;30-15=15\\nA: 15"``.

    ``steps``: the first line split on ``";"`` (:func:`parse_step` each; an empty first
    line gives no steps). ``answer``: :func:`parse_answer` (None when the completion has
    no answer line or a non-integer answer). Malformed text gives malformed steps or a
    None answer; nothing raises for a string.
    """
    if not isinstance(text, str):
        raise ValueError(f"text={text!r}; expected a completion string")
    line = text.split("\n", 1)[0]
    if line.startswith(ANSWER_PREFIX.strip()):  # no chain, only the answer line
        line = ""
    steps = [parse_step(t) for t in line.split(STEP_SEPARATOR)] if line.strip() else []
    return steps, parse_answer(text)


def parse_prompt(prompt: str) -> tuple[list[int], str]:
    """``(operands, ops)`` of a prompt ``"23+7-15=?\\n"``; ValueError when it is not one."""
    m = _PROMPT_RE.fullmatch(prompt.strip())
    if m is None:
        raise ValueError(f"prompt={prompt!r}; expected an arithmetic prompt like '23+7-15=?'")
    ops = re.findall(r"[+*-]", m[2])
    operands = [int(m[1])] + [int(x) for x in re.findall(r"\d+", m[2])]
    return operands, "".join(ops)


@dataclasses.dataclass(frozen=True)
class ChainCheck:
    """A written chain checked against its problem (:func:`check_chain`).

    steps_valid:    per written step: well formed, its arithmetic right, its left operand
                    the previous written result (the first operand for the first step),
                    its operator and right operand the problem's next ones.
    steps_gold:     per written step: equal to the reference chain's step at that index
                    (true exactly when it and every earlier step are valid).
    n_expected:     the problem's number of steps.
    answer:         the parsed answer (None when missing or malformed).
    answer_correct: ``answer`` equals the true result.
    """

    steps_valid: tuple[bool, ...]
    steps_gold: tuple[bool, ...]
    n_expected: int
    answer: int | None
    answer_correct: bool

    @property
    def first_error(self) -> int | None:
        """Index of the first invalid step; ``len(steps)`` when the valid steps stop before
        the problem's end; None for a complete valid chain."""
        for i, ok in enumerate(self.steps_valid):
            if not ok:
                return i
        return None if len(self.steps_valid) == self.n_expected else len(self.steps_valid)

    @property
    def chain_correct(self) -> bool:
        """Every step valid, exactly the problem's number of them, and the answer right."""
        return self.first_error is None and self.answer_correct


def check_chain(text: str, operands: list[int], ops: str) -> ChainCheck:
    """Checks a completion ``text`` against the problem ``operands[0] ops[0] operands[1] ...``
    (:func:`parse_chain`; the problem as in :func:`arithmetic`'s ``operands`` and ``ops``
    columns, or :func:`parse_prompt`). Steps beyond the problem's are invalid."""
    if len(operands) != len(ops) + 1 or any(o not in OPS for o in ops):
        raise ValueError(f"operands={operands!r}, ops={ops!r}; expected len(ops) + 1 operands "
                         f"and ops from {OPS}")
    steps, answer = parse_chain(text)
    gold = evaluate_chain(list(operands), list(ops))
    valid, at_gold, prev, prefix_ok = [], [], operands[0], True
    for i, st in enumerate(steps):
        ok = (i < len(ops) and st.arithmetic_ok and st.left == prev and st.op == ops[i]
              and st.right == operands[i + 1])
        valid.append(ok)
        prefix_ok = prefix_ok and ok
        at_gold.append(prefix_ok)
        prev = st.result if st.well_formed else None
    return ChainCheck(tuple(valid), tuple(at_gold), len(ops), answer,
                      answer is not None and answer == gold[-1])
