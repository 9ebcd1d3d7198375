"""CARD's coherence executor: every step of a written chain re-computed and checked.

CARD (Cognition-Aligned Reasoning Distillation; its Logical Coherence Reward) penalises
failed and misleading steps and requires the final answer to stay correct. On
:func:`lab.data.synthetic.arithmetic` chains the executor walks the written steps
(:func:`lab.data.synthetic.arithmetic.parse_chain`) against the problem:

* ``advance``: the step is the problem's next operation on the current value, with the
  right result (the current value moves on);
* ``wrong``: malformed, or its arithmetic is wrong (a failed attempt, corrected or not);
* ``misleading``: right arithmetic that does not advance the problem (a detour, a
  redundant restatement, a step after the problem is solved).

A malformed step is a wrong step, never an error.
"""

from __future__ import annotations

import dataclasses

from lab.data.synthetic.arithmetic import evaluate_chain, parse_chain, parse_prompt

FLOOR = -1.0  # the coherence reward of a chain whose final answer is wrong or missing


@dataclasses.dataclass(frozen=True)
class Execution:
    """What :func:`execute` found: one label per written step (``"advance"``, ``"wrong"``,
    ``"misleading"``), the problem's step count, the parsed answer and whether it is right."""

    labels: tuple[str, ...]
    n_expected: int
    answer: int | None
    answer_correct: bool

    @property
    def n_advance(self) -> int:
        return self.labels.count("advance")

    @property
    def n_incoherent(self) -> int:
        return len(self.labels) - self.n_advance

    @property
    def complete(self) -> bool:
        return self.n_advance == self.n_expected


def execute(text: str, operands: list[int], ops: str) -> Execution:
    """Labels every written step of ``text`` against the problem ``operands``/``ops``."""
    if len(operands) != len(ops) + 1:
        raise ValueError(f"operands={operands!r}, ops={ops!r}; expected len(ops) + 1 operands")
    steps, answer = parse_chain(text)
    value, k, labels = operands[0], 0, []
    for st in steps:
        if not st.arithmetic_ok:
            labels.append("wrong")
        elif (k < len(ops) and st.left == value and st.op == ops[k]
              and st.right == operands[k + 1]):
            labels.append("advance")
            value, k = st.result, k + 1
        else:
            labels.append("misleading")
    truth = evaluate_chain(list(operands), list(ops))[-1]
    return Execution(tuple(labels), len(ops), answer, answer is not None and answer == truth)


def coherence_reward(text: str, operands: list[int], ops: str) -> float:
    """:data:`FLOOR` when the final answer is wrong or missing; else the advancing steps
    over ``max(written steps, problem steps)``: 1 for a clean complete chain, less for each
    failed or misleading step and for each missing step (an answer alone scores 0)."""
    e = execute(text, operands, ops)
    if not e.answer_correct:
        return FLOOR
    return e.n_advance / max(len(e.labels), e.n_expected)


def coherence_for_prompt(text: str, problem: str) -> float:
    """:func:`coherence_reward` with the problem given as its prompt (``"49+18-30=?\\n"``)."""
    operands, ops = parse_prompt(problem)
    return coherence_reward(text, operands, ops)


def incoherent_fraction(texts, problems) -> float:
    """The fraction of all written steps of ``texts`` that are wrong or misleading."""
    bad = total = 0
    for t, p in zip(texts, problems, strict=True):
        operands, ops = parse_prompt(p)
        e = execute(t, operands, ops)
        bad, total = bad + e.n_incoherent, total + len(e.labels)
    return bad / max(total, 1)
