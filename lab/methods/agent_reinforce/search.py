"""Searching collaboration graphs under a budget: sample -> feedback -> update.

Agent-REINFORCE (the abstract) mirrors REINFORCE's sampling -> gradient -> update with
sampling -> feedback -> update: graphs are sampled from a
:class:`~lab.methods.agent_reinforce.distribution.GraphDistribution`, executed, and a
:class:`FeedbackAgent` reads what happened at every node and returns a :class:`Feedback`
(the "textual gradient": items that name a parameter of the distribution, which value to move
and why), which is applied as an update of the distribution's logits.

- :class:`RuleBasedAnalyst` (the default agent): credit from per-node outcomes over every
  graph seen so far: solvers' accuracy per model; the gain of each critic, refiner and
  aggregator over its own column's input, per role and per model; the gain of nodes with
  cross-column inputs; the objective per width and per depth; graphs over the budget push
  their width, depth and models down.
- :class:`LLMAnalyst`: the same interface around any text-in/text-out client (a callable):
  it renders the outcomes as a prompt and parses the reply's JSON items.

Baselines on the same distribution and executor: ``"random"`` (sample from the initial
distribution, keep the best) and ``"reinforce"`` (the score-function gradient of the mean
reward with a batch-mean baseline; Williams 1992).

:class:`Objective`: accuracy, or the joint ``accuracy - latency_weight * latency``, subject to
a budget on FLOPs per problem or on latency; a graph over the budget is infeasible (reward 0
for REINFORCE, never the best).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from lab.methods.agent_reinforce.distribution import (
    LAYER_ROLES,
    PARAMS,
    Choices,
    GraphDistribution,
)
from lab.methods.agent_reinforce.executor import Executor, Problems, Result
from lab.methods.agent_reinforce.graph import best_of_n

COSTS = ("flops", "latency")
METHODS = ("agent", "reinforce", "random")


@dataclasses.dataclass(frozen=True)
class Objective:
    """``value = accuracy - latency_weight * latency`` (seconds); feasible when the graph's
    ``cost`` (``"flops"`` per problem or ``"latency"``) is at most ``budget`` (None: no
    budget)."""

    budget: float | None = None
    cost: str = "flops"
    latency_weight: float = 0.0

    def __post_init__(self):
        if self.cost not in COSTS:
            raise ValueError(f"Objective.cost={self.cost!r}; expected one of {COSTS}")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"Objective.budget={self.budget!r}; expected > 0 or None")
        if self.latency_weight < 0:
            raise ValueError(f"Objective.latency_weight={self.latency_weight}; expected >= 0")

    def cost_of(self, r: Result) -> float:
        return r.flops if self.cost == "flops" else r.latency

    def feasible(self, r: Result) -> bool:
        return self.budget is None or self.cost_of(r) <= self.budget

    def value(self, r: Result) -> float:
        return r.accuracy - self.latency_weight * r.latency


# --------------------------------------------------------------------------- feedback


@dataclasses.dataclass(frozen=True)
class FeedbackItem:
    """Move ``logits[param][..., *index]`` by ``delta`` (before the agent's step size),
    with the ``reason`` in words; ``index`` addresses the trailing axes, None for a whole
    axis (``("model", (0, None, 2))``: model 2 at every column of layer 0)."""

    param: str
    index: tuple
    delta: float
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Feedback:
    items: tuple

    @property
    def text(self) -> str:
        return "\n".join(f"{it.param}{list(it.index)} {it.delta:+.2f}: {it.reason}"
                         for it in self.items)

    def delta(self, dist: GraphDistribution) -> dict[str, np.ndarray]:
        """The items as arrays shaped like ``dist.logits``; ValueError for an unknown
        parameter or an index outside it."""
        out = {k: np.zeros_like(v) for k, v in dist.logits.items()}
        for it in self.items:
            if it.param not in out:
                raise ValueError(f"feedback param={it.param!r}; expected one of {PARAMS}")
            arr = out[it.param]
            idx = tuple(None if i is None else int(i) for i in it.index)
            if len(idx) > arr.ndim or any(i is not None and not 0 <= i < s for i, s in
                                          zip(idx, arr.shape[arr.ndim - len(idx):],
                                              strict=True)):
                raise ValueError(f"feedback index {list(idx)} is outside {it.param}'s shape "
                                 f"{arr.shape} (indices address the trailing axes)")
            sel = tuple(slice(None) if i is None else i for i in idx)
            arr[(Ellipsis, *sel)] += float(it.delta)
        return out


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluated sample: its choices, result, objective value and feasibility."""

    choices: Choices
    result: Result
    value: float
    feasible: bool


class FeedbackAgent(Protocol):
    """``feedback(history, batch, objective, dist) -> Feedback``: ``history`` every
    :class:`Evaluation` so far (``batch``, the latest ones, included)."""

    def feedback(self, history: Sequence[Evaluation], batch: Sequence[Evaluation],
                 objective: Objective, dist: GraphDistribution) -> Feedback: ...


def _centred(stats: dict) -> dict:
    """``{key: (x - mean) / max |x - mean|}`` (0 when every value is equal)."""
    if len(stats) < 2:
        return {k: 0.0 for k in stats}
    mean = float(np.mean(list(stats.values())))
    span = max(abs(v - mean) for v in stats.values())
    return {k: (v - mean) / span if span > 1e-9 else 0.0 for k, v in stats.items()}


class RuleBasedAnalyst:
    """Turns per-node outcomes into feedback items (see the module docstring). Each rule's
    statistics are over every evaluation so far, centred and scaled to ``[-1, 1]``;
    ``over_budget`` is the push against the width, depth and models of infeasible graphs."""

    def __init__(self, over_budget: float = 1.0):
        self.over_budget = float(over_budget)

    def feedback(self, history, batch, objective, dist) -> Feedback:
        items = []
        solver_acc, later_gain, role_gain, cross_gain = {}, {}, {}, {}
        crit_fed, agg_gain = {True: [], False: []}, {}
        width_val, depth_val = {}, {}
        infeasible = [e for e in history if not e.feasible]
        for e in history:
            nodes = {o.index: o for o in e.result.nodes}
            out_idx = max(nodes)
            if e.feasible:
                width_val.setdefault(e.choices.w, []).append(e.value)
                depth_val.setdefault(e.choices.d, []).append(e.value)
            for o in e.result.nodes:
                if o.role == "solver":
                    solver_acc.setdefault(o.model, []).append(o.accuracy)
                    continue
                inputs = [nodes[p].accuracy for p in o.parents]
                if o.index == out_idx:             # the final aggregator
                    agg_gain.setdefault(o.model, []).append(o.accuracy - max(inputs))
                    continue
                gain = o.accuracy - inputs[0]
                later_gain.setdefault(o.model, []).append(gain)
                role_gain.setdefault(o.role, []).append(gain)
                cross_gain.setdefault(len(o.parents) > 1, []).append(gain)
                if o.role == "refiner":
                    crit_fed[nodes[o.parents[0]].role == "critic"].append(gain)
        mean = {k: float(np.mean(v)) for k, v in solver_acc.items()}
        for m, z in _centred(mean).items():
            items.append(FeedbackItem("model", (0, None, m), z, f"solvers of model {m} answer "
                                      f"{mean[m]:.2f} of the problems"))
        mean = {k: float(np.mean(v)) for k, v in later_gain.items()}
        for m, z in _centred(mean).items():
            for k in range(1, dist.max_depth + 1):
                items.append(FeedbackItem("model", (k, None, m), z, f"critic/refiner/"
                                          f"aggregator nodes of model {m} gain "
                                          f"{mean[m]:+.3f} over their input"))
        mean = {LAYER_ROLES.index(k): float(np.mean(v)) for k, v in role_gain.items()}
        if crit_fed[True] and crit_fed[False]:   # a critic's worth shows in its refiner
            mean[LAYER_ROLES.index("critic")] = float(np.mean(crit_fed[True]))
        for r, z in _centred(mean).items():
            items.append(FeedbackItem("role", (r,), z, f"{LAYER_ROLES[r]} nodes gain "
                                      f"{mean[r]:+.3f} over their input"))
        if True in cross_gain and False in cross_gain:
            diff = float(np.mean(cross_gain[True]) - np.mean(cross_gain[False]))
            items.append(FeedbackItem("edge", (), float(np.clip(diff / 0.05, -1, 1)),
                                      f"nodes reading other columns gain {diff:+.3f} more"))
        mean = {k: float(np.mean(v)) for k, v in agg_gain.items()}
        for m, z in _centred(mean).items():
            items.append(FeedbackItem("aggregator", (m,), z, f"the final vote under model {m} "
                                      f"gains {mean[m]:+.3f} over its best input"))
        for name, table in (("width", width_val), ("depth", depth_val)):
            mean = {k: float(np.mean(v)) for k, v in table.items()}
            for k, z in _centred(mean).items():
                items.append(FeedbackItem(name, (k - 1 if name == "width" else k,), z,
                                          f"{name} {k}: mean objective {mean[k]:.3f}"))
        if infeasible and objective.budget is not None:
            frac = len(infeasible) / len(history)
            for e in infeasible:
                s = -self.over_budget * frac / len(infeasible)
                items.append(FeedbackItem("width", (e.choices.w - 1,), s, "over the budget"))
                items.append(FeedbackItem("depth", (e.choices.d,), s, "over the budget"))
                heavy = max(e.result.nodes, key=lambda o: o.flops).model
                items.append(FeedbackItem("model", (heavy,), s, "its costliest node's model "
                                          "is over the budget"))
        return Feedback(tuple(items))


class LLMAnalyst:
    """A :class:`FeedbackAgent` around ``client(prompt: str) -> str`` (any LLM). The prompt
    describes the parameters and every graph of the batch with its per-node outcomes; the
    reply must hold a JSON list of ``{"param", "index", "delta", "reason"}`` objects (deltas
    clipped to ``+-max_delta``). A reply without one raises ValueError, unless ``fallback``
    (another agent) is given."""

    def __init__(self, client: Callable[[str], str], *, names: Sequence[str] | None = None,
                 max_delta: float = 2.0, fallback: FeedbackAgent | None = None):
        if not callable(client):
            raise ValueError(f"client={client!r}; expected a callable str -> str")
        self.client, self.names = client, names
        self.max_delta, self.fallback = float(max_delta), fallback
        self.prompts: list[str] = []

    def prompt(self, history, batch, objective, dist) -> str:
        names = self.names or [str(m) for m in range(dist.n_models)]
        lines = [
            "You tune a distribution over multi-LLM collaboration graphs for arithmetic "
            "chains of thought. Parameters (logits): width[w-1] (w = 1.."
            f"{dist.max_width}), depth[d] (d = 0..{dist.max_depth}), model[..., m] over "
            f"models {list(enumerate(names))}, role[..., r] over {list(LAYER_ROLES)}, edge "
            "(cross-column reads), aggregator[m] (the final vote's model).",
            f"Objective: accuracy - {objective.latency_weight} * latency; budget "
            f"{objective.budget} on {objective.cost}.", "Graphs just evaluated:"]
        for e in batch:
            r = e.result
            node_txt = "; ".join(f"{o.index}:{o.role}@{names[o.model]}<{list(o.parents)} "
                                 f"acc={o.accuracy:.2f}" for o in r.nodes)
            lines.append(f"- width {e.choices.w} depth {e.choices.d}: accuracy "
                         f"{r.accuracy:.3f}, flops {r.flops:.3g}, latency {r.latency:.3f}s, "
                         f"feasible {e.feasible}; nodes {node_txt}")
        best = max((e for e in history if e.feasible), key=lambda e: e.value, default=None)
        if best is not None:
            lines.append(f"Best so far: value {best.value:.3f} (width {best.choices.w}, "
                         f"depth {best.choices.d}).")
        lines.append('Reply with a JSON list of {"param": str, "index": [int, ...], '
                     '"delta": float, "reason": str}; index addresses the trailing axes '
                     '(null for a whole axis).')
        return "\n".join(lines)

    def feedback(self, history, batch, objective, dist) -> Feedback:
        text = self.prompt(history, batch, objective, dist)
        self.prompts.append(text)
        reply = self.client(text)
        try:
            return parse_feedback(reply, dist, self.max_delta)
        except ValueError:
            if self.fallback is None:
                raise
            return self.fallback.feedback(history, batch, objective, dist)


def parse_feedback(reply: str, dist: GraphDistribution, max_delta: float = 2.0) -> Feedback:
    """The :class:`Feedback` in an LLM's reply (its first JSON list); ValueError when there
    is none or an item is malformed."""
    if not isinstance(reply, str):
        raise ValueError(f"reply={reply!r}; expected the client's text")
    m = re.search(r"\[.*\]", reply, re.S)
    if m is None:
        raise ValueError(f"reply {reply[:80]!r} holds no JSON list of feedback items")
    try:
        raw = json.loads(m.group(0))
    except json.JSONDecodeError as err:
        raise ValueError(f"reply's JSON does not parse: {err}") from None
    items = []
    for k, it in enumerate(raw):
        if not isinstance(it, dict) or "param" not in it or "delta" not in it:
            raise ValueError(f"feedback item {k}={it!r}; expected an object with 'param', "
                             "'index', 'delta'")
        idx = it.get("index", [])
        idx = [idx] if isinstance(idx, int) or idx is None else list(idx)
        d = float(np.clip(float(it["delta"]), -max_delta, max_delta))
        items.append(FeedbackItem(str(it["param"]),
                                  tuple(None if i is None else int(i) for i in idx), d,
                                  str(it.get("reason", ""))))
    fb = Feedback(tuple(items))
    fb.delta(dist)   # validates params and indices
    return fb


# --------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class Trace:
    """What a search evaluated, in order, and where it ended."""

    method: str
    evaluations: list
    dist: GraphDistribution
    feedback: list

    def best_so_far(self) -> np.ndarray:
        """The best feasible objective value after each evaluation (nan before the first
        feasible one)."""
        out, best = [], -np.inf
        for e in self.evaluations:
            if e.feasible:
                best = max(best, e.value)
            out.append(best if np.isfinite(best) else np.nan)
        return np.array(out)

    def best(self) -> Evaluation | None:
        feas = [e for e in self.evaluations if e.feasible]
        return max(feas, key=lambda e: e.value) if feas else None


def check_budget(executor: Executor, problems: Problems, objective: Objective) -> Result:
    """Runs the cheapest graph (one solver of the smallest model, its own vote); ValueError
    when even it is over the budget, so that no graph can meet it."""
    small = executor.pool.smallest()
    r = executor.run(best_of_n(small, 1), problems)
    if not objective.feasible(r):
        raise ValueError(f"budget={objective.budget} on {objective.cost} cannot be met: the "
                         f"cheapest graph (one solver of {executor.pool.names[small]}) costs "
                         f"{objective.cost_of(r):.4g}")
    return r


def search(method: str, dist: GraphDistribution, executor: Executor, problems: Problems,
           objective: Objective, *, n_graphs: int, batch: int = 4, seed: int = 0,
           agent: FeedbackAgent | None = None, step: float = 1.0,
           learning_rate: float = 1.0) -> Trace:
    """Evaluates ``n_graphs`` graphs sampled in batches of ``batch``; after each batch
    ``"agent"`` applies ``agent``'s feedback (default :class:`RuleBasedAnalyst`) with step
    ``step``, ``"reinforce"`` takes a gradient step of ``learning_rate`` on the mean reward
    (infeasible: 0) minus the batch mean, ``"random"`` keeps the distribution. ``dist`` is
    copied, not changed."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; expected one of {METHODS}")
    for name, v in (("n_graphs", n_graphs), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}; expected an int >= 1")
    if dist.n_models != len(executor.pool):
        raise ValueError(f"dist.n_models={dist.n_models}; expected the pool's size "
                         f"{len(executor.pool)}")
    check_budget(executor, problems, objective)
    dist = dist.copy()
    agent = agent or RuleBasedAnalyst()
    rng = np.random.default_rng([seed, 7013])
    trace = Trace(method, [], dist, [])
    while len(trace.evaluations) < n_graphs:
        k = min(batch, n_graphs - len(trace.evaluations))
        samples = [dist.sample(rng) for _ in range(k)]
        evals = []
        for c in samples:
            r = executor.run(dist.to_graph(c), problems)
            evals.append(Evaluation(c, r, objective.value(r), objective.feasible(r)))
        trace.evaluations += evals
        if method == "reinforce":
            rewards = np.array([e.value if e.feasible else 0.0 for e in evals])
            adv = rewards - rewards.mean()
            grad = {p: np.zeros_like(v) for p, v in dist.logits.items()}
            for a, e in zip(adv, evals, strict=True):
                for p, g in dist.grad_log_prob(e.choices).items():
                    grad[p] += a * g / k
            dist.apply(grad, learning_rate)
        elif method == "agent":
            fb = agent.feedback(trace.evaluations, evals, objective, dist)
            trace.feedback.append(fb)
            dist.apply(fb.delta(dist), step)
    return trace


# --------------------------------------------------------------------------- fronts


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The ``(accuracy, latency)`` points no other point beats on both (higher accuracy,
    lower latency), sorted by latency."""
    pts = sorted(set((float(a), float(t)) for a, t in points), key=lambda p: (p[1], -p[0]))
    front, best = [], -np.inf
    for a, t in pts:
        if a > best:
            front.append((a, t))
            best = a
    return front


def hypervolume(front: Sequence[tuple[float, float]], latency_ref: float) -> float:
    """Area of the ``(accuracy >= 0, latency <= latency_ref)`` region the front dominates."""
    # sweep by latency: on each interval, the best accuracy among points no slower
    pts = sorted((t, a) for a, t in front if t <= latency_ref)
    area = 0.0
    for k, (t, _) in enumerate(pts):
        nxt = pts[k + 1][0] if k + 1 < len(pts) else latency_ref
        best = max(x for _, x in pts[:k + 1])
        area += best * (nxt - t)
    return float(area)
