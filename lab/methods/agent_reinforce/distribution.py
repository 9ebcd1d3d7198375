"""The probabilistic collaboration graph (the Agent-REINFORCE abstract's probabilistic graph
optimisation; Bernoulli edges with logits as in GPTSwarm, Zhuge et al. 2024).

:class:`GraphDistribution` samples the layered graphs of
:func:`~lab.methods.agent_reinforce.graph.layered`:

- width ``w ~ Cat(width)`` over ``1..max_width``, depth ``d ~ Cat(depth)`` over
  ``0..max_depth``;
- each node ``(k, i)`` (layer ``k``, column ``i``) with ``k <= d, i < w``: model
  ``~ Cat(model[k, i])`` over the pool;
  for ``k >= 1`` role ``~ Cat(role[k - 1, i])`` over :data:`LAYER_ROLES`;
- each cross-column edge ``(k - 1, j) -> (k, i)``, ``j != i``: ``~ Bernoulli(sigmoid(
  edge[k - 1, i, j]))`` (the own column's edge is always there);
- the final aggregator's model ``~ Cat(aggregator)``.

The variables that exist depend only on ``(w, d)``, so ``log_prob`` sums to 1 over the space
(:meth:`enumerate` lists it for small settings). :meth:`grad_log_prob` is the score function
(one-hot minus softmax; outcome minus sigmoid), which plain REINFORCE follows; the logits are
a dict of numpy arrays that a feedback agent may also move directly (:meth:`apply`).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from lab.methods.agent_reinforce.graph import CollaborationGraph, layered

LAYER_ROLES = ("critic", "refiner", "aggregator")
PARAMS = ("width", "depth", "model", "role", "edge", "aggregator")


@dataclasses.dataclass(frozen=True)
class Choices:
    """One sample: width ``w``, depth ``d``, ``models [d + 1][w]``, ``roles [d][w]``
    (indices into :data:`LAYER_ROLES`), ``edges [d][w][w]`` (bools; the diagonal unused)
    and the aggregator's model."""

    w: int
    d: int
    models: tuple
    roles: tuple
    edges: tuple
    aggregator: int


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


