"""A type-conditional grammar of plane constructions, seeded and reproducible.

This module samples and replays derivations; the rules are in :mod:`.rules`
and the object they build in :mod:`.construction`.

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

import random
import re
from dataclasses import dataclass, field

from lab.methods.geosym.construction import (
    LETTERS,
    Construction,
    DegenerateError,
    Inapplicable,
    Point,
    Shape,
    Step,
)
from lab.methods.geosym.rules import ALL_RULES, BASE_RULES, RULES

__all__ = ["ALL_RULES", "BASE_RULES", "LETTERS", "RULES", "Construction", "DegenerateError",
           "Inapplicable", "Point", "SampleStats", "Shape", "Step", "build", "sample"]

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
