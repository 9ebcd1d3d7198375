"""Questions over a construction, answer-verified chains of thought, the verifier.

Question types: ``length``, ``angle``, ``perimeter``, ``area``, ``shaded``
(the area of a region inside one object and outside another it contains) and
``ratio`` (of two lengths or two areas). A question's difficulty is the
derivation depth of what it asks about (the deepest construction step it
depends on) plus one for the composite types (shaded, ratio); the strata are
``easy`` (0-1), ``medium`` (2) and ``hard`` (3 and more).

Each question has two statements: ``question`` states everything in text
(the given integer coordinates and every construction step), while
``question_diagram`` leaves the coordinates and the shaded region to the
figure, which labels each given point with its coordinates: it can only be
answered from the diagram.

The chain of thought is the solver's derivation (each construction step's
computation, then the measurement) ending in ``Answer: <exact value>``; it is
kept only if :func:`verify` accepts its own final answer.

:func:`verify` is an exact-match check that accepts equivalent forms: an
exact prediction (``2*sqrt(5)``, ``√20``, ``\\frac{25\\pi}{4}``, ``25pi/4``)
must equal the answer symbolically; a decimal one must be within ``rtol``
(relative). :func:`reward` maps it over completions for the RL learner.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import numpy as np
import sympy as sp
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from lab.methods.geosym import geometry as g
from lab.methods.geosym import solver
from lab.methods.geosym.grammar import Construction

QUESTION_TYPES = ("length", "angle", "perimeter", "area", "shaded", "ratio")
STRATA = ("easy", "medium", "hard")


def stratum(difficulty: int) -> str:
    return "easy" if difficulty <= 1 else "medium" if difficulty == 2 else "hard"


@dataclass
class Question:
    kind: str
    quantity: tuple
    difficulty: int
    question: str
    question_diagram: str
    answer: str
    value: float
    cot: str
    rel_error: float


def _depth_of_points(c: Construction, names) -> int:
    return max(c.points[n].depth for n in names)


def _shape_depth(c: Construction, name: str) -> int:
    s = c.shapes[name]
    return max(s.depth, _depth_of_points(c, s.points))


def quantity_depth(c: Construction, q: tuple) -> int:
    kind = q[0]
    if kind in ("length",):
        return _depth_of_points(c, q[1:])
    if kind == "angle":
        return _depth_of_points(c, q[1:])
    if kind in ("radius", "perimeter", "area"):
        return _shape_depth(c, q[1])
    if kind == "shaded":
        return max(_shape_depth(c, q[1]), _shape_depth(c, q[2])) + 1
    if kind == "ratio":
        return max(quantity_depth(c, q[1]), quantity_depth(c, q[2])) + 1
    raise ValueError(f"quantity {q!r}: unknown kind")


def candidates(c: Construction) -> dict[str, list[tuple]]:
    """Every quantity of each type that the construction defines."""
    out: dict[str, list[tuple]] = {k: [] for k in QUESTION_TYPES}
    segs = []
    for s in c.shapes.values():
        if s.kind == "segment":
            segs.append(tuple(s.points))
        elif s.kind != "circle":
            n = len(s.points)
            segs += [(s.points[i], s.points[(i + 1) % n]) for i in range(n)]
    segs = list(dict.fromkeys(tuple(sorted(p)) for p in segs))
    out["length"] = [("length", *p) for p in segs]
    out["length"] += [("radius", s.name) for s in c.shapes.values() if s.kind == "circle"]
    marked = {(a, b, cc) for a, b, cc in c.right_angles} | {(cc, b, a) for a, b, cc in
                                                           c.right_angles}
    angles = []
    trivial = set()  # a square's or rectangle's corners: 90 degrees by name
    for s in c.shapes.values():
        if s.kind in ("triangle", "quadrilateral", "polygon"):
            n = len(s.points)
            corners = [(s.points[i - 1], s.points[i], s.points[(i + 1) % n]) for i in range(n)]
            if s.role in ("square", "rectangle"):
                trivial |= set(corners) | {t[::-1] for t in corners}
            else:
                angles += corners
            if s.role.startswith("regular") and n >= 5:  # inscribed angles, k * 180 / n
                angles += [(s.points[i], s.points[0], s.points[k]) for i in range(1, n - 1)
                           for k in range(i + 1, n)]
    ends: dict[str, list[str]] = {}
    for a, b in segs:
        ends.setdefault(a, []).append(b)
        ends.setdefault(b, []).append(a)
    for b, others in ends.items():  # angles between two drawn segments at a common end
        for i, a in enumerate(others):
            for cc in others[i + 1:]:
                angles.append((a, b, cc))
    angles = [t for t in dict.fromkeys(angles) if t not in marked and t not in trivial]
    out["angle"] = [("angle", *t) for t in angles]
    closed = [s.name for s in c.shapes.values() if s.kind != "segment"]
    out["perimeter"] = [("perimeter", n) for n in closed]
    out["area"] = [("area", n) for n in closed]
    out["shaded"] = [("shaded", o, i) for o, i in c.contains]
    lengths = [q for q in out["length"]]
    areas = out["area"]
    out["ratio"] = ([("ratio", a, b) for a in areas for b in areas if a != b]
                    + [("ratio", a, b) for a in lengths for b in lengths if a != b])
    return out


def _ask(c: Construction, q: tuple, diagram: bool) -> str:
    if q[0] == "shaded" and not diagram:
        o, i = c.shapes[q[1]], c.shapes[q[2]]
        return (f"The shaded region is the part of {o.label} outside {i.label}. "
                "Find its area. Give the exact value.")
    what = solver.describe(c, q)
    return f"Find {what}. Give the exact value."


def _half_degree(c: Construction, q: tuple) -> bool:
    v = float(solver.evaluate(c, q, g.FLOAT))
    return abs(v - round(v * 2) / 2) < 1e-7


def make_question(c: Construction, rng: random.Random, *, kind: str | None = None,
                  timeout: float = 2.0, max_ops: int = 40, stats: dict | None = None,
                  max_tries: int = 12, right_angle_drop: float = 0.7) -> Question | None:
    """A verified question about ``c`` (``None`` if none of ``max_tries`` candidates solves).

    ``stats`` counts ``timeouts``, ``inexact`` and ``unsuitable`` (dropped candidates).
    An angle of 90 degrees is skipped with probability ``right_angle_drop`` so that
    unmarked right angles (Thales, squares) do not make "90" the majority answer.
    """
    stats = stats if stats is not None else {}
    cands = candidates(c)
    cands["angle"] = [q for q in cands["angle"] if _half_degree(c, q)]  # cheap float filter
    kinds = [k for k in QUESTION_TYPES if cands[k]] if kind is None else [kind]
    for _ in range(max_tries):
        if not kinds:
            return None
        k = rng.choice(kinds)
        if not cands[k]:
            kinds.remove(k)
            continue
        weights = [1.0 + quantity_depth(c, q) for q in cands[k]]
        q = rng.choices(cands[k], weights)[0]
        try:
            sol = solver.solve(c, q, timeout=timeout, max_ops=max_ops)
        except solver.SolverTimeout:
            stats["timeouts"] = stats.get("timeouts", 0) + 1
            cands[k].remove(q)
            continue
        except solver.Inexact:
            stats["inexact"] = stats.get("inexact", 0) + 1
            cands[k].remove(q)
            continue
        except solver.Unsuitable:
            stats["unsuitable"] = stats.get("unsuitable", 0) + 1
            cands[k].remove(q)
            continue
        if q[0] == "ratio" and sol.exact == 1:
            cands[k].remove(q)
            continue
        if q[0] == "angle" and sol.exact == 90 and rng.random() < right_angle_drop:
            cands[k].remove(q)  # unmarked right angles (Thales, squares) would dominate
            continue
        qk = "length" if q[0] == "radius" else q[0]
        full = " ".join(s.statement for s in c.steps) + " " + _ask(c, q, False)
        short = ("In the figure, " + " ".join(s.short for s in c.steps) + " "
                 + _ask(c, q, True))
        cot = chain_of_thought(c, sol)
        if not verify(extract_answer(cot), sol.answer):
            stats["unverified"] = stats.get("unverified", 0) + 1
            cands[k].remove(q)
            continue
        return Question(qk, q, quantity_depth(c, q), full, short, sol.answer, sol.numeric, cot,
                        sol.rel_error)
    return None


def chain_of_thought(c: Construction, sol: solver.Solution) -> str:
    lines = [s.derivation for s in c.steps] + sol.steps + [f"Answer: {sol.answer}"]
    return "\n".join(lines)


# ======================================================================== verifier
_ANSWER_RE = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*(.+)", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")
_ALLOWED = re.compile(r"^[0-9a-z+\-*/().,\s]*$")
_NAMES = {"sqrt": sp.sqrt, "pi": sp.pi}
_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion: the last ``\\boxed{...}``, else the last ``Answer:``."""
    if completion is None:
        return None
    boxed = _BOXED_RE.findall(completion)
    if boxed:
        return boxed[-1]
    found = None
    for line in completion.splitlines():
        m = _ANSWER_RE.search(line)
        if m:
            found = m.group(1)
    return found


