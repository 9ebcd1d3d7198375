"""Plane geometry written once over two number systems: exact (sympy) and float.

Every construction step and every measured quantity is a function of an
``Ops`` (the arithmetic) and point coordinates; the grammar evaluates each one
with :data:`EXACT` (sympy radicals and pi) and, separately, with :data:`FLOAT`
(Python floats from the same integer parameters), so that the float value is an
independent check of the exact one (the cross-check of
:func:`lab.methods.geosym.solver.solve`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import sympy as sp


@dataclass(frozen=True)
class Ops:
    """The arithmetic a geometry function runs on."""

    name: str
    sqrt: Any
    cos: Any
    sin: Any
    pi: Any
    const: Any  # int / (p, q) -> a number of this system

    @property
    def exact(self) -> bool:
        return self.name == "exact"


def _exact_const(p, q=1):
    return sp.Rational(p, q)


def _float_const(p, q=1):
    return p / q


EXACT = Ops("exact", sp.sqrt, sp.cos, sp.sin, sp.pi, _exact_const)
FLOAT = Ops("float", math.sqrt, math.cos, math.sin, math.pi, _float_const)


def simplify(x):
    """A cheap canonical form of an exact coordinate or length (radicals rationalised)."""
    if isinstance(x, float):
        return x
    return sp.radsimp(sp.expand(x))


def sub(a, b):
    return (a[0] - b[0], a[1] - b[1])


def add(a, b):
    return (a[0] + b[0], a[1] + b[1])


def scale(a, k):
    return (a[0] * k, a[1] * k)


def dot(a, b):
    return a[0] * b[0] + a[1] * b[1]


def cross(a, b):
    return a[0] * b[1] - a[1] * b[0]


def rot90(a):
    return (-a[1], a[0])


def dist(ops: Ops, a, b):
    d = sub(a, b)
    return ops.sqrt(dot(d, d))


def midpoint(ops: Ops, a, b):
    half = ops.const(1, 2)
    return ((a[0] + b[0]) * half, (a[1] + b[1]) * half)


def foot(ops: Ops, p, a, b):
    """The foot of the perpendicular from ``p`` to line ``ab``."""
    ab = sub(b, a)
    t = dot(sub(p, a), ab) / dot(ab, ab)
    return add(a, scale(ab, t))


def signed_area(points):
    """The shoelace formula: the signed area of a polygon (counter-clockwise positive)."""
    s = 0
    n = len(points)
    for i in range(n):
        s = s + cross(points[i], points[(i + 1) % n])
    return s / 2


def circumcenter(ops: Ops, a, b, c):
    d = 2 * (a[0] * (b[1] - c[1]) + b[0] * (c[1] - a[1]) + c[0] * (a[1] - b[1]))
    a2, b2, c2 = dot(a, a), dot(b, b), dot(c, c)
    ux = (a2 * (b[1] - c[1]) + b2 * (c[1] - a[1]) + c2 * (a[1] - b[1])) / d
    uy = (a2 * (c[0] - b[0]) + b2 * (a[0] - c[0]) + c2 * (b[0] - a[0])) / d
    return (ux, uy)


def incenter(ops: Ops, a, b, c):
    la, lb, lc = dist(ops, b, c), dist(ops, c, a), dist(ops, a, b)
    s = la + lb + lc
    return ((la * a[0] + lb * b[0] + lc * c[0]) / s, (la * a[1] + lb * b[1] + lc * c[1]) / s)


def inradius(ops: Ops, a, b, c, sign):
    """``2 * area / perimeter``; ``sign`` (+1 / -1) is the orientation of ``abc``."""
    per = dist(ops, b, c) + dist(ops, c, a) + dist(ops, a, b)
    return 2 * sign * signed_area([a, b, c]) / per


def bisector_foot(ops: Ops, a, b, c):
    """Where the bisector of the angle at ``a`` meets ``bc``: ``BD / DC = AB / AC``."""
    lb, lc = dist(ops, c, a), dist(ops, a, b)
    return ((lb * b[0] + lc * c[0]) / (lb + lc), (lb * b[1] + lc * c[1]) / (lb + lc))


def rotate(ops: Ops, v, k: int, n: int):
    """``v`` turned by ``2 pi k / n`` (exact: sympy evaluates these cosines as radicals)."""
    phi = 2 * ops.pi * k / n if not ops.exact else 2 * sp.pi * sp.Rational(k, n)
    c, s = ops.cos(phi), ops.sin(phi)
    return (v[0] * c - v[1] * s, v[0] * s + v[1] * c)


def cos_angle(ops: Ops, a, b, c):
    """The cosine of the angle ``abc`` (at ``b``)."""
    u, v = sub(a, b), sub(c, b)
    return dot(u, v) / (ops.sqrt(dot(u, u)) * ops.sqrt(dot(v, v)))


def to_float(p) -> tuple[float, float]:
    return (float(p[0]), float(p[1]))
