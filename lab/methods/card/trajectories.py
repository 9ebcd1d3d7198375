"""CARD's teacher trajectories: samples of a larger reasoning model and a scripted verbose
solver with detours, restatements and failed attempts (most corrected, some not).

Both write :func:`lab.data.synthetic.arithmetic`'s completion format,
``"49+18=67;67-30=37\\nA: 37"``, so the coherence executor and the student read them. The
teacher is sampled once; CARD never resamples it (the rewriter only reads these).
"""

from __future__ import annotations

import numpy as np

from lab.data.synthetic.arithmetic import arithmetic, evaluate_chain


def verbose_solution(operands: list[int], ops: str, rng: np.random.Generator, *,
                     p_fail: float = 0.3, p_detour: float = 0.25, p_uncorrected: float = 0.1
                     ) -> str:
    """A noisy chain for one problem: before a step, with probability ``p_fail`` a failed
    attempt (the result off by 1-9) that the next step corrects, or with
    ``p_uncorrected`` one that is kept (so the answer is wrong); after a step, with
    ``p_detour`` a detour (``v+0=v`` or ``v-1=v-1``, right arithmetic that leads nowhere)."""
    for name, p in (("p_fail", p_fail), ("p_detour", p_detour),
                    ("p_uncorrected", p_uncorrected)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name}={p!r}; expected a probability in [0, 1]")
    value, out = operands[0], []
    for op, x in zip(ops, operands[1:], strict=True):
        true = value + x if op == "+" else value - x if op == "-" else value * x
        off = int(rng.integers(1, 10)) * (1 if rng.random() < 0.5 else -1)
        u = rng.random()
        if u < p_uncorrected:
            out.append(f"{value}{op}{x}={true + off}")
            value = true + off
        else:
            if u < p_uncorrected + p_fail:
                out.append(f"{value}{op}{x}={true + off}")
            out.append(f"{value}{op}{x}={true}")
            value = true
        if rng.random() < p_detour:
            out.append(f"{value}+0={value}" if rng.random() < 0.5 else f"{value}-1={value - 1}")
    return ";".join(out) + f"\nA: {value}"


def problems(n: int, seed: int, steps, digits) -> list[dict]:
    """``n`` arithmetic problems as rows ``{"problem", "answer", "operands", "ops"}``."""
    ds = arithmetic(n, seed, steps=steps, digits=digits, ops="+-")
    return [{"problem": r["prompt"], "answer": r["answer"], "operands": list(r["operands"]),
             "ops": r["ops"], "reference": r["completion"]} for r in ds]


def sample_model(model, tokenizer, prompts: list[str], *, max_new_tokens: int,
                 temperature: float = 1.0, seed: int = 0, batch: int = 128) -> list[str]:
    """One completion per prompt from a zoo reasoning model at ``temperature``."""
    from lab.infer import complete

    return complete(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                    temperature=temperature, seed=seed, batch=batch)


def teacher_rows(rows: list[dict], model, tokenizer, *, seed: int, max_new_tokens: int = 96,
                 temperature: float = 1.0, **verbose) -> list[dict]:
    """Adds a teacher trajectory to every problem row: even rows from ``model`` sampled at
    ``temperature`` (``source="model"``), odd rows from :func:`verbose_solution` with
    ``verbose``'s probabilities (``source="verbose"``); ``teacher_correct`` says whether
    its answer is right."""
    from lab.methods.card.coherence import execute
    rng = np.random.default_rng([seed, 28])
    idx = [i for i in range(len(rows)) if i % 2 == 0]
    sampled = sample_model(model, tokenizer, [rows[i]["problem"] for i in idx],
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           seed=seed) if idx else []
    by = dict(zip(idx, sampled, strict=True))
    out = []
    for i, r in enumerate(rows):
        text = by[i] if i in by else verbose_solution(r["operands"], r["ops"], rng, **verbose)
        e = execute(text, r["operands"], r["ops"])
        out.append({**r, "teacher": text, "source": "model" if i in by else "verbose",
                    "teacher_correct": e.answer_correct})
    return out


__all__ = ["evaluate_chain", "problems", "sample_model", "teacher_rows", "verbose_solution"]
