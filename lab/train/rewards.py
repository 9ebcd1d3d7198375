"""Reward functions for RL fine-tuning, in a registry, and their validated scoring.

A reward function has trl's ``GRPOTrainer`` signature: ``f(prompts, completions,
**meta) -> rewards``, where ``prompts`` and ``completions`` are lists of N strings
and ``meta`` holds the dataset's other columns, one list of N values each (the
row of each completion's prompt, e.g. ``answer``, ``task``). It returns N
numbers, or ``None`` for a completion it cannot score because the completion
never states an answer: that completion gets the function's ``failure`` reward
and is counted in the learner's ``no_answer`` metric.

``@register("name", failure=0.0)`` adds a function; :func:`get` looks one up;
:func:`score` runs several with weights and checks their outputs: a wrong number
of rewards, NaN or inf raises ValueError naming the function and the first
offending index.

Built in: ``exact_match`` (1 if the completion's answer, the text after its last
``"A:"`` as :func:`lab.data.extract_answer` reads it, equals the ``answer``
column after stripping whitespace, else 0; no answer line, or an empty one, is
no answer), ``answer_format`` (1 if an answer line is present, else 0) and
``chain_steps``, a process reward for :func:`lab.data.arithmetic` chains: the fraction of
the problem's steps written right before the first wrong one
(:func:`lab.data.synthetic.arithmetic.check_chain`'s ``steps_gold``), which credits a
chain for each step it gets right where exact match gives one bit per chain (the
step-level signal of process supervision; Lightman et al. 2023, "Let's Verify Step by
Step").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from lab.data import extract_answer

RewardCallable = Callable[..., Sequence]


@dataclasses.dataclass(frozen=True)
class RewardFn:
    """A registered reward function: ``fn`` and the reward a ``None`` becomes."""

    name: str
    fn: RewardCallable
    failure: float = 0.0


REWARDS: dict[str, RewardFn] = {}


def register(name: str, *, failure: float = 0.0) -> Callable[[RewardCallable], RewardCallable]:
    """Decorator: ``@register("mine")`` adds ``fn`` to the registry under ``name``.

    ``failure`` is the reward of a completion the function returns ``None`` for (no
    answer). Re-registering a name replaces it. Returns ``fn`` unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name={name!r}; expected a non-empty str")
    if not isinstance(failure, (int, float)) or not math.isfinite(failure):
        raise ValueError(f"failure={failure!r} for reward {name!r}; expected a finite number")

    def wrap(fn: RewardCallable) -> RewardCallable:
        if not callable(fn):
            raise ValueError(f"reward {name!r}: {fn!r} is not callable")
        REWARDS[name] = RewardFn(name, fn, float(failure))
        return fn

    return wrap


def get(name: str) -> RewardFn:
    if name not in REWARDS:
        raise ValueError(f"reward function {name!r} is not registered; expected one of "
                         f"{sorted(REWARDS)} (add one with @lab.train.rewards.register)")
    return REWARDS[name]


def _answer(completion: str) -> str | None:
    found = extract_answer(completion)
    return None if found is None or not found.strip() else found.strip()


@register("exact_match", failure=0.0)
def exact_match(prompts, completions, *, answer, **_) -> list[float | None]:
    """1.0 if the completion's answer equals ``answer`` (whitespace stripped), 0.0 if it
    differs, None if the completion has no (non-empty) ``"A:"`` line."""
    out = []
    for completion, want in zip(completions, answer, strict=True):
        got = _answer(completion)
        out.append(None if got is None else float(got == str(want).strip()))
    return out


@register("answer_format", failure=0.0)
def answer_format(prompts, completions, **_) -> list[float | None]:
    """1.0 if the completion has a non-empty ``"A:"`` line, else None (no answer)."""
    return [None if _answer(c) is None else 1.0 for c in completions]


@register("chain_steps", failure=0.0)
def chain_steps(prompts, completions, *, operands, ops, **_) -> list[float]:
    """Per completion: right steps before the first wrong one / the problem's steps, from
    the ``operands`` and ``ops`` columns of :func:`lab.data.arithmetic` (a missing or
    malformed step is a wrong step; a chain without an answer line still gets its steps'
    credit)."""
    from lab.data.synthetic.arithmetic import check_chain

    out = []
    for completion, operands_, ops_ in zip(completions, operands, ops, strict=True):
        c = check_chain(completion, list(operands_), ops_)
        out.append(sum(c.steps_gold) / c.n_expected)
    return out


class Scores(NamedTuple):
    """What :func:`score` returns.

    total:     ``[N]`` float32, the weighted sum of the functions' rewards.
    per_fn:    ``{name: [N] float32}`` each function's rewards (failures filled in).
    no_answer: ``[N]`` bool, True where any function returned None.
    """

    total: np.ndarray
    per_fn: dict[str, np.ndarray]
    no_answer: np.ndarray


def _check(name: str, values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rewards [n] float64 with NaN for None, none [n] bool)``; raises on bad output."""
    try:
        values = list(values)
    except TypeError:
        raise ValueError(f"reward function {name!r} returned {type(values).__name__}; "
                         f"expected a sequence of {n} numbers or None") from None
    if len(values) != n:
        raise ValueError(f"reward function {name!r} returned {len(values)} rewards for {n} "
                         f"completions; expected {n}")
    out = np.zeros(n, np.float64)
    none = np.zeros(n, bool)
    for i, v in enumerate(values):
        if v is None:
            none[i] = True
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"reward function {name!r} returned {v!r} at index {i}; "
                             "expected a number or None") from None
        if not math.isfinite(x):
            raise ValueError(f"reward function {name!r} returned {x} at index {i} (the first "
                             "non-finite reward); expected finite numbers or None")
        out[i] = x
    return out, none


def score(names: Sequence[str], prompts: Sequence[str], completions: Sequence[str],
          meta: Mapping[str, Sequence] | None = None,
          weights: Sequence[float] | None = None) -> Scores:
    """Runs the registered reward functions ``names`` and combines them.

    Args:
      names: registered reward names.
      prompts, completions: N strings each (a prompt repeated for each of its samples).
      meta: the other columns, N values each, passed as keywords.
      weights: one per function (default 1 each); ``total = sum_k w_k * r_k``, as trl's
        ``reward_weights``.

    Raises ValueError for an unknown name, mismatched lengths, or a function whose output
    has the wrong length, a NaN or an inf (naming the function and the first index).
    """
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions; expected one each")
    meta = dict(meta or {})
    for key, col in meta.items():
        if len(col) != n:
            raise ValueError(f"meta column {key!r} has {len(col)} values; expected {n}")
    weights = [1.0] * len(names) if weights is None else list(weights)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} reward weights for {len(names)} reward functions")
    total = np.zeros(n, np.float64)
    per_fn, no_answer = {}, np.zeros(n, bool)
    for name, w in zip(names, weights, strict=True):
        spec = get(name)
        values, none = _check(name, spec.fn(list(prompts), list(completions), **meta), n)
        values[none] = spec.failure
        per_fn[name] = values.astype(np.float32)
        no_answer |= none
        total += float(w) * values
    return Scores(total.astype(np.float32), per_fn, no_answer)
