"""Candidate proposers for the Hawkeye search: systematic stacking, evolution, coding agents.

A proposer implements :class:`Proposer`: given the :class:`Context` (workload,
target, search space, the taxonomy's text and its unit tests) and the history
of evaluations so far, it returns up to ``n`` new parameter dicts.

- :class:`SystematicProposer` stacks strategies (``KNOBS`` order: output tile, pipelining
  depth and copy engine first, as the largest modelled effects): from
  the unoptimised kernel, it tries every setting of one strategy's knobs around
  the incumbent (the best candidate that passed so far), moves to the next
  strategy, and sweeps again while anything new remains (coordinate descent
  over strategies).
- :class:`EvolutionaryProposer` mutates and recombines the best passed
  candidates (tournament selection, one or two knobs moved to a neighbouring
  value), as in the evolutionary loop of AlphaEvolve-style kernel search.
- :class:`DefaultProposer`: systematic until it has nothing new, then evolution.
- :class:`AgentProposer` wraps any text-in/text-out coding agent: it receives
  :meth:`Context.prompt` and answers with a JSON list of parameter dicts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from kernels_pallas.taxonomy import workloads as wl

SPACE: dict[str, dict[str, tuple]] = {
    "matmul": {"block_m": (16, 32, 64, 128, 256), "block_n": (16, 32, 64, 128, 256),
               "block_k": (16, 32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3, 4),
               "split_k": (1, 2, 4, 8), "group_m": (1, 4, 8), "grid_order": ("mn", "nm"),
               "backend": ("triton", "mosaic_hopper", "mosaic_blackwell"),
               "fuse_epilogue": (False, True)},
    "attention": {"block_q": (16, 32, 64, 128), "block_k": (16, 32, 64, 128)},
    "rmsnorm": {"block_rows": (1, 2, 4, 8, 16, 32, 64)},
}
# no split-K and no Mosaic GPU path in the scaled kernel
SPACE["scaled_matmul"] = dict(SPACE["matmul"], split_k=(1,), backend=("triton",))
START: dict[str, dict] = {
    "matmul": dict(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1, split_k=1,
                   group_m=1, grid_order="mn", backend="triton", fuse_epilogue=False),
    "attention": dict(block_q=16, block_k=16),
    "rmsnorm": dict(block_rows=1),
}
START["scaled_matmul"] = dict(START["matmul"])
# Which knobs each strategy of the taxonomy turns, per op (taxonomy order).
KNOBS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "matmul": [("tiling", ("block_m",)), ("tiling", ("block_n",)),
               ("pipelining", ("num_stages",)),
               # bulk_copy and warp_specialization: the Mosaic GPU backends (TMA + specialised
               # warpgroups), which store the product unfused, so both knobs move together
               ("bulk_copy+warp_specialization", ("backend", "fuse_epilogue")),
               ("tiling", ("block_k",)), ("mma", ("num_warps",)),
               ("split_k", ("split_k",)), ("epilogue_fusion", ("fuse_epilogue",)),
               ("grid_swizzle", ("group_m",)), ("grid_swizzle", ("grid_order",))],
    "attention": [("online_softmax", ("block_q", "block_k"))],
    "rmsnorm": [("tiling", ("block_rows",))],
}
KNOBS["scaled_matmul"] = [k for k in KNOBS["matmul"] if "backend" not in k[1]]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a proposer knows: the workload, the target, the space and the taxonomy."""

    workload: wl.Workload
    target: str
    space: dict[str, tuple]
    start: dict
    taxonomy_text: str
    tests_text: str

    def prompt(self, history: Sequence[Any], n: int) -> str:
        """The text a coding agent receives: task, taxonomy, unit tests, history, answer format."""
        rows = "\n".join(f"- {h.params} -> {h.status}, cost {h.cost}" for h in history[-20:])
        return (f"Write {n} kernel configurations for {self.workload} on {self.target}.\n"
                f"Parameters and allowed values: {self.space}\n"
                f"Answer with a JSON list of {n} objects using exactly these keys.\n\n"
                f"# Taxonomy of optimisation strategies\n{self.taxonomy_text}\n\n"
                f"# Unit tests every candidate must pass\n{self.tests_text}\n\n"
                f"# Tried so far\n{rows or '(nothing)'}\n")


