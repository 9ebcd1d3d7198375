"""TempoCausal-style stories: timed events with causal links, and questions about them.

A generating DAG over ``n_events`` events, each with a time span, is told as a
narrative in a small closed language, one statement per fact, in random order
(so the order of the text is not the order of time, nor the causal order)::

    kol lasted from 3 to 6 . mip caused kol . mip lasted from 1 to 4 . ...

Mechanism: an event happens when it has no causes (it is exogenous) or when at
least one of its causes happens (a disjunctive structural equation, every event
happens in the story as told). Causes start strictly before their effects.
``n_distractors`` further events have spans and no links.

Question types (:data:`TEMPOCAUSAL_TYPES`), each with the ground truth from the graph:

- ``cause``: which option is a cause (direct or indirect) of X? (one ancestor, 3
  non-ancestors: X's descendants first, then other events);
- ``effect``: which option is an effect (direct or indirect) of X? (mirror image);
- ``order``: which option started first? (4 events with distinct starts);
- ``intervention``: if X is prevented (``do(X = 0)``), does Y still happen? yes/no,
  balanced; Y is a descendant of X, with or without another causal path around X, and
  the link counts of X and Y and whether X directly caused Y are drawn among those that
  pairs of both answers have;
- ``counterfactual``: had X not happened, which option would not have happened?
  (one event truncated with X, three that survive, X's surviving descendants first).

The options of ``cause``, ``effect`` and ``counterfactual`` never share a link with X
and all have the answer's number of links, so neither the words next to X nor how
often an option is named point at the answer (stories that cannot pose such a set are
redrawn: they need about 6 events or more).

The prompt lists the options in random order (``options: a b c d``); the answer
is an event name or ``yes`` / ``no``. ``trace`` is a reasoning chain for a CoT
learner: the events the answer is computed from (the causes of X, its effects,
the options' start times, or the events truncated with X), in graph order.

Difficulty (the ``difficulty`` column): the number of events the question's
trace names. Rows are a pure function of ``seed``.
"""

from __future__ import annotations

import datasets
import numpy as np

from lab.data.synthetic.base import answer_line, as_range, check_n, draw, to_dataset

TEMPOCAUSAL_TYPES = ("cause", "effect", "order", "intervention", "counterfactual")
# Nonsense event names: no name says anything about when or why it happened.
EVENT_NAMES = tuple(
    a + b + c for a in "bdfgklmnprstvz" for b in "aeiou" for c in "gklmnprstx"
)[::7]
QUESTIONS = {
    "cause": "which option is a cause of {x} ?",
    "effect": "which option is an effect of {x} ?",
    "order": "which option started first ?",
    "intervention": "if {x} is prevented , does {y} still happen ?",
    "counterfactual": "had {x} not happened , which option would not have happened ?",
}


def span_statement(event: str, start: int, end: int) -> str:
    return f"{event} lasted from {start} to {end} ."


def link_statement(cause: str, effect: str) -> str:
    return f"{cause} caused {effect} ."


def _dag(rng, n: int, n_links: int):
    """Parents per node ``0..n-1`` (topological order): 1-2 roots, every other node one
    parent among earlier nodes, then extra edges up to ``n_links``."""
    n_roots = 1 if n < 4 else int(rng.integers(1, 3))
    parents = [set() for _ in range(n)]
    for i in range(n_roots, n):
        parents[i].add(int(rng.integers(0, i)))
    extra = [(j, i) for i in range(n_roots, n) for j in range(i) if j not in parents[i]]
    rng.shuffle(extra)
    for j, i in extra[: max(0, n_links - (n - n_roots))]:
        parents[i].add(int(j))
    return parents


def _times(rng, parents, max_gap: int, max_len: int):
    starts, ends = [], []
    for ps in parents:
        s = (max(starts[p] for p in ps) + int(rng.integers(1, max_gap + 1)) if ps
             else int(rng.integers(0, max_gap + 1)))
        starts.append(s)
        ends.append(s + int(rng.integers(1, max_len + 1)))
    return starts, ends