def _latex_to_plain(s: str) -> str:
    s = s.replace("\\left", "").replace("\\right", "").replace("\\,", "").replace("\\!", "")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", " pi ")
    for _ in range(4):
        s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = re.sub(r"\\sqrt\s*(\d+)", r"sqrt(\1)", s)
    return s.replace("{", "(").replace("}", ")")


def parse(text: str | None):
    """A sympy number from an answer string, or ``None`` if it is not one.

    Accepts sympy / Python syntax, ``^``, implicit products (``2sqrt(5)``,
    ``25pi/4``), ``√``, ``π``, a trailing unit (``degrees``, ``°``) and
    simple LaTeX (``\\frac``, ``\\sqrt``, ``\\pi``). Only numbers, ``sqrt`` and
    ``pi`` are allowed.
    """
    if text is None:
        return None
    s = str(text).strip().strip("$").strip()
    if not s or len(s) > 200:
        return None
    s = _latex_to_plain(s)
    s = s.replace("π", " pi ").replace("×", "*").replace("·", "*").replace("−", "-")
    s = re.sub(r"√\s*\(", "sqrt(", s)
    s = re.sub(r"√\s*(\d+(?:\.\d+)?)", r"sqrt(\1)", s)
    s = re.sub(r"(°|\bdegrees?\b|\bdeg\b|\bunits?\b|\bsquare\b)", " ", s, flags=re.IGNORECASE)
    s = s.strip().rstrip(".").strip().lower().replace("^", "**")
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    if not s or not _ALLOWED.match(s) or "," in s:
        return None
    for word in re.findall(r"[a-z]+", s):
        if word not in _NAMES:
            return None
    if "**" in s.replace(" ", "") and re.search(r"\*\*\s*\(?\s*\d{3,}", s):
        return None  # no huge powers
    try:
        expr = parse_expr(s, local_dict=dict(_NAMES), global_dict={
            "Integer": sp.Integer, "Float": sp.Float, "Rational": sp.Rational,
            "Symbol": sp.Symbol, "Mul": sp.Mul, "Add": sp.Add, "Pow": sp.Pow},
            transformations=_TRANSFORMS, evaluate=True)
    except Exception:  # noqa: BLE001 (any parse failure means "not a number")
        return None
    if not isinstance(expr, sp.Expr) or expr.free_symbols:
        return None
    return expr


