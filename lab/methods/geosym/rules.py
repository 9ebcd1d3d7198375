"""The grammar's rules: base rules (typed objects on lattice points) and derivation
rules keyed by the type of the object they extend.

Each rule takes ``(construction, shape, rng)`` (base rules ``(construction,
rng)``), adds points through :meth:`Construction.derive` (exact and float),
shapes, marks and one :class:`~.construction.Step` with its statement and
derivation text, and returns the new shapes' names. A rule that does not apply
to the chosen object raises :class:`~.construction.Inapplicable`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import sympy as sp

from lab.methods.geosym import geometry as g
from lab.methods.geosym.construction import (
    POLYGON_NAMES,
    Construction,
    DegenerateError,
    Inapplicable,
    Shape,
    _pt,
    _s,
)


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

