"""SymGT: exact answers with sympy, each cross-checked by a float evaluation.

A *quantity* is a tuple naming what is measured in a construction::

    ("length", "A", "B")          ("radius", "c1")         ("angle", "A", "B", "C")
    ("perimeter", "ABC")          ("area", "c1")           ("shaded", "c1", "ABC")
    ("ratio", q1, q2)             # q1, q2 are quantities

:func:`solve` evaluates it once with sympy from the exact coordinates (radicals
and pi) and once with floats from the float coordinates (the two are computed
independently, see :mod:`.geometry`), simplifies the exact value under a
per-problem time limit, and accepts it only if ``|exact - float| <= rtol *
|float|`` (``rtol = 1e-9``). Angles are answered in degrees and only when the
angle is a whole or half number of degrees, proved exactly (``cos(d * pi /
180)`` minus the exact cosine simplifies to 0). A problem that runs out of time
raises :class:`SolverTimeout`; one whose values disagree raises
:class:`Inexact`; the dataset drops both and counts them (and skips, without
counting as a failure, quantities that are :class:`Unsuitable` to ask), so no answer that was
not checked is ever emitted.

The time limit counts the process's CPU time (``ITIMER_VIRTUAL`` /
``SIGVTALRM``, POSIX, main thread of a process, which is where the dataset's
process pool runs it), so that load from other processes does not change which
problems are dropped; elsewhere it is not enforced.
"""

from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

from lab.methods.geosym import geometry as g
from lab.methods.geosym.grammar import Construction

RTOL = 1e-9


class SolverTimeout(Exception):
    """The exact solution took longer than the per-problem limit."""


class Inexact(Exception):
    """The exact value and the float evaluation disagree (or the exact value is not real)."""


class Unsuitable(Exception):
    """A quantity not asked: zero, an angle that is not a half-integer number of degrees,
    or an exact form longer than the limit."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`SolverTimeout` after ``seconds`` of the process's CPU time in the block.

    CPU time (``ITIMER_VIRTUAL``), not wall time, so that a loaded machine drops the
    same problems as an idle one. Main thread, POSIX only; elsewhere not enforced.
    """
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def handler(signum, frame):
        raise SolverTimeout(f"exact solution exceeded {seconds} s of CPU time")

    old = signal.signal(signal.SIGVTALRM, handler)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, old)


@dataclass
class Solution:
    quantity: tuple
    exact: Any  # a sympy expression
    numeric: float  # the float evaluation of the construction
    rel_error: float
    steps: list[str] = field(default_factory=list)

    @property
    def answer(self) -> str:
        return sp.sstr(self.exact)


def _shape_points(c: Construction, name: str, exact: bool):
    return [c.xy(p, exact) for p in c.shapes[name].points]


def _radius(c: Construction, name: str, exact: bool):
    s = c.shapes[name]
    return s.radius_exact if exact else s.radius


def evaluate(c: Construction, q: tuple, ops: g.Ops):
    """The value of quantity ``q`` in the number system ``ops`` (angles in degrees)."""
    exact = ops.exact
    kind = q[0]
    if kind == "length":
        return g.dist(ops, c.xy(q[1], exact), c.xy(q[2], exact))
    if kind == "radius":
        return _radius(c, q[1], exact)
    if kind == "angle":
        cosv = g.cos_angle(ops, c.xy(q[1], exact), c.xy(q[2], exact), c.xy(q[3], exact))
        return cosv if exact else math.degrees(math.acos(max(-1.0, min(1.0, cosv))))
    if kind in ("perimeter", "area"):
        s = c.shapes[q[1]]
        if s.kind == "circle":
            r = _radius(c, q[1], exact)
            return 2 * ops.pi * r if kind == "perimeter" else ops.pi * r * r
        pts = _shape_points(c, q[1], exact)
        if kind == "perimeter":
            return sum((g.dist(ops, pts[i], pts[(i + 1) % len(pts)]) for i in range(len(pts))),
                       ops.const(0))
        sign = 1 if g.signed_area(_shape_points(c, q[1], False)) > 0 else -1
        return sign * g.signed_area(pts)
    if kind == "shaded":
        return evaluate(c, ("area", q[1]), ops) - evaluate(c, ("area", q[2]), ops)
    if kind == "ratio":
        return evaluate(c, q[1], ops) / evaluate(c, q[2], ops)
    raise ValueError(f"quantity {q!r}: expected a kind in length, radius, angle, perimeter, "
                     "area, shaded, ratio")


def canonical(x):
    """The shortest of a few simplified exact forms (``simplify``, rationalised, expanded)."""
    x = sp.nsimplify(x) if isinstance(x, float) else x
    fast = sp.radsimp(sp.expand(x))
    if sp.count_ops(fast) <= 8:  # already short: skip the costly ``simplify``
        return fast
    s = sp.simplify(x)
    forms = [sp.radsimp(s), sp.radsimp(sp.expand(s)), sp.factor(sp.radsimp(sp.expand(s)))]
    return min(forms, key=lambda f: (sp.count_ops(f), len(sp.sstr(f))))


def is_zero(x) -> bool:
    return x == 0 or sp.simplify(sp.radsimp(sp.expand(x))) == 0


