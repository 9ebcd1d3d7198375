"""Multi-LLM collaboration graphs (the Agent-REINFORCE abstract: nodes encode roles and LLM
model assignments, edges the information flow).

A :class:`CollaborationGraph` is a DAG of :class:`Node` s; each node has a role from
:data:`ROLES` and a model index into a pool (:class:`~.executor.ModelPool`). What a role
does with its parents' chains is the :class:`~.executor.Executor`'s business;
the graph only fixes who reads whom and which node answers (``output``).

:func:`best_of_n`, :func:`self_refine` and :func:`debate` build the fixed topologies the
search is compared against (repeated sampling with a vote; one chain refined round after
round; agents that each read every agent of the previous round, Du et al. 2023).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

ROLES = ("solver", "critic", "refiner", "aggregator")


@dataclasses.dataclass(frozen=True)
class Node:
    """One node: ``role`` (one of :data:`ROLES`), ``model`` (index into the pool) and the
    indices of the nodes it reads (``parents``; a solver reads none, every other role at
    least one)."""

    role: str
    model: int
    parents: tuple[int, ...] = ()

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"Node.role={self.role!r}; expected one of {ROLES}")
        if isinstance(self.model, bool) or not isinstance(self.model, int) or self.model < 0:
            raise ValueError(f"Node.model={self.model!r}; expected a pool index >= 0")
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        if self.role == "solver" and self.parents:
            raise ValueError(f"a solver reads no parents; got parents={self.parents}")
        if self.role != "solver" and not self.parents:
            raise ValueError(f"a {self.role} needs at least one parent; got none")
        if len(set(self.parents)) != len(self.parents):
            raise ValueError(f"Node.parents={self.parents} repeats a parent")


@dataclasses.dataclass(frozen=True)
class CollaborationGraph:
    """A DAG of nodes; ``output`` (default: the last node) is the node whose answer the
    graph gives. Raises ValueError for a parent index out of range, a cycle, or an
    output that is not a node."""

    nodes: tuple[Node, ...]
    output: int | None = None

    def __post_init__(self):
        nodes = tuple(self.nodes)
        object.__setattr__(self, "nodes", nodes)
        if not nodes:
            raise ValueError("CollaborationGraph.nodes is empty; expected at least one node")
        n = len(nodes)
        for i, node in enumerate(nodes):
            for p in node.parents:
                if not 0 <= p < n:
                    raise ValueError(f"node {i} has parent {p}; expected an index in [0, {n})")
        out = n - 1 if self.output is None else self.output
        if isinstance(out, bool) or not isinstance(out, int) or not 0 <= out < n:
            raise ValueError(f"CollaborationGraph.output={self.output!r}; expected a node "
                             f"index in [0, {n})")
        object.__setattr__(self, "output", out)
        object.__setattr__(self, "_order", _topological_order(nodes))

    @property
    def order(self) -> tuple[int, ...]:
        """Node indices in a topological order (parents first)."""
        return self._order

    def ancestors(self) -> tuple[int, ...]:
        """The nodes the output depends on (itself included), in topological order; the
        executor runs only these."""
        need, stack = set(), [self.output]
        while stack:
            i = stack.pop()
            if i not in need:
                need.add(i)
                stack.extend(self.nodes[i].parents)
        return tuple(i for i in self.order if i in need)

    def check_pool(self, pool_size: int) -> None:
        """ValueError when a node's model index is outside a pool of ``pool_size``."""
        if pool_size < 1:
            raise ValueError(f"pool_size={pool_size}; expected a non-empty model pool")
        for i, node in enumerate(self.nodes):
            if node.model >= pool_size:
                raise ValueError(f"node {i} has model={node.model}; expected an index < "
                                 f"pool size {pool_size}")

    def width(self) -> int:
        """Solvers the output depends on (parallel chains)."""
        return sum(self.nodes[i].role == "solver" for i in self.ancestors())

    def depth(self) -> int:
        """Critic and refiner nodes on the longest path to the output (sequential rounds)."""
        d = {}
        for i in self.ancestors():
            node = self.nodes[i]
            own = int(node.role in ("critic", "refiner"))
            d[i] = own + max((d[p] for p in node.parents), default=0)
        return d[self.output]

    def models_used(self) -> tuple[int, ...]:
        """Sorted distinct model indices of the nodes the output depends on."""
        return tuple(sorted({self.nodes[i].model for i in self.ancestors()}))

    def signature(self, names: Sequence[str] | None = None) -> str:
        """A short readable description: ``node:role@model<-parents`` per node the output
        depends on, in topological order."""
        parts = []
        for i in self.ancestors():
            node = self.nodes[i]
            m = names[node.model] if names else str(node.model)
            src = "<" + ",".join(map(str, node.parents)) if node.parents else ""
            parts.append(f"{i}:{node.role[0]}@{m}{src}")
        return " ".join(parts)