class Proposer(Protocol):
    def propose(self, context: Context, history: Sequence[Any], n: int) -> list[dict]:
        """Up to ``n`` new parameter dicts (duplicates of the history are dropped by the search)."""


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def incumbent(context: Context, history: Sequence[Any]) -> dict:
    """The best passed candidate's parameters so far (the start point if none passed)."""
    passed = [h for h in history if h.status == "passed"]
    return dict(min(passed, key=lambda h: h.cost).params) if passed else dict(context.start)


class SystematicProposer:
    """Strategy stacking by coordinate descent over the taxonomy's knobs (module docstring)."""

    def __init__(self, max_sweeps: int = 3):
        self.max_sweeps = max_sweeps
        self._phase = 0
        self._queue: list[dict] = []

    def propose(self, context: Context, history: Sequence[Any], n: int) -> list[dict]:
        seen = {_key(h.params) for h in history}
        phases = KNOBS[context.workload.op]
        out: list[dict] = []
        stalled = 0
        while len(out) < n:
            if self._queue:
                out.append(self._queue.pop(0))
                continue
            if out:  # let the incumbent update before the next strategy is stacked
                break
            if self._phase >= self.max_sweeps * len(phases) or stalled >= len(phases):
                break
            base = incumbent(context, history)
            _, knobs = phases[self._phase % len(phases)]
            self._phase += 1
            for values in itertools.product(*(context.space[k] for k in knobs)):
                cand = dict(base, **dict(zip(knobs, values, strict=True)))
                if _key(cand) not in seen and all(_key(cand) != _key(c) for c in self._queue):
                    self._queue.append(cand)
            stalled = 0 if self._queue else stalled + 1
        return out


class EvolutionaryProposer:
    """Tournament selection + neighbour mutation + uniform crossover over passed candidates."""

    def __init__(self, seed: int = 0, population: int = 8):
        self.rng = np.random.default_rng(seed)
        self.population = population

    def _mutate(self, params: dict, space: dict) -> dict:
        child = dict(params)
        n_moves = min(len(space), int(self.rng.integers(1, 3)))
        for k in self.rng.choice(list(space), size=n_moves, replace=False):
            values = space[k]
            i = values.index(child[k]) if child[k] in values else 0
            j = int(np.clip(i + self.rng.choice([-1, 1]), 0, len(values) - 1))
            child[k] = values[j]
        return child

    def propose(self, context: Context, history: Sequence[Any], n: int) -> list[dict]:
        passed = sorted((h for h in history if h.status == "passed"), key=lambda h: h.cost)
        parents = [dict(h.params) for h in passed[: self.population]] or [dict(context.start)]
        seen = {_key(h.params) for h in history}
        out: list[dict] = []
        for _ in range(50 * n):
            if len(out) == n:
                break
            a = parents[min(self.rng.integers(len(parents), size=2))]
            if len(parents) > 1 and self.rng.random() < 0.3:
                b = parents[self.rng.integers(len(parents))]
                a = {k: (a[k] if self.rng.random() < 0.5 else b[k]) for k in a}
            child = self._mutate(a, context.space)
            if _key(child) not in seen:
                seen.add(_key(child))
                out.append(child)
        return out


class DefaultProposer:
    """Systematic stacking first; evolution once the systematic sweeps have nothing new."""

    def __init__(self, seed: int = 0):
        self.systematic = SystematicProposer()
        self.evolution = EvolutionaryProposer(seed)

    def propose(self, context: Context, history: Sequence[Any], n: int) -> list[dict]:
        return (self.systematic.propose(context, history, n)
                or self.evolution.propose(context, history, n))


class AgentProposer:
    """A coding agent behind a text interface: ``generate(prompt) -> text`` holding JSON."""

    def __init__(self, generate: Callable[[str], str]):
        self.generate = generate

    def propose(self, context: Context, history: Sequence[Any], n: int) -> list[dict]:
        text = self.generate(context.prompt(history, n))
        match = re.search(r"\[.*\]", text, re.S)
        if not match:
            return []
        try:
            items = json.loads(match.group(0))
        except json.JSONDecodeError:
            return []
        return [dict(i) for i in items if isinstance(i, dict)][:n]