class GraphDistribution:
    """Categoricals over width, depth, roles and models, Bernoulli edge logits.

    ``n_models``: the pool's size; ``max_width >= 1``, ``max_depth >= 0``. ``logits`` start
    at 0 (uniform; edges with probability 1/2) unless given. ``allowed_models`` restricts
    every model choice to a subset of the pool (the others get probability 0).
    """

    def __init__(self, n_models: int, max_width: int, max_depth: int, *, logits=None,
                 allowed_models=None, max_logit: float = 8.0):
        for name, v, low in (("n_models", n_models, 1), ("max_width", max_width, 1),
                             ("max_depth", max_depth, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                what = "a non-empty model pool" if name == "n_models" else f"an int >= {low}"
                raise ValueError(f"{name}={v!r}; expected {what}")
        self.n_models, self.max_width, self.max_depth = n_models, max_width, max_depth
        self.max_logit = float(max_logit)
        w, d, m = max_width, max_depth, n_models
        shapes = {"width": (w,), "depth": (d + 1,), "model": (d + 1, w, m),
                  "role": (max(d, 1), w, len(LAYER_ROLES)), "edge": (max(d, 1), w, w),
                  "aggregator": (m,)}
        self.logits = {k: np.zeros(s) for k, s in shapes.items()}
        if logits is not None:
            for k, v in logits.items():
                if k not in shapes or np.shape(v) != shapes[k]:
                    raise ValueError(f"logits[{k!r}] has shape {np.shape(v)}; expected "
                                     f"{shapes.get(k)} (keys {PARAMS})")
                self.logits[k] = np.array(v, float)
        allowed = range(m) if allowed_models is None else list(allowed_models)
        if not allowed or any(not 0 <= a < m for a in allowed):
            raise ValueError(f"allowed_models={allowed_models!r}; expected a non-empty subset "
                             f"of range({m})")
        self.mask = np.full(m, -np.inf)
        self.mask[list(allowed)] = 0.0

    def copy(self) -> GraphDistribution:
        out = GraphDistribution(self.n_models, self.max_width, self.max_depth,
                                logits={k: v.copy() for k, v in self.logits.items()},
                                max_logit=self.max_logit)
        out.mask = self.mask.copy()
        return out

    # -- probabilities
    def _lp(self, name: str) -> np.ndarray:
        x = self.logits[name]
        if name in ("model", "aggregator"):
            x = x + self.mask
        return _log_softmax(x)

    def probs(self, name: str) -> np.ndarray:
        """The probabilities of a categorical parameter (``sigmoid`` for ``"edge"``)."""
        if name == "edge":
            return 1.0 / (1.0 + np.exp(-self.logits["edge"]))
        return np.exp(self._lp(name))

    def sample(self, rng: np.random.Generator) -> Choices:
        def cat(lp):
            return int(rng.choice(len(lp), p=np.exp(lp)))

        w = cat(self._lp("width")) + 1
        d = cat(self._lp("depth"))
        lm, lr, pe = self._lp("model"), self._lp("role"), self.probs("edge")
        models = tuple(tuple(cat(lm[k, i]) for i in range(w)) for k in range(d + 1))
        roles = tuple(tuple(cat(lr[k, i]) for i in range(w)) for k in range(d))
        edges = tuple(tuple(tuple(bool(j != i and rng.random() < pe[k, i, j])
                                  for j in range(w)) for i in range(w)) for k in range(d))
        return Choices(w, d, models, roles, edges, cat(self._lp("aggregator")))

    def log_prob(self, c: Choices) -> float:
        lm, lr, le = self._lp("model"), self._lp("role"), self.logits["edge"]
        out = self._lp("width")[c.w - 1] + self._lp("depth")[c.d] + self._lp("aggregator")[
            c.aggregator]
        for k in range(c.d + 1):
            for i in range(c.w):
                out += lm[k, i, c.models[k][i]]
        for k in range(c.d):
            for i in range(c.w):
                out += lr[k, i, c.roles[k][i]]
                for j in range(c.w):
                    if j != i:
                        x = le[k, i, j]
                        out += _log_sigmoid(x) if c.edges[k][i][j] else _log_sigmoid(-x)
        return float(out)

    def grad_log_prob(self, c: Choices) -> dict[str, np.ndarray]:
        """``d log p(c) / d logits`` per parameter (zeros where ``c`` has no variable)."""
        g = {k: np.zeros_like(v) for k, v in self.logits.items()}

        def onehot(lp, k):
            v = -np.exp(lp)
            v[k] += 1.0
            return v

        g["width"] = onehot(self._lp("width"), c.w - 1)
        g["depth"] = onehot(self._lp("depth"), c.d)
        g["aggregator"] = onehot(self._lp("aggregator"), c.aggregator)
        lm, lr, pe = self._lp("model"), self._lp("role"), self.probs("edge")
        for k in range(c.d + 1):
            for i in range(c.w):
                g["model"][k, i] = onehot(lm[k, i], c.models[k][i])
        for k in range(c.d):
            for i in range(c.w):
                g["role"][k, i] = onehot(lr[k, i], c.roles[k][i])
                for j in range(c.w):
                    if j != i:
                        g["edge"][k, i, j] = float(c.edges[k][i][j]) - pe[k, i, j]
        for k in ("model", "aggregator"):
            g[k] = np.where(np.isfinite(self.mask), g[k], 0.0)
        return g

    def apply(self, delta: dict[str, np.ndarray], step: float = 1.0) -> None:
        """``logits += step * delta`` per given parameter, clipped to ``+-max_logit``."""
        for k, v in delta.items():
            if k not in self.logits:
                raise ValueError(f"delta key {k!r}; expected one of {PARAMS}")
            self.logits[k] = np.clip(self.logits[k] + step * np.asarray(v, float),
                                     -self.max_logit, self.max_logit)

    def to_graph(self, c: Choices) -> CollaborationGraph:
        return layered(c.models, [[LAYER_ROLES[r] for r in row] for row in c.roles],
                       c.edges, c.aggregator)

    def mode(self) -> Choices:
        """The most probable value of every variable (width and depth first)."""
        w = int(np.argmax(self._lp("width"))) + 1
        d = int(np.argmax(self._lp("depth")))
        lm, lr, pe = self._lp("model"), self._lp("role"), self.probs("edge")
        return Choices(
            w, d,
            tuple(tuple(int(np.argmax(lm[k, i])) for i in range(w)) for k in range(d + 1)),
            tuple(tuple(int(np.argmax(lr[k, i])) for i in range(w)) for k in range(d)),
            tuple(tuple(tuple(bool(j != i and pe[k, i, j] > 0.5) for j in range(w))
                        for i in range(w)) for k in range(d)),
            int(np.argmax(self._lp("aggregator"))))

    def enumerate(self, limit: int = 200_000):
        """Every value of the space (for tests and tiny settings); ValueError beyond
        ``limit`` values."""
        m, nr = self.n_models, len(LAYER_ROLES)
        total = 0
        for w in range(1, self.max_width + 1):
            for d in range(self.max_depth + 1):
                total += m ** ((d + 1) * w + 1) * nr ** (d * w) * 2 ** (d * w * (w - 1))
        if total > limit:
            raise ValueError(f"the space has {total} graphs > limit={limit}")
        for w in range(1, self.max_width + 1):
            for d in range(self.max_depth + 1):
                offdiag = [(k, i, j) for k in range(d) for i in range(w) for j in range(w)
                           if j != i]
                for ms in itertools.product(range(m), repeat=(d + 1) * w):
                    models = tuple(tuple(ms[k * w:(k + 1) * w]) for k in range(d + 1))
                    for rs in itertools.product(range(nr), repeat=d * w):
                        roles = tuple(tuple(rs[k * w:(k + 1) * w]) for k in range(d))
                        for es in itertools.product((False, True), repeat=len(offdiag)):
                            e = np.zeros((d, w, w), bool)
                            for (k, i, j), v in zip(offdiag, es, strict=True):
                                e[k, i, j] = v
                            edges = tuple(tuple(tuple(bool(x) for x in row) for row in lay)
                                          for lay in e)
                            for a in range(m):
                                yield Choices(w, d, models, roles, edges, a)