def describe(c: Construction, q: tuple) -> str:
    """A noun phrase for quantity ``q`` ("the length AB", "the area of triangle ABC")."""
    kind = q[0]
    if kind == "length":
        return f"the length {q[1]}{q[2]}"
    if kind == "radius":
        return f"the radius of {c.shapes[q[1]].label}"
    if kind == "angle":
        return f"the angle {q[1]}{q[2]}{q[3]} in degrees"
    if kind == "perimeter":
        s = c.shapes[q[1]]
        return (f"the circumference of {s.label}" if s.kind == "circle"
                else f"the perimeter of {s.label}")
    if kind == "area":
        return f"the area of {c.shapes[q[1]].label}"
    if kind == "shaded":
        return "the area of the shaded region"
    if kind == "ratio":
        return f"the ratio of {describe(c, q[1])} to {describe(c, q[2])}"
    raise ValueError(f"quantity {q!r}: unknown kind")


def _steps(c: Construction, q: tuple, exact) -> list[str]:
    kind = q[0]
    val = sp.sstr(exact)
    if kind == "length":
        a, b = c.points[q[1]].exact, c.points[q[2]].exact
        dx, dy = sp.sstr(g.simplify(b[0] - a[0])), sp.sstr(g.simplify(b[1] - a[1]))
        return [f"{q[1]}{q[2]} = sqrt(({dx})^2 + ({dy})^2) = {val}."]
    if kind == "radius":
        return [f"The radius of {c.shapes[q[1]].name} is {val}."]
    if kind == "angle":
        return [f"cos({q[1]}{q[2]}{q[3]}) = ({q[2]}{q[1]} . {q[2]}{q[3]}) / (|{q[2]}{q[1]}| "
                f"|{q[2]}{q[3]}|), so the angle {q[1]}{q[2]}{q[3]} is {val} degrees."]
    if kind in ("perimeter", "area"):
        s = c.shapes[q[1]]
        if s.kind == "circle":
            r = sp.sstr(s.radius_exact)
            f = "2 * pi * r" if kind == "perimeter" else "pi * r^2"
            return [f"With r = {r}, {describe(c, q)} is {f} = {val}."]
        if kind == "perimeter":
            pts = s.points
            sides = [f"{pts[i]}{pts[(i + 1) % len(pts)]}" for i in range(len(pts))]
            return [f"The perimeter of {s.name} is {' + '.join(sides)} = {val}."]
        return [f"By the shoelace formula the area of {s.name} is {val}."]
    if kind == "shaded":
        outer, inner = (sp.sstr(g.simplify(evaluate(c, ("area", n), g.EXACT))) for n in q[1:])
        return [f"The shaded region is {c.shapes[q[1]].label} minus {c.shapes[q[2]].label}: "
                f"{outer} - ({inner}) = {val}."]
    if kind == "ratio":
        a, b = (sp.sstr(_part(c, sub)) for sub in q[1:])
        return [f"{describe(c, q[1]).capitalize()} is {a} and {describe(c, q[2])} is {b}; "
                f"the ratio is {val}."]
    return []


def _part(c: Construction, q: tuple):
    if q[0] == "angle":
        return _exact_angle(c, q, float(evaluate(c, q, g.FLOAT)))
    return g.simplify(evaluate(c, q, g.EXACT))


def _exact_angle(c: Construction, q: tuple, numeric: float):
    half = round(numeric * 2) / 2
    if abs(numeric - half) > 1e-7:
        raise Unsuitable(f"angle {q[1:]} = {numeric:.6f} degrees is not a half-integer")
    deg = sp.Rational(int(round(half * 2)), 2)
    cosv = evaluate(c, q, g.EXACT)
    if not is_zero(sp.cos(sp.pi * deg / 180) - cosv):
        raise Inexact(f"angle {q[1:]}: cos({deg} deg) is not proved equal to {cosv}")
    return deg


def solve(c: Construction, q: tuple, *, timeout: float | None = 2.0, rtol: float = RTOL,
          max_ops: int | None = None) -> Solution:
    """The exact value of ``q`` in ``c``, checked against the float evaluation.

    Raises :class:`SolverTimeout` after ``timeout`` seconds, :class:`Inexact`
    when the two evaluations disagree beyond ``rtol`` (relative), and
    :class:`Unsuitable` when the value is 0, an angle is not a half-integer number
    of degrees, or the simplified form has more than ``max_ops`` operations.
    """
    with time_limit(timeout):
        numeric = float(evaluate(c, q, g.FLOAT))
        if not math.isfinite(numeric) or abs(numeric) < 1e-12:
            raise Unsuitable(f"{q}: value {numeric} is zero or not finite")
        if q[0] == "angle":
            exact = _exact_angle(c, q, numeric)
        else:
            exact = canonical(evaluate(c, q, g.EXACT))
        if max_ops is not None and sp.count_ops(exact) > max_ops:
            raise Unsuitable(f"{q}: exact form {exact} has more than {max_ops} operations")
        approx = complex(sp.N(exact, 30))
        if abs(approx.imag) > 1e-12 * max(1.0, abs(approx.real)):
            raise Inexact(f"{q}: exact value {exact} is not real")
        rel = abs(approx.real - numeric) / abs(numeric)
        if not rel <= rtol:
            raise Inexact(f"{q}: exact {exact} = {approx.real!r} vs float {numeric!r} "
                          f"(relative error {rel:.3g} > {rtol})")
        steps = _steps(c, q, exact)
    return Solution(q, exact, numeric, rel, steps)