def reachable(adj, i) -> set:
    """The nodes reachable from ``i`` through ``adj`` (a mapping or sequence of neighbour
    sets: children for descendants, parents for ancestors), ``i`` itself excluded unless on
    a cycle."""
    seen, stack = set(), [i]
    while stack:
        for j in adj[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def surviving(parents, prevented: int) -> set[int]:
    """Events that still happen under ``do(prevented = 0)``, disjunctive mechanism."""
    alive: set[int] = set()
    for i, ps in enumerate(parents):  # topological order
        if i != prevented and (not ps or ps & alive):
            alive.add(i)
    return alive


def _pick(rng, pool, k):
    pool = list(pool)
    return [pool[int(i)] for i in rng.choice(len(pool), size=min(k, len(pool)), replace=False)]


def _event_question(rng, answers, pools, near, degree, k=3):
    """``(x, answer, wrong)`` for an event question: ``(x, answer)`` drawn among the pairs
    (``answer`` in ``answers[x]``) with at least ``k`` candidates in ``pools[x]`` of the
    answer's link count, so that how connected an option is (how often the text names
    it) says nothing about the answer; the ``k`` distractors are ``near[x]`` ones (hard
    distractors) first, ties at random. None when no pair has them. (A closest-count
    rule left the answer more linked than its distractors on most small stories, where
    "not the least linked option" beat chance.)"""
    pairs = [(x, a) for x in range(len(answers)) for a in sorted(answers[x])
             if sum(degree[c] == degree[a] for c in pools[x]) >= k]
    if not pairs:
        return None
    x, ans = pairs[int(rng.integers(len(pairs)))]
    same = sorted(c for c in pools[x] if degree[c] == degree[ans])
    key = {c: (c not in near[x], rng.random()) for c in same}
    return x, ans, sorted(same, key=key.get)[:k]


def _question(rng, qtype, parents, children, starts, n):
    """``(x, y, options, answer, trace)`` as node ids / names, or None when the graph
    cannot pose this type. Options of event questions never share a link with X, so
    that the words next to X in the text do not point at the answer."""
    anc = [reachable(parents, i) for i in range(n)]
    desc = [reachable(children, i) for i in range(n)]
    adj = [parents[i] | children[i] | {i} for i in range(n)]
    degree = [len(parents[i]) + len(children[i]) for i in range(n)]
    if qtype in ("cause", "effect"):
        rel, other = (anc, desc) if qtype == "cause" else (desc, anc)
        posed = _event_question(rng, [rel[i] - adj[i] for i in range(n)],
                                [set(range(n)) - rel[i] - adj[i] for i in range(n)],
                                other, degree)
        if posed is None:
            return None
        x, ans, wrong = posed
        return x, None, [ans, *wrong], ans, sorted(rel[x])
    if qtype == "order":
        by_start = {}
        for i in range(n):
            by_start.setdefault(starts[i], []).append(i)
        if len(by_start) < 4:
            return None
        opts = [_pick(rng, by_start[s], 1)[0] for s in _pick(rng, sorted(by_start), 4)]
        ans = min(opts, key=lambda i: starts[i])
        return None, None, opts, ans, sorted(opts, key=lambda i: starts[i])
    alive = [surviving(parents, i) for i in range(n)]
    dead = [set(range(n)) - alive[i] - {i} for i in range(n)]
    if qtype == "intervention":
        # (x, y) pairs of each answer by the link counts of x and y and whether x caused y;
        # the key is drawn among those both answers have, so neither how often X and Y are
        # named nor a statement linking them says anything
        by_counts: dict[str, dict] = {"yes": {}, "no": {}}
        for i in range(n):
            for a, ys in (("no", dead[i]), ("yes", desc[i] & alive[i])):
                for j in sorted(ys):
                    key = (degree[i], degree[j], i in parents[j])
                    by_counts[a].setdefault(key, []).append((i, j))
        both = sorted(set(by_counts["yes"]) & set(by_counts["no"]))
        if not both:
            return None
        ans = "no" if rng.random() < 0.5 else "yes"
        pool = by_counts[ans][both[int(rng.integers(len(both)))]]
        x, y = pool[int(rng.integers(len(pool)))]
        return x, y, ["yes", "no"], ans, sorted(dead[x])
    posed = _event_question(rng, [dead[i] - adj[i] for i in range(n)],
                            [alive[i] - adj[i] for i in range(n)], desc, degree)
    if posed is None:
        return None
    x, ans, wrong = posed
    return x, None, [ans, *wrong], ans, sorted(dead[x])


def tempocausal(n: int, seed: int = 0, n_events=(6, 8), n_links=(7, 10),
                n_distractors=(1, 2), question_types=TEMPOCAUSAL_TYPES, max_gap: int = 3,
                max_len: int = 4, paraphrase: float = 0.0,
                cot: bool = False) -> datasets.Dataset:
    """``n`` stories with one question each, question types cycling through
    ``question_types`` (a balanced set).

    Args:
      n_events: causally linked events per story (int or inclusive range, >= 4).
      n_links: causal links (edges of the DAG; at least one per non-root event).
      n_distractors: events with a span and no link.
      max_gap, max_len: an effect starts 1..max_gap after its latest cause; spans last
        1..max_len.
      paraphrase: the probability that one statement of a story is told in other words
        (``"kol ran from 3 until 6 ."``, ``"mip led to kol ."``), outside the canonical
        grammar that a strict parser reads (the ``paraphrased`` column marks those stories).
      cot: the completion writes ``trace`` before the answer line.

    Columns: the common ones plus ``question_type``, ``question``, ``options``
    (list[str]), ``answer_index``, ``statements`` (list[str], narrative order), ``events``
    (names, topological order of the generating DAG, then distractors), ``parents``
    (list[list[int]] into ``events``), ``starts``, ``ends``, ``x`` and ``y`` (queried
    events, "" when none) and ``trace`` (space-separated names, or ``name start`` pairs
    for ``order``) and ``paraphrased``.
    """
    check_n(n, seed)
    e_rng = as_range("n_events", n_events, 4, 40)
    l_rng = as_range("n_links", n_links, 1)
    d_rng = as_range("n_distractors", n_distractors, 0, 20)
    if not question_types or any(q not in TEMPOCAUSAL_TYPES for q in question_types):
        raise ValueError(f"question_types={question_types!r}; expected a non-empty subset of "
                         f"{TEMPOCAUSAL_TYPES}")
    if e_rng[1] + d_rng[1] > len(EVENT_NAMES):
        raise ValueError(f"n_events + n_distractors can reach {e_rng[1] + d_rng[1]}; at most "
                         f"{len(EVENT_NAMES)} event names exist")
    if not isinstance(paraphrase, (int, float)) or not 0.0 <= paraphrase <= 1.0:
        raise ValueError(f"paraphrase={paraphrase!r}; expected a probability in [0, 1]")
    rng = np.random.default_rng([seed, 2727])
    rows, misses = [], 0
    while len(rows) < n:
        qtype = question_types[len(rows) % len(question_types)]
        if misses > 2000:
            raise ValueError(f"n_events={n_events!r}, n_links={n_links!r}, n_distractors="
                             f"{n_distractors!r} cannot pose {qtype!r} questions (2000 stories "
                             f"drawn in a row could not); expected larger stories")
        k, nd = draw(rng, e_rng), draw(rng, d_rng)
        parents = _dag(rng, k, draw(rng, l_rng))
        starts, ends = _times(rng, parents, max_gap, max_len)
        for _ in range(nd):
            s = int(rng.integers(0, max(starts) + 1))
            starts.append(s)
            ends.append(s + int(rng.integers(1, max_len + 1)))
            parents.append(set())
        total = k + nd
        children = [set() for _ in range(total)]
        for i, ps in enumerate(parents):
            for p in ps:
                children[p].add(i)
        posed = _question(rng, qtype, parents, children, starts, total)
        if posed is None:
            misses += 1
            continue
        misses = 0
        x, y, opts, ans, trace = posed
        names = [EVENT_NAMES[int(i)] for i in rng.choice(len(EVENT_NAMES), total, replace=False)]
        statements = [span_statement(names[i], starts[i], ends[i]) for i in range(total)]
        statements += [link_statement(names[p], names[i]) for i in range(total)
                       for p in sorted(parents[i])]
        statements = [statements[int(i)] for i in rng.permutation(len(statements))]
        paraphrased = bool(rng.random() < paraphrase)
        if paraphrased:
            k = int(rng.integers(len(statements)))
            w = statements[k].split()
            statements[k] = (f"{w[0]} ran from {w[3]} until {w[5]} ." if w[1] == "lasted"
                             else f"{w[0]} led to {w[2]} .")
        options = [o if isinstance(o, str) else names[o] for o in opts]
        answer = ans if isinstance(ans, str) else names[ans]
        order = rng.permutation(len(options)) if qtype != "intervention" else np.arange(2)
        options = [options[int(i)] for i in order]
        question = QUESTIONS[qtype].format(x=names[x] if x is not None else "",
                                           y=names[y] if y is not None else "")
        trace_text = " ".join(f"{names[i]} {starts[i]}" if qtype == "order" else names[i]
                              for i in trace)
        prompt = " ".join(statements) + f"\nQ: {question} options: {' '.join(options)}\n"
        completion = (f"{trace_text} ;\n" if cot else "") + answer_line(answer)
        rows.append({
            "prompt": prompt, "completion": completion, "answer": answer,
            "difficulty": len(trace), "task": "tempocausal", "question_type": qtype,
            "question": question, "options": options, "answer_index": options.index(answer),
            "statements": statements, "events": names,
            "parents": [sorted(int(p) for p in ps) for ps in parents],
            "starts": starts, "ends": ends, "x": names[x] if x is not None else "",
            "y": names[y] if y is not None else "", "trace": trace_text,
            "paraphrased": paraphrased,
        })
    return to_dataset(rows)


SHORTCUTS = ("majority", "first_mentioned", "last_mentioned", "overlap", "most_linked",
             "least_linked")


def _mentions(statements):
    first, degree, links = {}, {}, []
    for k, s in enumerate(statements):
        words = s.split()
        is_link = words[1] in ("caused", "led")
        for w in (words[0], words[-2]) if is_link else (words[0],):
            first.setdefault(w, k)
            if is_link:
                degree[w] = degree.get(w, 0) + 1
        if is_link:
            links.append({words[0], words[-2]})
    return first, degree, links


def shortcut_answer(row: dict, name: str, majority: dict | None = None) -> str:
    """The answer of shortcut heuristic ``name`` (:data:`SHORTCUTS`) on one row.

    ``first_mentioned`` / ``last_mentioned``: the option named earliest / latest in the
    narrative (its first mention; ``yes`` / ``no`` questions: ``yes`` when Y is named
    before X); ``overlap``: the option sharing the most statements with the question's
    events (``no`` when X and Y share one); ``most_linked`` / ``least_linked``: the
    option in the most / fewest links (``no`` when Y has more / fewer links than X);
    ``majority``: ``majority[type]``, the
    most frequent answer position of the type (from a training split).
    """
    opts = row["options"]
    first, degree, links = _mentions(row["statements"])
    qt, x, y = row["question_type"], row["x"], row["y"]
    if name == "majority":
        return opts[min((majority or {}).get(qt, 0), len(opts) - 1)]
    if qt == "intervention":
        if name == "first_mentioned":
            return "yes" if first.get(y, 0) < first.get(x, 0) else "no"
        if name == "last_mentioned":
            return "yes" if first.get(y, 0) > first.get(x, 0) else "no"
        if name == "overlap":
            return "no" if {x, y} in links else "yes"
        if name == "most_linked":
            return "no" if degree.get(y, 0) > degree.get(x, 0) else "yes"
        if name == "least_linked":
            return "no" if degree.get(y, 0) < degree.get(x, 0) else "yes"
    key = {"first_mentioned": lambda o: first.get(o, 0),
           "last_mentioned": lambda o: -first.get(o, 0),
           "overlap": lambda o: -sum(1 for lk in links if o in lk and x in lk),
           "most_linked": lambda o: -degree.get(o, 0),
           "least_linked": lambda o: degree.get(o, 0)}
    if name not in key:
        raise ValueError(f"shortcut={name!r} is unknown; expected one of {SHORTCUTS}")
    return min(opts, key=key[name])


def shortcut_baselines(rows, seed: int = 0) -> dict[str, dict[str, float]]:
    """Accuracy of every :data:`SHORTCUTS` heuristic per question type (and ``"all"``) on
    a held-out half of ``rows`` (the majority answer position is fitted on the other half),
    plus ``chance`` (``1 / len(options)``)."""
    rows = rows.to_list() if hasattr(rows, "to_list") else list(rows)
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} rows; expected at least 4 to fit and score shortcuts")
    order = np.random.default_rng([seed, 27]).permutation(len(rows))
    train = [rows[int(i)] for i in order[: len(rows) // 2]]
    test = [rows[int(i)] for i in order[len(rows) // 2:]]
    counts: dict[str, dict[int, int]] = {}
    for r in train:
        c = counts.setdefault(r["question_type"], {})
        c[r["answer_index"]] = c.get(r["answer_index"], 0) + 1
    majority = {qt: max(c, key=c.get) for qt, c in counts.items()}
    hits: dict[str, dict[str, list]] = {}
    for r in test:
        for group in (r["question_type"], "all"):
            h = hits.setdefault(group, {name: [] for name in (*SHORTCUTS, "chance")})
            for name in SHORTCUTS:
                h[name].append(shortcut_answer(r, name, majority) == r["answer"])
            h["chance"].append(1 / len(r["options"]))
    return {g: {k: float(np.mean(v)) for k, v in h.items()} for g, h in hits.items()}
