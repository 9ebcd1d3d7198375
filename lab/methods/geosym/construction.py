"""Constructions: named points (exact and float coordinates), typed shapes, steps.

A :class:`Construction` is what the grammar (:mod:`.grammar`, rules in
:mod:`.rules`) builds: points with exact sympy coordinates and float
coordinates computed independently from the same integers, typed shapes
(segment, triangle, quadrilateral, polygon, circle), the derivation steps with
their depth and text, and the marks the renderer draws (right angles, equal
segments) and the containments a shaded region may use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

from lab.methods.geosym import geometry as g

LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O: they read as 1 and 0
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


