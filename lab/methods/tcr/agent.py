"""TCR-Agent: narrative -> causal graph with time spans -> symbolic intervention engine.

The training-free, neuro-symbolic half of "TCR-Agent and TCR-Former" (the NeurIPS 2026
TempoCausal paper): the narrative is instantiated as an explicit causal graph (here by a
parser of the TempoCausal narrative language, :mod:`lab.data.synthetic.tempocausal`),
and questions are answered by graph queries and interventions on it:

- ``do(graph, {X: False})``: the structural model with X's equation replaced by a
  constant (Pearl 2009, Causality, sec. 3.2); every event obeys the disjunctive
  mechanism "happens iff exogenous or any cause happens", evaluated in topological order;
- counterfactual truncation: had X not happened, the events whose every causal path
  from an exogenous event runs through X are truncated with it (with a deterministic
  model and all events observed, abduction leaves the exogenous events as they were, so
  the counterfactual equals the intervention's outcome on this world).

When a narrative or question does not parse, the agent answers :data:`UNPARSED`, never a
guess shown as certain. A graph with a cycle raises ``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from lab.data.synthetic.tempocausal import reachable

UNPARSED = "unparsed"
_NAME = r"[a-z]+"
_SPAN = re.compile(rf"^({_NAME}) lasted from (\d+) to (\d+)$")
_LINK = re.compile(rf"^({_NAME}) caused ({_NAME})$")
_QUESTIONS = (
    ("cause", re.compile(rf"^which option is a cause of ({_NAME}) \?$")),
    ("effect", re.compile(rf"^which option is an effect of ({_NAME}) \?$")),
    ("order", re.compile(r"^which option started first \?$")),
    ("intervention", re.compile(rf"^if ({_NAME}) is prevented , does ({_NAME}) still happen \?$")),
    ("counterfactual",
     re.compile(rf"^had ({_NAME}) not happened , which option would not have happened \?$")),
)


class ParseError(ValueError):
    """The narrative or question is not in the TempoCausal language."""


@dataclasses.dataclass(frozen=True)
class CausalGraph:
    """Events with time spans and direct causes.

    ``spans[e] = (start, end)``; ``parents[e]`` the direct causes of ``e``. Built by
    :func:`parse` or by hand (:meth:`build` checks it).
    """

    spans: Mapping[str, tuple[int, int]]
    parents: Mapping[str, frozenset[str]]

    @classmethod
    def build(cls, spans: Mapping[str, tuple[int, int]],
              edges: Sequence[tuple[str, str]]) -> CausalGraph:
        """A checked graph from spans and ``(cause, effect)`` edges: every edge's events
        need a span, spans need ``start <= end``, and the graph must be acyclic."""
        for e, (s, t) in spans.items():
            if s > t:
                raise ValueError(f"event {e!r} has span ({s}, {t}); expected start <= end")
        parents: dict[str, set[str]] = {e: set() for e in spans}
        for a, b in edges:
            for e in (a, b):
                if e not in spans:
                    raise ValueError(f"edge ({a!r}, {b!r}) names event {e!r}, which has no "
                                     f"span; expected every linked event to have a span")
            parents[b].add(a)
        graph = cls(dict(spans), {e: frozenset(p) for e, p in parents.items()})
        graph.topological_order()  # raises on a cycle
        return graph

    @property
    def children(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {e: set() for e in self.spans}
        for e, ps in self.parents.items():
            for p in ps:
                out[p].add(e)
        return out

    def topological_order(self) -> list[str]:
        """Events with causes before effects (ties by start time, then name); ValueError
        naming a cycle when there is one."""
        indeg = {e: len(p) for e, p in self.parents.items()}
        children = self.children
        ready = sorted((e for e, d in indeg.items() if d == 0), key=self._key)
        order = []
        while ready:
            e = ready.pop(0)
            order.append(e)
            for c in children[e]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
            ready.sort(key=self._key)
        if len(order) < len(indeg):
            raise ValueError(f"the causal graph has a cycle through {self._cycle()}; "
                             f"expected a DAG")
        return order

    def _key(self, e):
        return (self.spans[e][0], e)

    def _cycle(self) -> list[str]:
        state: dict[str, int] = {}
        stack: list[str] = []

        def visit(e):
            state[e] = 1
            stack.append(e)
            for c in sorted(self.children[e]):
                if state.get(c) == 1:
                    return stack[stack.index(c):] + [c]
                if c not in state and (found := visit(c)):
                    return found
            state[e] = 2
            stack.pop()
            return None

        for e in sorted(self.spans):
            if e not in state and (found := visit(e)):
                return found
        return []

    def ancestors(self, e: str) -> set[str]:
        return reachable(self.parents, e)

    def descendants(self, e: str) -> set[str]:
        return reachable(self.children, e)


def do(graph: CausalGraph, interventions: Mapping[str, bool]) -> dict[str, bool]:
    """Whether each event happens under ``do(e = v for e, v in interventions)``: the
    intervened events take their values, every other event happens iff it is exogenous
    or any of its causes happens (evaluated in topological order)."""
    for e in interventions:
        if e not in graph.spans:
            raise ValueError(f"intervention on {e!r}: no such event; expected one of "
                             f"{sorted(graph.spans)}")
    value: dict[str, bool] = {}
    for e in graph.topological_order():
        ps = graph.parents[e]
        value[e] = bool(interventions[e]) if e in interventions else (
            not ps or any(value[p] for p in ps))
    return value


def truncated(graph: CausalGraph, event: str) -> set[str]:
    """Counterfactual truncation: the events that would not have happened had ``event``
    not happened (its descendants with no causal path around it), ``event`` excluded."""
    world = do(graph, {event: False})
    return {e for e, v in world.items() if not v and e != event}


def parse(narrative: str) -> CausalGraph:
    """The causal graph of a narrative (``". "``-separated span and link statements).

    Raises :class:`ParseError` on a statement outside the language, an event with two
    spans, or a link to an event without a span; ``ValueError`` for a cycle.
    """
    spans: dict[str, tuple[int, int]] = {}
    edges = []
    statements = [s.strip() for s in narrative.strip().split(" .") if s.strip()]
    if not statements:
        raise ParseError("the narrative has no statements")
    for s in statements:
        if m := _SPAN.match(s):
            if m[1] in spans:
                raise ParseError(f"event {m[1]!r} has two spans")
            spans[m[1]] = (int(m[2]), int(m[3]))
        elif m := _LINK.match(s):
            edges.append((m[1], m[2]))
        else:
            raise ParseError(f"statement {s!r} is not a span or a link")
    missing = sorted({e for ab in edges for e in ab} - set(spans))
    if missing:
        raise ParseError(f"events {missing} are linked but have no span")
    return CausalGraph.build(spans, edges)


def parse_question(text: str) -> tuple[str, str, str, list[str]]:
    """``"Q: <question> options: a b c"`` -> ``(type, x, y, options)`` (``""`` when absent)."""
    m = re.match(r"^Q: (.*) options: ((?:[a-z]+ ?)+)$", text.strip())
    if not m:
        raise ParseError(f"question line {text!r} is not 'Q: ... options: ...'")
    for qtype, pattern in _QUESTIONS:
        if q := pattern.match(m[1].strip()):
            groups = list(q.groups()) + ["", ""]
            return qtype, groups[0], groups[1], m[2].split()
    raise ParseError(f"question {m[1]!r} is not one of the known forms")


def answer_graph(graph: CausalGraph, qtype: str, x: str, y: str, options: Sequence[str]) -> str:
    """The answer computed on ``graph``; :data:`UNPARSED` when no option (or more than one)
    satisfies the question, or an event it names is not in the graph."""
    names = [e for e in (x, y, *([] if qtype == "intervention" else options)) if e]
    if any(e not in graph.spans for e in names):
        return UNPARSED
    if qtype == "order":
        starts = sorted(graph.spans[o][0] for o in options)
        if len(starts) > 1 and starts[0] == starts[1]:
            return UNPARSED
        return min(options, key=lambda o: graph.spans[o][0])
    if qtype == "intervention":
        return "yes" if do(graph, {x: False})[y] else "no"
    target = {"cause": graph.ancestors, "effect": graph.descendants,
              "counterfactual": lambda e: truncated(graph, e)}[qtype](x)
    hits = [o for o in options if o in target]
    return hits[0] if len(hits) == 1 else UNPARSED


def answer(prompt: str) -> str:
    """TCR-Agent's answer to a TempoCausal prompt (narrative line, then the question line),
    or :data:`UNPARSED` when the narrative or question is outside the language."""
    lines = [ln for ln in prompt.strip().split("\n") if ln.strip()]
    if len(lines) != 2:
        return UNPARSED
    try:
        graph = parse(lines[0])
        qtype, x, y, options = parse_question(lines[1])
    except ParseError:
        return UNPARSED
    return answer_graph(graph, qtype, x, y, options)
