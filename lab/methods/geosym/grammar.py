"""A type-conditional grammar of plane constructions, seeded and reproducible.

Objects have types (point, segment, triangle, quadrilateral, polygon, circle).
A construction starts from one *base* rule that places a typed object on
integer lattice points (the given data), then applies *derivation* rules, each
chosen among those defined for the type of an object already built (a
triangle's circumcircle, incircle, altitude, median, bisector, medial triangle,
side square; a segment's midpoint, perpendicular, diameter circle, side square,
equilateral triangle; a circle's concentric circle, diameter, inscribed
polygon, circumscribed square; a quadrilateral's diagonals, circumcircle,
incircle, midpoint quadrilateral; a regular polygon's circumcircle, incircle,
diagonal). This is the shape of the type-conditional grammar of Inter-GPS /
GeoQA-style synthetic engines (e.g. Kazemi et al. 2023, "GeomVerse: A Systematic
Evaluation of Large Models for Geometric Reasoning"; Zhang et al. 2024,
"MAVIS: Mathematical Visual Instruction Tuning"), with every coordinate kept
exact.

Every new point is computed twice, with sympy (:data:`~.geometry.EXACT`) and
with floats (:data:`~.geometry.FLOAT`) from the same integers. A step's depth is
one more than the deepest object it uses (base objects have depth 0); the
difficulty of a question is the depth of what it asks about.

Degenerate constructions (collinear triangle, zero radius, coincident or
nearly coincident points, slivers) raise :class:`DegenerateError`;
:func:`sample` catches it and resamples, so no degenerate construction is ever
returned, and counts the rejections.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

from lab.methods.geosym import geometry as g

LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or Oc: they read as 1 and 0
POLYGON_NAMES = {3: "equilateral triangle", 4: "square", 5: "regular pentagon",
                 6: "regular hexagon", 8: "regular octagon"}


class DegenerateError(ValueError):
    """A construction that has no well-formed picture (named in the message)."""


class Inapplicable(Exception):
    """A rule that does not apply to the chosen object (another is tried)."""


@dataclass
class Point:
    name: str
    exact: tuple[Any, Any]
    value: tuple[float, float]
    depth: int
    given: bool = False  # integer coordinates, stated in the text and labelled in the figure


@dataclass
class Shape:
    kind: str  # segment | triangle | quadrilateral | polygon | circle
    name: str
    points: tuple[str, ...]  # vertices in order; a circle's centre
    depth: int
    role: str = ""  # square, rectangle, regular hexagon, circumcircle of ABC, ...
    radius_exact: Any = None
    radius: float | None = None

    @property
    def label(self) -> str:
        if self.kind == "circle":
            return f"circle {self.name}"
        return f"{self.kind} {self.name}" if self.kind != "polygon" else f"{self.role} {self.name}"


@dataclass
class Step:
    rule: str
    depth: int
    statement: str  # the sentence of the full (text-complete) problem
    short: str  # the sentence when the figure carries the coordinates
    derivation: str  # the solver-checked computation, for the chain of thought
    outputs: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()


@dataclass
class Construction:
    points: dict[str, Point] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    right_angles: list[tuple[str, str, str]] = field(default_factory=list)  # angle at middle
    equal: list[tuple[tuple[str, str], ...]] = field(default_factory=list)  # equal segments
    contains: list[tuple[str, str]] = field(default_factory=list)  # (outer, inner) shapes
    _n_circles: int = 0

    # ----------------------------------------------------------------- building
    def fresh(self) -> str:
        for name in LETTERS:
            if name not in self.points:
                return name
        for i in range(1, 100):
            for name in LETTERS:
                if f"{name}{i}" not in self.points:
                    return f"{name}{i}"
        raise RuntimeError("out of point names")

    def given(self, name: str, x: int, y: int) -> Point:
        p = Point(name, (sp.Integer(x), sp.Integer(y)), (float(x), float(y)), 0, True)
        self.points[name] = p
        return p

    def derive(self, fn: Callable, inputs: tuple[str, ...], depth: int, name=None) -> Point:
        """A new point ``fn(ops, *input coordinates)``, evaluated exactly and in floats."""
        name = name or self.fresh()
        exact = fn(g.EXACT, *[self.points[p].exact for p in inputs])
        exact = (g.simplify(exact[0]), g.simplify(exact[1]))
        value = g.to_float(fn(g.FLOAT, *[self.points[p].value for p in inputs]))
        p = Point(name, exact, value, depth)
        self.points[name] = p
        return p

    def shape(self, kind, points, depth, role="", radius=None, name=None) -> Shape:
        if kind == "circle":
            self._n_circles += 1
            name = name or f"c{self._n_circles}"
        name = name or "".join(points)
        r_exact = r = None
        if radius is not None:
            r_exact = g.simplify(radius(g.EXACT))
            r = float(radius(g.FLOAT))
        s = Shape(kind, name, tuple(points), depth, role, r_exact, r)
        self.shapes[name] = s
        return s

    def xy(self, name: str, exact: bool = True):
        p = self.points[name]
        return p.exact if exact else p.value

    def fmt(self, name: str) -> str:
        x, y = self.points[name].exact
        return f"{name}({sp.sstr(x)}, {sp.sstr(y)})"

    # ----------------------------------------------------------------- checks
    def extent(self) -> float:
        xs, ys = [], []
        for p in self.points.values():
            xs.append(p.value[0])
            ys.append(p.value[1])
        for s in self.shapes.values():
            if s.kind == "circle":
                cx, cy = self.points[s.points[0]].value
                xs += [cx - s.radius, cx + s.radius]
                ys += [cy - s.radius, cy + s.radius]
        return max(max(xs) - min(xs), max(ys) - min(ys), 1e-12)

    def check(self, min_sep: float = 0.035, min_angle: float = 12.0) -> None:
        """Raise :class:`DegenerateError` unless every object is well formed and readable."""
        for s in self.shapes.values():
            if s.kind == "circle" and (s.radius_exact == 0 or s.radius <= 0):
                raise DegenerateError(f"circle {s.name}: zero radius")
            if s.kind in ("triangle", "quadrilateral", "polygon"):
                area = g.signed_area([self.points[p].value for p in s.points])
                # The exact test only where the float area cannot tell (lattice inputs make
                # collinear triangles exactly zero); slivers fail the angle test below.
                if abs(area) < 1e-9 and sp.simplify(
                        g.signed_area([self.points[p].exact for p in s.points])) == 0:
                    what = "collinear triangle" if s.kind == "triangle" else "zero-area"
                    raise DegenerateError(f"{s.kind} {s.name}: {what}")
                vals = [self.points[p].value for p in s.points]
                n = len(vals)
                for i in range(n):
                    c = g.cos_angle(g.FLOAT, vals[i - 1], vals[i], vals[(i + 1) % n])
                    ang = math.degrees(math.acos(max(-1.0, min(1.0, c))))
                    if ang < min_angle or ang > 180 - (min_angle if n == 3 else 1.0):
                        raise DegenerateError(
                            f"{s.kind} {s.name}: angle {ang:.1f} deg at {s.points[i]} "
                            f"(expected {min_angle} to {180 - min_angle})")
        ext = self.extent()
        names = list(self.points)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                d = math.dist(self.points[a].value, self.points[b].value)
                if d < min_sep * ext:
                    raise DegenerateError(
                        f"points {a} and {b} {'coincide' if d < 1e-9 else 'nearly coincide'} "
                        f"(distance {d:.3g}, extent {ext:.3g})")
        for s in self.shapes.values():
            if s.kind == "circle" and s.radius < min_sep * ext:
                raise DegenerateError(f"circle {s.name}: radius {s.radius:.3g} too small")

    def add_step(self, rule, depth, statement, derivation, outputs=(), inputs=(), short=None):
        self.steps.append(Step(rule, depth, statement, short or statement, derivation,
                               tuple(outputs), tuple(inputs)))


def _s(x) -> str:
    return sp.sstr(x)


def _pt(c: Construction, name: str) -> str:
    return c.fmt(name)


# ====================================================================== base rules
def _lattice(rng: random.Random, lo=0, hi=8):
    return rng.randint(lo, hi), rng.randint(lo, hi)


def base_triangle(c: Construction, rng: random.Random) -> Shape:
    names = []
    for _ in range(3):
        names.append(c.fresh())
        c.given(names[-1], *_lattice(rng))
    t = c.shape("triangle", names, 0, role="triangle")
    given = ", ".join(_pt(c, p) for p in names)
    c.add_step("triangle", 0, f"Triangle {t.name} has vertices {given}.", f"Given {given}.",
               [t.name], short=f"{t.name} is a triangle.")
    return t


def base_right_triangle(c: Construction, rng: random.Random) -> Shape:
    x, y = _lattice(rng, 0, 3)
    a, b = rng.randint(2, 8), rng.randint(2, 8)
    sx, sy = rng.choice([1, -1]), rng.choice([1, -1])
    A = c.fresh()
    c.given(A, x, y)
    B = c.fresh()
    c.given(B, x + sx * a, y)
    C = c.fresh()
    c.given(C, x, y + sy * b)
    t = c.shape("triangle", [A, B, C], 0, role="right triangle")
    c.right_angles.append((B, A, C))
    given = ", ".join(_pt(c, p) for p in (A, B, C))
    c.add_step("right_triangle", 0, f"Right triangle {t.name} has vertices {given}.",
               f"Given {given}; the legs {A}{B} and {A}{C} are perpendicular.", [t.name],
               short=f"{t.name} is a right triangle with the right angle at {A}.")
    return t


def base_segment(c: Construction, rng: random.Random) -> Shape:
    A = c.fresh()
    c.given(A, *_lattice(rng))
    B = c.fresh()
    c.given(B, *_lattice(rng))
    s = c.shape("segment", [A, B], 0)
    c.add_step("segment", 0, f"Segment {s.name} joins {_pt(c, A)} and {_pt(c, B)}.",
               f"Given {_pt(c, A)}, {_pt(c, B)}.", [s.name], short=f"{s.name} is a segment.")
    return s


def _quad(c: Construction, rng: random.Random, kind: str) -> Shape:
    x, y = _lattice(rng, 0, 4)
    p, q = rng.randint(1, 6), rng.randint(-3, 3)
    v = (p, q)
    if kind == "square":
        w = (-q, p)
    elif kind == "rectangle":
        k = math.gcd(p, q) or 1
        m = rng.choice([1, 2, 3])
        w = (-q // k * m, p // k * m)
        if w[0] ** 2 + w[1] ** 2 == p * p + q * q:
            raise DegenerateError(f"rectangle with sides {v} and {w} is a square")
    else:
        w = (rng.randint(-3, 3), rng.randint(1, 6))
    A = c.fresh()
    c.given(A, x, y)
    B = c.fresh()
    c.given(B, x + v[0], y + v[1])
    C = c.fresh()
    c.given(C, x + v[0] + w[0], y + v[1] + w[1])
    D = c.fresh()
    c.given(D, x + w[0], y + w[1])
    s = c.shape("quadrilateral", [A, B, C, D], 0, role=kind)
    if kind in ("square", "rectangle"):
        c.right_angles.append((D, A, B))
    given = ", ".join(_pt(c, n) for n in (A, B, C, D))
    c.add_step(kind, 0, f"{kind.capitalize()} {s.name} has vertices {given}.", f"Given {given}.",
               [s.name], short=f"{s.name} is a {kind}.")
    return s


def base_square(c, rng):
    return _quad(c, rng, "square")


def base_rectangle(c, rng):
    return _quad(c, rng, "rectangle")


def base_parallelogram(c, rng):
    return _quad(c, rng, "parallelogram")


def base_circle(c: Construction, rng: random.Random) -> Shape:
    Oc = c.fresh()
    ox, oy = _lattice(rng, 0, 6)
    c.given(Oc, ox, oy)
    v = rng.choice([(rng.randint(0, 5), 0), (0, rng.randint(0, 5)), (3, 4), (4, 3), (1, 2),
                    (2, 2), (1, 3)])
    P = c.fresh()
    c.given(P, ox + v[0], oy + v[1])
    circ = c.shape("circle", [Oc], 0, role="circle",
                   radius=lambda ops: g.dist(ops, c.xy(Oc, ops.exact), c.xy(P, ops.exact)))
    c.add_step("circle", 0,
               f"Circle {circ.name} has centre {_pt(c, Oc)} and passes through {_pt(c, P)}.",
               f"Given {_pt(c, Oc)}, {_pt(c, P)}; the radius is {Oc}{P} = {_s(circ.radius_exact)}.",
               [circ.name], short=f"{circ.name} is the circle with centre {Oc} through {P}.")
    return circ


def base_regular_polygon(c: Construction, rng: random.Random) -> Shape:
    n = rng.choice([3, 5, 6, 8])
    Oc = c.fresh()
    ox, oy = _lattice(rng, 0, 6)
    c.given(Oc, ox, oy)
    v = rng.choice([(3, 0), (4, 0), (0, 3), (3, 4), (2, 2), (5, 0)])
    A = c.fresh()
    c.given(A, ox + v[0], oy + v[1])
    names = [A]
    for k in range(1, n):
        names.append(c.derive(lambda ops, o, a, k=k: g.add(o, g.rotate(ops, g.sub(a, o), k, n)),
                              (Oc, A), 0).name)
    role = POLYGON_NAMES[n]
    poly = c.shape("polygon" if n != 3 else "triangle", names, 0, role=role)
    c.points[Oc].depth = 0
    c.add_step("regular_polygon", 0,
               f"{role.capitalize()} {poly.name} has centre {_pt(c, Oc)} and vertex {_pt(c, A)}.",
               f"Given {_pt(c, Oc)}, {_pt(c, A)}; each vertex is {A} turned about {Oc} by a "
               f"multiple of 360/{n} degrees: "
               + ", ".join(_pt(c, p) for p in names[1:]) + ".",
               [poly.name], short=f"{poly.name} is a {role} with centre {Oc}.")
    return poly


BASE_RULES: dict[str, Callable] = {
    "triangle": base_triangle, "right_triangle": base_right_triangle, "segment": base_segment,
    "square": base_square, "rectangle": base_rectangle, "parallelogram": base_parallelogram,
    "circle": base_circle, "regular_polygon": base_regular_polygon,
}


# ================================================================= derivation rules
def _tri(c: Construction, t: Shape, rng: random.Random, vertex: int | None = None):
    i = rng.randrange(3) if vertex is None else vertex
    a, b, cc = t.points[i], t.points[(i + 1) % 3], t.points[(i + 2) % 3]
    return a, b, cc


def _orientation(c: Construction, pts) -> int:
    return 1 if g.signed_area([c.points[p].value for p in pts]) > 0 else -1


def tri_circumcircle(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    A, B, C = t.points
    Oc = c.derive(lambda ops, a, b, cc: g.circumcenter(ops, a, b, cc), (A, B, C), d)
    circ = c.shape("circle", [Oc.name], d, role=f"circumcircle of {t.name}",
                   radius=lambda ops: g.dist(ops, c.xy(Oc.name, ops.exact), c.xy(A, ops.exact)))
    c.contains.append((circ.name, t.name))
    c.add_step("circumcircle", d,
               f"{circ.name} is the circumcircle of triangle {t.name}, with centre {Oc.name}.",
               f"The circumcentre {Oc.name} is equidistant from {A}, {B}, {C}: "
               f"{_pt(c, Oc.name)}; the circumradius {Oc.name}{A} = {_s(circ.radius_exact)}.",
               [circ.name, Oc.name], [t.name])
    return [circ.name]


def tri_incircle(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    A, B, C = t.points
    sign = _orientation(c, (A, B, C))
    P = c.derive(lambda ops, a, b, cc: g.incenter(ops, a, b, cc), (A, B, C), d)
    circ = c.shape("circle", [P.name], d, role=f"incircle of {t.name}",
                   radius=lambda ops: g.inradius(ops, *(c.xy(p, ops.exact) for p in (A, B, C)),
                                                 sign))
    c.contains.append((t.name, circ.name))
    c.add_step("incircle", d,
               f"{circ.name} is the incircle of triangle {t.name}, with centre {P.name}.",
               f"The incentre is the side-length-weighted mean of the vertices: {_pt(c, P.name)};"
               f" the inradius is 2 * area / perimeter = {_s(circ.radius_exact)}.",
               [circ.name, P.name], [t.name])
    return [circ.name]


def _foot_inside(c: Construction, p, a, b) -> bool:
    pv, av, bv = (c.points[n].value for n in (p, a, b))
    ab = g.sub(bv, av)
    t = g.dot(g.sub(pv, av), ab) / g.dot(ab, ab)
    return 0.08 < t < 0.92


def tri_altitude(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    for i in rng.sample(range(3), 3):
        A, B, C = _tri(c, t, rng, i)
        if _foot_inside(c, A, B, C):
            break
    else:
        raise Inapplicable("no altitude foot inside a side")
    H = c.derive(lambda ops, a, b, cc: g.foot(ops, a, b, cc), (A, B, C), d)
    seg = c.shape("segment", [A, H.name], d, role="altitude")
    c.right_angles.append((A, H.name, C))
    c.add_step("altitude", d, f"{H.name} is the foot of the altitude from {A} to {B}{C}.",
               f"{H.name} = {B} + t({C} - {B}) with t = ({A} - {B}).({C} - {B}) / |{B}{C}|^2, so "
               f"{_pt(c, H.name)}.", [seg.name, H.name], [t.name])
    return [seg.name]


def tri_median(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    A, B, C = _tri(c, t, rng)
    M = c.derive(lambda ops, b, cc: g.midpoint(ops, b, cc), (B, C), d)
    seg = c.shape("segment", [A, M.name], d, role="median")
    c.equal.append(((B, M.name), (M.name, C)))
    c.add_step("median", d, f"{A}{M.name} is the median from {A}, with {M.name} on {B}{C}.",
               f"{M.name} is the midpoint of {B}{C}: {_pt(c, M.name)}.", [seg.name, M.name],
               [t.name])
    return [seg.name]


def tri_bisector(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    A, B, C = _tri(c, t, rng)
    D = c.derive(lambda ops, a, b, cc: g.bisector_foot(ops, a, b, cc), (A, B, C), d)
    seg = c.shape("segment", [A, D.name], d, role="bisector")
    c.add_step("bisector", d,
               f"{A}{D.name} bisects the angle {B}{A}{C}, with {D.name} on {B}{C}.",
               f"By the angle bisector theorem {B}{D.name} / {D.name}{C} = {A}{B} / {A}{C}, so "
               f"{_pt(c, D.name)}.", [seg.name, D.name], [t.name])
    return [seg.name]


def tri_medial(c: Construction, t: Shape, rng) -> list[str]:
    d = t.depth + 1
    A, B, C = t.points
    mids = [c.derive(lambda ops, x, y: g.midpoint(ops, x, y), pair, d).name
            for pair in ((B, C), (C, A), (A, B))]
    m = c.shape("triangle", mids, d, role=f"medial triangle of {t.name}")
    c.contains.append((t.name, m.name))
    c.add_step("medial_triangle", d,
               f"{', '.join(mids)} are the midpoints of {B}{C}, {C}{A}, {A}{B}.",
               "The midpoints are " + ", ".join(_pt(c, p) for p in mids) + ".", [m.name],
               [t.name])
    return [m.name]


def _square_on(c: Construction, a: str, b: str, d: int, away: str | None, parent: str,
               rule: str) -> list[str]:
    """The square on ``ab`` erected on the side away from point ``away`` (if any)."""
    s = 1
    if away is not None:
        s = -_orientation(c, (a, b, away))
    P = c.derive(lambda ops, x, y: g.add(y, g.scale(g.rot90(g.sub(y, x)), s)), (a, b), d)
    Q = c.derive(lambda ops, x, y: g.add(x, g.scale(g.rot90(g.sub(y, x)), s)), (a, b), d)
    sq = c.shape("quadrilateral", [a, b, P.name, Q.name], d, role="square")
    c.right_angles.append((a, b, P.name))
    c.add_step(rule, d, f"{sq.name} is a square erected on {a}{b}"
               + (f", outside {parent}." if away else "."),
               f"Turning {b} - {a} by 90 degrees gives {_pt(c, P.name)} and {_pt(c, Q.name)}.",
               [sq.name], [parent])
    return [sq.name]


def tri_side_square(c: Construction, t: Shape, rng) -> list[str]:
    A, B, C = _tri(c, t, rng)
    return _square_on(c, B, C, t.depth + 1, A, t.name, "side_square")


def seg_midpoint(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    A, B = s.points
    M = c.derive(lambda ops, a, b: g.midpoint(ops, a, b), (A, B), d)
    c.equal.append(((A, M.name), (M.name, B)))
    c.add_step("midpoint", d, f"{M.name} is the midpoint of {A}{B}.",
               f"{M.name} = ({A} + {B}) / 2 = {_pt(c, M.name)}.", [M.name], [s.name])
    out = []
    for other in c.points:  # a segment from the midpoint to a given point, when one is free
        if other not in (A, B, M.name) and c.points[other].given:
            seg = c.shape("segment", [other, M.name], d)
            out.append(seg.name)
            break
    return out or [c.shape("segment", [A, M.name], d).name]


def seg_perpendicular(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    A, B = s.points if rng.random() < 0.5 else s.points[::-1]
    sign = rng.choice([1, -1])
    P = c.derive(lambda ops, a, b: g.add(b, g.scale(g.rot90(g.sub(b, a)), sign)), (A, B), d)
    seg = c.shape("segment", [B, P.name], d, role="perpendicular")
    c.right_angles.append((A, B, P.name))
    c.equal.append(((A, B), (B, P.name)))
    c.add_step("perpendicular", d,
               f"{B}{P.name} is perpendicular to {A}{B} at {B}, with {B}{P.name} = {A}{B}.",
               f"{P.name} = {B} + ({A}{B} turned by 90 degrees) = {_pt(c, P.name)}.",
               [seg.name, P.name], [s.name])
    return [seg.name]


def seg_diameter_circle(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    A, B = s.points
    M = c.derive(lambda ops, a, b: g.midpoint(ops, a, b), (A, B), d)
    circ = c.shape("circle", [M.name], d, role=f"circle on diameter {A}{B}",
                   radius=lambda ops: g.dist(ops, c.xy(A, ops.exact), c.xy(B, ops.exact)) / 2)
    c.add_step("diameter_circle", d,
               f"{circ.name} is the circle with diameter {A}{B} and centre {M.name}.",
               f"The centre is the midpoint {_pt(c, M.name)}; the radius is {A}{B} / 2 = "
               f"{_s(circ.radius_exact)}.", [circ.name, M.name], [s.name])
    return [circ.name]


def seg_square(c: Construction, s: Shape, rng) -> list[str]:
    A, B = s.points
    return _square_on(c, A, B, s.depth + 1, None, s.name, "segment_square")


def seg_equilateral(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    A, B = s.points
    sign = rng.choice([1, -1])
    P = c.derive(lambda ops, a, b: g.add(g.midpoint(ops, a, b),
                                         g.scale(g.rot90(g.sub(b, a)), sign * ops.sqrt(3) / 2)),
                 (A, B), d)
    t = c.shape("triangle", [A, B, P.name], d, role="equilateral triangle")
    c.add_step("equilateral_triangle", d, f"{t.name} is an equilateral triangle on {A}{B}.",
               f"{P.name} = midpoint of {A}{B} + (sqrt(3)/2) ({A}{B} turned by 90 degrees) = "
               f"{_pt(c, P.name)}.", [t.name], [s.name])
    return [t.name]


def circ_concentric(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    k = rng.choice([sp.Rational(1, 2), sp.Rational(2, 3), sp.Rational(3, 2), sp.Integer(2)])
    Oc = s.points[0]
    circ = c.shape("circle", [Oc], d, role=f"concentric with {s.name}",
                   radius=lambda ops: (s.radius_exact if ops.exact else s.radius)
                   * (k if ops.exact else float(k)))
    big, small = (circ, s) if k > 1 else (s, circ)
    c.contains.append((big.name, small.name))
    c.add_step("concentric", d,
               f"{circ.name} is concentric with {s.name}, with radius {_s(k)} times that of "
               f"{s.name}.", f"The radius of {circ.name} is {_s(k)} * {_s(s.radius_exact)} = "
               f"{_s(circ.radius_exact)}.", [circ.name], [s.name])
    return [circ.name]


def _on_circle(c: Construction, s: Shape, k: int, n: int, d: int, start: tuple[int, int]):
    """The point of circle ``s`` at angle ``start-angle + 360 k / n`` degrees."""
    Oc = s.points[0]
    ux, uy = start

    def fn(ops, o, k=k):
        r = s.radius_exact if ops.exact else s.radius
        norm = ops.sqrt(ops.const(ux * ux + uy * uy))
        v = (r * ux / norm, r * uy / norm)
        return g.add(o, g.rotate(ops, v, k, n))

    return c.derive(fn, (Oc,), d)


def circ_diameter(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    start = rng.choice([(1, 0), (0, 1), (1, 1), (3, 4), (4, 3), (1, -1)])
    P = _on_circle(c, s, 0, 2, d, start)
    Q = _on_circle(c, s, 1, 2, d, start)
    seg = c.shape("segment", [P.name, Q.name], d, role="diameter")
    Oc = s.points[0]
    c.equal.append(((P.name, Oc), (Oc, Q.name)))
    c.add_step("diameter", d,
               f"{P.name}{Q.name} is a diameter of {s.name} in the direction {start}.",
               f"{P.name} = {Oc} + r * u, {Q.name} = {Oc} - r * u with u the unit vector {start}: "
               f"{_pt(c, P.name)}, {_pt(c, Q.name)}.", [seg.name], [s.name])
    return [seg.name]


def circ_inscribed_polygon(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    n = rng.choice([3, 4, 6])
    start = rng.choice([(1, 0), (0, 1), (1, 1)])
    names = [_on_circle(c, s, k, n, d, start).name for k in range(n)]
    role = POLYGON_NAMES[n]
    kind = {3: "triangle", 4: "quadrilateral"}.get(n, "polygon")
    poly = c.shape(kind, names, d, role=role)
    c.contains.append((s.name, poly.name))
    c.add_step("inscribed_polygon", d,
               f"{poly.name} is a {role} inscribed in {s.name}, with {names[0]} in the "
               f"direction {start} from the centre.",
               f"The vertices of {poly.name} are " + ", ".join(_pt(c, p) for p in names) + ".",
               [poly.name],
               [s.name])
    return [poly.name]


def circ_circumscribed_square(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    Oc = s.points[0]
    corners = []
    for sx, sy in ((1, 1), (-1, 1), (-1, -1), (1, -1)):
        def fn(ops, o, sx=sx, sy=sy):
            r = s.radius_exact if ops.exact else s.radius
            return (o[0] + sx * r, o[1] + sy * r)
        corners.append(c.derive(fn, (Oc,), d).name)
    sq = c.shape("quadrilateral", corners, d, role="square")
    c.contains.append((sq.name, s.name))
    c.right_angles.append((corners[3], corners[0], corners[1]))
    c.add_step("circumscribed_square", d,
               f"{sq.name} is the axis-aligned square circumscribed about {s.name}.",
               f"The vertices of {sq.name} are the centre plus (+-r, +-r): "
               + ", ".join(_pt(c, p) for p in corners) + ".", [sq.name], [s.name])
    return [sq.name]


def quad_diagonals(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    A, B, C, D = s.points

    def inter(ops, a, b, cc, dd):  # AC meets BD
        r, q = g.sub(cc, a), g.sub(dd, b)
        t = g.cross(g.sub(b, a), q) / g.cross(r, q)
        return g.add(a, g.scale(r, t))

    X = c.derive(inter, (A, B, C, D), d)
    s1 = c.shape("segment", [A, C], d, role="diagonal")
    s2 = c.shape("segment", [B, D], d, role="diagonal")
    c.add_step("diagonals", d, f"The diagonals {A}{C} and {B}{D} of {s.name} meet at {X.name}.",
               f"Solving {A} + t({C} - {A}) = {B} + u({D} - {B}) gives {_pt(c, X.name)}.",
               [s1.name, s2.name, X.name], [s.name])
    return [s1.name, s2.name]


def quad_circumcircle(c: Construction, s: Shape, rng) -> list[str]:
    if s.role not in ("square", "rectangle"):
        raise Inapplicable(f"{s.role} {s.name} is not cyclic in general")
    d = s.depth + 1
    A, B, C, D = s.points
    M = c.derive(lambda ops, a, cc: g.midpoint(ops, a, cc), (A, C), d)
    circ = c.shape("circle", [M.name], d, role=f"circumcircle of {s.name}",
                   radius=lambda ops: g.dist(ops, c.xy(A, ops.exact), c.xy(C, ops.exact)) / 2)
    c.contains.append((circ.name, s.name))
    c.add_step("quad_circumcircle", d,
               f"{circ.name} is the circumcircle of {s.role} {s.name}, with centre {M.name}.",
               f"The centre is the midpoint of the diagonal {A}{C}: {_pt(c, M.name)}; the radius "
               f"is {A}{C} / 2 = {_s(circ.radius_exact)}.", [circ.name, M.name], [s.name])
    return [circ.name]


def quad_incircle(c: Construction, s: Shape, rng) -> list[str]:
    if s.role != "square":
        raise Inapplicable(f"{s.role} {s.name} has no incircle in general")
    d = s.depth + 1
    A, B, C, D = s.points
    M = c.derive(lambda ops, a, cc: g.midpoint(ops, a, cc), (A, C), d)
    circ = c.shape("circle", [M.name], d, role=f"incircle of {s.name}",
                   radius=lambda ops: g.dist(ops, c.xy(A, ops.exact), c.xy(B, ops.exact)) / 2)
    c.contains.append((s.name, circ.name))
    c.add_step("quad_incircle", d,
               f"{circ.name} is the circle inscribed in square {s.name}, with centre {M.name}.",
               f"The centre is the midpoint of {A}{C}: {_pt(c, M.name)}; the radius is "
               f"{A}{B} / 2 = {_s(circ.radius_exact)}.", [circ.name, M.name], [s.name])
    return [circ.name]


def quad_midpoints(c: Construction, s: Shape, rng) -> list[str]:
    d = s.depth + 1
    pts = s.points
    mids = [c.derive(lambda ops, x, y: g.midpoint(ops, x, y), (pts[i], pts[(i + 1) % 4]), d).name
            for i in range(4)]
    q = c.shape("quadrilateral", mids, d, role="parallelogram")
    c.contains.append((s.name, q.name))
    c.add_step("midpoint_quadrilateral", d,
               f"{', '.join(mids)} are the midpoints of the sides of {s.name}.",
               "The midpoints are " + ", ".join(_pt(c, p) for p in mids) + ".", [q.name],
               [s.name])
    return [q.name]


def _center_of(c: Construction, s: Shape) -> str:
    step = next(st for st in c.steps if s.name in st.outputs)
    given = [p for p in c.points if c.points[p].given and p not in s.points]
    if step.rule == "regular_polygon" and given:
        return given[0]
    raise Inapplicable(f"{s.name} has no named centre")


def poly_circumcircle(c: Construction, s: Shape, rng) -> list[str]:
    if not s.role.startswith(("regular", "equilateral", "square")):
        raise Inapplicable(f"{s.name} is not regular")
    Oc = _center_of(c, s)
    d = s.depth + 1
    A = s.points[0]
    circ = c.shape("circle", [Oc], d, role=f"circumcircle of {s.name}",
                   radius=lambda ops: g.dist(ops, c.xy(Oc, ops.exact), c.xy(A, ops.exact)))
    c.contains.append((circ.name, s.name))
    c.add_step("polygon_circumcircle", d, f"{circ.name} is the circumcircle of {s.name}.",
               f"The radius of {circ.name} is {Oc}{A} = {_s(circ.radius_exact)}.", [circ.name],
               [s.name])
    return [circ.name]


def poly_incircle(c: Construction, s: Shape, rng) -> list[str]:
    if not s.role.startswith(("regular", "equilateral", "square")):
        raise Inapplicable(f"{s.name} is not regular")
    Oc = _center_of(c, s)
    d = s.depth + 1
    A, B = s.points[0], s.points[1]
    M = c.derive(lambda ops, a, b: g.midpoint(ops, a, b), (A, B), d)
    circ = c.shape("circle", [Oc], d, role=f"incircle of {s.name}",
                   radius=lambda ops: g.dist(ops, c.xy(Oc, ops.exact), c.xy(M.name, ops.exact)))
    c.contains.append((s.name, circ.name))
    c.right_angles.append((Oc, M.name, B))
    c.add_step("polygon_incircle", d,
               f"{circ.name} is the incircle of {s.name}, touching {A}{B} at {M.name}.",
               f"It touches {A}{B} at its midpoint {_pt(c, M.name)}; the radius (apothem) is "
               f"{Oc}{M.name} = {_s(circ.radius_exact)}.", [circ.name, M.name], [s.name])
    return [circ.name]


def poly_diagonal(c: Construction, s: Shape, rng) -> list[str]:
    n = len(s.points)
    if n < 5:
        raise Inapplicable("needs at least five vertices")
    d = s.depth + 1
    k = rng.randrange(2, n - 1)
    A, B = s.points[0], s.points[k]
    seg = c.shape("segment", [A, B], d, role="diagonal")
    c.add_step("polygon_diagonal", d, f"{A}{B} is a diagonal of {s.name}.",
               f"{A}{B} joins {_pt(c, A)} and {_pt(c, B)}.", [seg.name], [s.name])
    return [seg.name]


RULES: dict[str, dict[str, Callable]] = {
    "triangle": {"circumcircle": tri_circumcircle, "incircle": tri_incircle,
                 "altitude": tri_altitude, "median": tri_median, "bisector": tri_bisector,
                 "medial_triangle": tri_medial, "side_square": tri_side_square,
                 "polygon_circumcircle": poly_circumcircle},
    "segment": {"midpoint": seg_midpoint, "perpendicular": seg_perpendicular,
                "diameter_circle": seg_diameter_circle, "segment_square": seg_square,
                "equilateral_triangle": seg_equilateral},
    "circle": {"concentric": circ_concentric, "diameter": circ_diameter,
               "inscribed_polygon": circ_inscribed_polygon,
               "circumscribed_square": circ_circumscribed_square},
    "quadrilateral": {"diagonals": quad_diagonals, "quad_circumcircle": quad_circumcircle,
                      "quad_incircle": quad_incircle,
                      "midpoint_quadrilateral": quad_midpoints},
    "polygon": {"polygon_circumcircle": poly_circumcircle, "polygon_incircle": poly_incircle,
                "polygon_diagonal": poly_diagonal},
}
ALL_RULES = sorted({*BASE_RULES, *(r for rules in RULES.values() for r in rules)})


def build(base: str, rules: list[tuple[str, int]], seed: int = 0) -> Construction:
    """Replay a construction: ``base`` rule, then ``(rule, shape index)`` pairs.

    The shape index counts shapes in the order they were made. Raises
    :class:`DegenerateError` or :class:`Inapplicable` as the rules do.
    """
    rng = random.Random(seed)
    c = Construction()
    if base not in BASE_RULES:
        raise ValueError(f"base rule {base!r}: expected one of {sorted(BASE_RULES)}")
    BASE_RULES[base](c, rng)
    for rule, index in rules:
        shape = list(c.shapes.values())[index]
        table = RULES.get(shape.kind, {})
        if rule not in table:
            raise ValueError(f"rule {rule!r} does not apply to a {shape.kind}: expected one of "
                             f"{sorted(table)}")
        table[rule](c, shape, rng)
    c.check()
    return c


@dataclass
class SampleStats:
    degenerate: int = 0
    inapplicable: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def sample(rng: random.Random, n_rules: int, *, max_points: int = 14, max_tries: int = 200,
           stats: SampleStats | None = None, bases: list[str] | None = None) -> Construction:
    """A random, well-formed construction: one base rule, then up to ``n_rules`` rules.

    Rules extend recent (deeper) objects more often, so that derivations chain.
    Degenerate draws are rejected and redrawn (``stats`` counts them).
    """
    stats = stats if stats is not None else SampleStats()
    bases = bases or list(BASE_RULES)
    for _ in range(max_tries):
        c = Construction()
        try:
            BASE_RULES[rng.choice(bases)](c, rng)
            c.check()
            applied = 0
            for _attempt in range(4 * n_rules + 4):
                if applied >= n_rules or len(c.points) >= max_points:
                    break
                shapes = [s for s in c.shapes.values() if RULES.get(s.kind)]
                weights = [1.0 + 2.0 * s.depth for s in shapes]
                shape = rng.choices(shapes, weights)[0]
                rule = rng.choice(sorted(RULES[shape.kind]))
                snapshot = _snapshot(c)
                try:
                    RULES[shape.kind][rule](c, shape, rng)
                    c.check()
                    applied += 1
                except (Inapplicable, DegenerateError) as e:
                    stats.inapplicable += isinstance(e, Inapplicable)
                    if isinstance(e, DegenerateError):
                        _count(stats, e)
                    _restore(c, snapshot)
            return c
        except DegenerateError as e:
            _count(stats, e)
    raise RuntimeError(f"no well-formed construction in {max_tries} draws")


def _count(stats: SampleStats, e: Exception) -> None:
    stats.degenerate += 1
    key = str(e).split(":")[-1].split("(")[0].strip()
    key = re.sub(r"\d+(\.\d+)?", "#", re.sub(r"\b[A-Z]\d*\b", "X", key))
    stats.reasons[key] = stats.reasons.get(key, 0) + 1


def _snapshot(c: Construction):
    return (dict(c.points), dict(c.shapes), list(c.steps), list(c.right_angles), list(c.equal),
            list(c.contains), c._n_circles)


def _restore(c: Construction, snap) -> None:
    (c.points, c.shapes, c.steps, c.right_angles, c.equal, c.contains, c._n_circles) = (
        dict(snap[0]), dict(snap[1]), list(snap[2]), list(snap[3]), list(snap[4]),
        list(snap[5]), snap[6])