def _topological_order(nodes: Sequence[Node]) -> tuple[int, ...]:
    """Kahn's algorithm; ValueError naming the nodes on a cycle."""
    n = len(nodes)
    indeg = [len(node.parents) for node in nodes]
    children = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        for p in node.parents:
            children[p].append(i)
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if len(order) < n:
        stuck = sorted(set(range(n)) - set(order))
        raise ValueError(f"the graph has a cycle through nodes {stuck}; expected a DAG")
    return tuple(order)


# --------------------------------------------------------------------------- fixed topologies


def _count(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}; expected an int >= {low}")
    return value


def best_of_n(model: int, n: int, aggregator: int | None = None) -> CollaborationGraph:
    """``n`` solvers of ``model`` and an aggregator (of ``aggregator``, default ``model``)
    voting over their answers (self-consistency)."""
    _count("n", n, 1)
    nodes = [Node("solver", model) for _ in range(n)]
    nodes.append(Node("aggregator", model if aggregator is None else aggregator,
                      tuple(range(n))))
    return CollaborationGraph(tuple(nodes))


def self_refine(model: int, rounds: int, critic: bool = False) -> CollaborationGraph:
    """One solver of ``model`` then ``rounds`` refiners of the same model, each reading the
    previous chain (with a critic of the same model before each refiner when ``critic``)."""
    _count("rounds", rounds, 0)
    nodes = [Node("solver", model)]
    for _ in range(rounds):
        if critic:
            nodes.append(Node("critic", model, (len(nodes) - 1,)))
        nodes.append(Node("refiner", model, (len(nodes) - 1,)))
    return CollaborationGraph(tuple(nodes))


def debate(models: Sequence[int], rounds: int, aggregator: int | None = None
           ) -> CollaborationGraph:
    """Multi-agent debate: one solver per entry of ``models``, then ``rounds`` rounds where
    each agent (a refiner of its model) reads every agent of the previous round; an
    aggregator (default: the largest index of ``models``) votes over the last round."""
    models = list(models)
    if not models:
        raise ValueError("debate models=[]; expected at least one agent")
    _count("rounds", rounds, 0)
    k = len(models)
    nodes = [Node("solver", m) for m in models]
    for r in range(rounds):
        prev = tuple(range(r * k, (r + 1) * k))
        nodes += [Node("refiner", m, prev) for m in models]
    last = tuple(range(rounds * k, (rounds + 1) * k))
    nodes.append(Node("aggregator", max(models) if aggregator is None else aggregator, last))
    return CollaborationGraph(tuple(nodes))


def layered(models: Sequence[Sequence[int]], roles: Sequence[Sequence[str]],
            edges: Sequence[Sequence[Sequence[bool]]], aggregator: int) -> CollaborationGraph:
    """The layered graph :class:`~lab.methods.agent_reinforce.distribution.GraphDistribution`
    samples: ``models[l][i]`` for layer ``l`` (``0..d``) and column ``i`` (``0..w-1``);
    layer 0 holds solvers, ``roles[l - 1][i]`` the role of node ``(l, i)`` for ``l >= 1``,
    which reads its own column's node of layer ``l - 1`` and every ``(l - 1, j)`` with
    ``edges[l - 1][i][j]`` (``j != i``); a final aggregator of model ``aggregator`` reads
    the last layer. Node ``(l, i)`` has index ``l * w + i``."""
    d1, w = len(models), len(models[0]) if models else 0
    if d1 < 1 or w < 1 or any(len(row) != w for row in models):
        raise ValueError(f"models has shape {[len(r) for r in models]}; expected d + 1 >= 1 "
                         "layers of the same width >= 1")
    if len(roles) != d1 - 1 or len(edges) != d1 - 1:
        raise ValueError(f"roles/edges have {len(roles)}/{len(edges)} layers; expected "
                         f"{d1 - 1}")
    nodes = [Node("solver", int(m)) for m in models[0]]
    for layer in range(1, d1):
        for i in range(w):
            parents = [(layer - 1) * w + i] + [(layer - 1) * w + j for j in range(w)
                                               if j != i and edges[layer - 1][i][j]]
            nodes.append(Node(roles[layer - 1][i], int(models[layer][i]), tuple(parents)))
    last = tuple(range((d1 - 1) * w, d1 * w))
    nodes.append(Node("aggregator", int(aggregator), last))
    return CollaborationGraph(tuple(nodes))