def verify(prediction: str | None, answer: str, rtol: float = 1e-4) -> bool:
    """Whether ``prediction`` equals the exact ``answer``.

    An exact prediction (no decimal point) must be symbolically equal; a
    decimal one must be within ``rtol`` relative. Unparseable predictions fail.
    """
    target = parse(answer)
    if target is None:
        raise ValueError(f"verify: answer {answer!r} is not an exact number")
    pred = parse(prediction)
    if pred is None:
        return False
    try:
        tv, pv = complex(sp.N(target, 20)), complex(sp.N(pred, 20))
    except (TypeError, ValueError):
        return False
    if abs(pv.imag) > 1e-12:
        return False
    scale = max(abs(tv), 1e-12)
    if pred.has(sp.Float):
        return abs(pv.real - tv.real) <= rtol * scale
    if abs(pv.real - tv.real) > 1e-9 * scale:
        return False
    try:
        with solver.time_limit(1.0):
            return bool(solver.is_zero(pred - target))
    except solver.SolverTimeout:
        return abs(pv.real - tv.real) <= 1e-15 * scale


def reward(completions, answers, rtol: float = 1e-4) -> np.ndarray:
    """``1.0`` where a completion's final answer verifies against its answer, else ``0.0``.

    The exact-match reward for RL from verifiable rewards: ``completions`` and
    ``answers`` are equal-length sequences of strings; returns ``float32 [n]``.
    """
    completions, answers = list(completions), list(answers)
    if len(completions) != len(answers):
        raise ValueError(f"reward: {len(completions)} completions but {len(answers)} answers")
    return np.array([float(verify(extract_answer(c), a, rtol)) for c, a in
                     zip(completions, answers, strict=True)], np.float32)
