"""Multi-step arithmetic with a chain of thought, at controlled difficulty."""

from __future__ import annotations

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, draw, to_dataset

OPS = ("+", "-", "*")


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
