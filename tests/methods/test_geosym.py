"""GeoSym: exact answers, every grammar rule, the renderer, degenerate input, the verifier,
splits and builders."""

import collections
import io
import math
import random
import re
import time
import warnings

import jax
import numpy as np
import pytest
import sympy as sp

from lab.methods import geosym
from lab.methods.geosym import geometry as g
from lab.methods.geosym import grammar, questions, rules, solver
from lab.methods.geosym import render as R

NO_RENDER = geosym.GenConfig(render=False)


@pytest.fixture(scope="module")
def records():
    recs, stats = geosym.generate(64, seed=11, config=NO_RENDER)
    return recs, stats


def _rel(a, b):
    return abs(a - b) / abs(b)


# ------------------------------------------------------------------- exactness
def test_every_generated_answer_is_exact_and_matches_float(records):
    recs, stats = records
    assert len(recs) == 64 and stats.problems == 64
    for r in recs:
        exact = geosym.parse(r["answer"])
        assert exact is not None, r["answer"]
        assert not exact.has(sp.Float), r["answer"]  # an exact form, not a decimal
        assert _rel(float(sp.N(exact, 30)), r["value"]) <= 1e-9, r
        assert geosym.verify(geosym.extract_answer(r["cot"]), r["answer"])
        assert r["cot"].rstrip().endswith(f"Answer: {r['answer']}")
        ex = geosym.to_sft(r)
        coords = re.compile(r"[A-Z]\(-?\d+, -?\d+\)")  # given data, e.g. A(0, 4)
        assert coords.search(r["question"]) and not coords.search(ex["prompt"])
        assert geosym.reward([ex["completion"]], [ex["answer"]])[0] == 1.0
    kinds = collections.Counter(r["question_type"] for r in recs)
    assert set(kinds) == set(geosym.QUESTION_TYPES), kinds
    assert set(geosym.strata_counts(recs).values()) != {0}
    assert all(v > 0 for v in geosym.strata_counts(recs).values())


def test_difficulty_grows_with_derivation_depth(records):
    recs, _ = records
    by_rules = collections.defaultdict(list)
    for r in recs:
        by_rules[min(len(r["rules"]) - 1, 3)].append(r["difficulty"])
    means = [np.mean(by_rules[k]) for k in range(4)]
    assert means[0] < means[1] < means[2] < means[3], means
    c = grammar.build("triangle", [("circumcircle", 0), ("concentric", 1)], seed=_seed(
        "triangle", [("circumcircle", 0), ("concentric", 1)]))
    assert questions.quantity_depth(c, ("area", "c2")) == 2
    assert questions.quantity_depth(c, ("radius", "c1")) == 1
    assert questions.quantity_depth(c, ("shaded", "c2", "c1")) == 3


def test_shortcuts_stay_near_chance(records):
    """The majority answer (overall, per question type, per diagram-question template) is rare."""
    recs, _ = records
    train, test = recs[:40], recs[40:]
    overall = collections.Counter(r["answer"] for r in train).most_common(1)[0][0]
    assert np.mean([r["answer"] == overall for r in test]) < 0.1
    per_type = {k: collections.Counter(r["answer"] for r in train if r["question_type"] == k)
                .most_common(1)[0][0] for k in {r["question_type"] for r in train}}
    acc = np.mean([r["answer"] == per_type.get(r["question_type"]) for r in test])
    assert acc < 0.15, acc
    # The question alone: with names masked, a template's majority answer.
    tmpl = lambda r: re.sub(r"\b[A-Z]\d?\b|c\d", "X", r["question_diagram"])
    by_t = collections.defaultdict(collections.Counter)
    for r in train:
        by_t[tmpl(r)][r["answer"]] += 1
    guess = [by_t[tmpl(r)].most_common(1)[0][0] if by_t[tmpl(r)] else overall for r in test]
    assert np.mean([gu == r["answer"] for gu, r in zip(guess, test, strict=True)]) < 0.15


def test_reproducible_and_pool_matches_serial():
    a, _ = geosym.make_problem(123)
    b, _ = geosym.make_problem(123)
    assert a == b and a["image"][:8] == b"\x89PNG\r\n\x1a\n"
    serial, _ = geosym.generate(6, seed=2, config=NO_RENDER)
    jax.numpy.zeros(2).block_until_ready()     # JAX's threads run, as in any Lab process
    with warnings.catch_warnings(record=True) as caught:   # the pool must not fork them
        warnings.simplefilter("always")
        pooled, _ = geosym.generate(6, seed=2, config=NO_RENDER, workers=2)
    assert not [w for w in caught if "fork" in str(w.message)], caught
    assert [r["answer"] for r in serial] == [r["answer"] for r in pooled]


# ------------------------------------------------------------------ grammar rules
EXERCISE = {  # rule -> (base, [(rule, shape index)])
    **{b: (b, []) for b in grammar.BASE_RULES},
    **{r: ("triangle", [(r, 0)]) for r in ("circumcircle", "incircle", "altitude", "median",
                                          "bisector", "medial_triangle", "side_square")},
    **{r: ("segment", [(r, 0)]) for r in ("midpoint", "perpendicular", "diameter_circle",
                                         "segment_square", "equilateral_triangle")},
    **{r: ("circle", [(r, 0)]) for r in ("concentric", "diameter", "inscribed_polygon",
                                        "circumscribed_square")},
    **{r: ("square", [(r, 0)]) for r in ("diagonals", "quad_circumcircle", "quad_incircle",
                                        "midpoint_quadrilateral")},
    **{r: ("regular_polygon", [(r, 0)]) for r in ("polygon_circumcircle", "polygon_incircle",
                                                 "polygon_diagonal")},
}


def _seed(base, rules):
    for seed in range(200):
        try:
            grammar.build(base, rules, seed)
            return seed
        except (grammar.DegenerateError, grammar.Inapplicable):
            continue
    raise AssertionError(f"no seed builds {base} + {rules}")


def _v(c, n):
    return np.array(c.points[n].value)


def _line_dist(p, a, b):
    d = b - a
    return abs(d[0] * (p - a)[1] - d[1] * (p - a)[0]) / np.linalg.norm(d)


def _check_rule(rule, c):
    """The defining property of each rule, on the float coordinates."""
    last = c.steps[-1]
    shapes = [c.shapes[n] for n in last.outputs if n in c.shapes]
    close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    if rule in ("circumcircle", "quad_circumcircle", "polygon_circumcircle"):
        circ = shapes[0]
        parent = c.shapes[last.inputs[0]]
        o = _v(c, circ.points[0])
        assert all(close(np.linalg.norm(_v(c, p) - o), circ.radius) for p in parent.points)
    elif rule in ("incircle", "quad_incircle", "polygon_incircle", "circumscribed_square"):
        circ = shapes[0] if shapes[0].kind == "circle" else c.shapes[last.inputs[0]]
        poly = c.shapes[last.inputs[0]] if shapes[0].kind == "circle" else shapes[0]
        o, pts = _v(c, circ.points[0]), [_v(c, p) for p in poly.points]
        for i in range(len(pts)):
            assert close(_line_dist(o, pts[i], pts[(i + 1) % len(pts)]), circ.radius)
    elif rule == "altitude":
        a, h = (_v(c, p) for p in shapes[0].points)
        _, b, cc = (p for p in c.right_angles[-1])
        assert abs(np.dot(a - h, _v(c, cc) - h)) < 1e-9
    elif rule == "median":
        (b, m), (_, cc) = c.equal[-1]
        assert np.allclose(_v(c, m), (_v(c, b) + _v(c, cc)) / 2, atol=1e-12)
    elif rule == "bisector":
        a, d = shapes[0].points
        tri = c.shapes[last.inputs[0]]
        b, cc = [p for p in tri.points if p != a]
        ang = lambda x, y, z: math.acos(g.cos_angle(g.FLOAT, c.points[x].value,
                                                    c.points[y].value, c.points[z].value))
        assert close(ang(b, a, d), ang(d, a, cc))
    elif rule in ("medial_triangle", "midpoint_quadrilateral"):
        parent = c.shapes[last.inputs[0]].points
        n = len(parent)
        for i, m in enumerate(shapes[0].points):
            ends = (parent[(i + 1) % n], parent[(i + 2) % n]) if n == 3 else (
                parent[i], parent[(i + 1) % n])
            assert np.allclose(_v(c, m), (_v(c, ends[0]) + _v(c, ends[1])) / 2, atol=1e-12)
    elif rule in ("side_square", "segment_square", "square", "circumscribed_square"):
        pts = [_v(c, p) for p in shapes[0].points]
        sides = [np.linalg.norm(pts[(i + 1) % 4] - pts[i]) for i in range(4)]
        assert np.allclose(sides, sides[0])
        assert abs(np.dot(pts[1] - pts[0], pts[3] - pts[0])) < 1e-9
    elif rule in ("midpoint",):
        (a, m), (_, b) = c.equal[-1]
        assert np.allclose(_v(c, m), (_v(c, a) + _v(c, b)) / 2, atol=1e-12)
    elif rule == "perpendicular":
        a, b, p = c.right_angles[-1]
        assert abs(np.dot(_v(c, a) - _v(c, b), _v(c, p) - _v(c, b))) < 1e-9
        assert close(np.linalg.norm(_v(c, p) - _v(c, b)), np.linalg.norm(_v(c, a) - _v(c, b)))
    elif rule == "diameter_circle":
        a, b = c.shapes[last.inputs[0]].points
        circ = shapes[0]
        assert close(np.linalg.norm(_v(c, a) - _v(c, circ.points[0])), circ.radius)
        assert close(2 * circ.radius, np.linalg.norm(_v(c, a) - _v(c, b)))
    elif rule in ("equilateral_triangle",):
        pts = [_v(c, p) for p in shapes[0].points]
        sides = [np.linalg.norm(pts[(i + 1) % 3] - pts[i]) for i in range(3)]
        assert np.allclose(sides, sides[0], rtol=1e-12)
    elif rule == "concentric":
        new, old = shapes[0], c.shapes[last.inputs[0]]
        assert new.points == old.points and not close(new.radius, old.radius)
    elif rule in ("diameter", "inscribed_polygon"):
        circ = c.shapes[last.inputs[0]]
        o = _v(c, circ.points[0])
        pts = [_v(c, p) for p in shapes[0].points]
        assert all(close(np.linalg.norm(p - o), circ.radius) for p in pts)
        if rule == "diameter":
            assert np.allclose((pts[0] + pts[1]) / 2, o, atol=1e-12)
        else:
            sides = [np.linalg.norm(pts[(i + 1) % len(pts)] - pts[i]) for i in range(len(pts))]
            assert np.allclose(sides, sides[0], rtol=1e-12)
    elif rule == "diagonals":
        x = _v(c, last.outputs[-1])
        for s in shapes:
            assert _line_dist(x, *(_v(c, p) for p in s.points)) < 1e-9
    elif rule in ("regular_polygon", "polygon_diagonal"):
        poly = shapes[0] if rule == "regular_polygon" else c.shapes[last.inputs[0]]
        pts = [_v(c, p) for p in poly.points]
        sides = [np.linalg.norm(pts[(i + 1) % len(pts)] - pts[i]) for i in range(len(pts))]
        assert np.allclose(sides, sides[0], rtol=1e-12)
    elif rule == "right_triangle":
        b, a, cc = c.right_angles[-1]
        assert abs(np.dot(_v(c, b) - _v(c, a), _v(c, cc) - _v(c, a))) < 1e-12
    elif rule == "rectangle":
        pts = [_v(c, p) for p in shapes[0].points]
        assert all(abs(np.dot(pts[i - 1] - pts[i], pts[(i + 1) % 4] - pts[i])) < 1e-12
                   for i in range(4))
    elif rule == "parallelogram":
        pts = [_v(c, p) for p in shapes[0].points]
        assert np.allclose(pts[1] - pts[0], pts[2] - pts[3])
    elif rule in ("triangle", "segment", "circle"):
        assert all(c.points[p].given for p in c.points)
    else:
        raise AssertionError(f"no property check for rule {rule}")


@pytest.mark.parametrize("rule", geosym.ALL_RULES)
def test_each_grammar_rule(rule):
    base, rules = EXERCISE[rule]
    c = grammar.build(base, rules, _seed(base, rules))
    assert c.steps[-1].rule == rule
    c.check()
    _check_rule(rule, c)
    # Every quantity of the construction: exact == float within 1e-9, or not asked.
    solved = 0
    for qs in questions.candidates(c).values():
        for q in qs[:6]:
            try:
                sol = solver.solve(c, q, timeout=5.0)
            except solver.Unsuitable:
                continue
            solved += 1
            assert sol.rel_error <= 1e-9
    assert solved > 0
    # Exact coordinates equal the float ones.
    for p in c.points.values():
        assert np.allclose([float(sp.N(x, 30)) for x in p.exact], p.value, rtol=1e-12,
                           atol=1e-12)


def test_every_rule_is_covered_by_the_table():
    assert set(EXERCISE) == set(geosym.ALL_RULES)


# ----------------------------------------------------------------------- renderer
def test_render_points_and_labels_agree_with_construction():
    rules = [("circumcircle", 0), ("median", 0)]
    c = grammar.build("triangle", rules, _seed("triangle", rules))
    size = 512
    r = R.render(c, size=size, dpi=64, shaded=("c1", "ABC"))
    assert r.image.shape == (size, size, 3) and r.image.dtype == np.uint8
    (x0, x1), (y0, y1) = r.xlim, r.ylim
    to_px = lambda xy: ((xy[0] - x0) / (x1 - x0) * size, (y1 - xy[1]) / (y1 - y0) * size)
    for name, p in c.points.items():
        ex = to_px(p.value)
        px, py = r.points_px[name]
        assert abs(px - ex[0]) < 0.5 and abs(py - ex[1]) < 0.5
        assert r.image[int(round(py)), int(round(px))].max() < 80, name  # the black dot
        bx0, by0, bx1, by1 = r.labels_px[name]
        assert 0 <= bx0 and bx1 <= size and 0 <= by0 and by1 <= size
        centre = ((bx0 + bx1) / 2, (by0 + by1) / 2)
        assert math.dist(centre, (px, py)) < 0.12 * size  # the label sits by its point
        box = r.image[int(by0):int(by1), int(bx0):int(bx1)]
        assert (box.max(axis=-1) < 100).sum() > 5  # text was drawn there
    assert R.labels_overlap(r) == []
    assert R.label_text(c, "A").startswith("A(")
    bx0, by0, bx1, by1 = r.labels_px["c1"]  # the circle's name sits just outside it
    o_px = r.points_px[c.shapes["c1"].points[0]]
    rad_px = c.shapes["c1"].radius / (x1 - x0) * size
    assert rad_px < math.dist(((bx0 + bx1) / 2, (by0 + by1) / 2), o_px) < rad_px + 0.1 * size

    def clear(xy):  # far from every point, label and line of the figure
        px = to_px(xy)
        if any(math.dist(px, q) < 25 for q in r.points_px.values()):
            return False
        if any(b[0] - 5 < px[0] < b[2] + 5 and b[1] - 5 < px[1] < b[3] + 5
               for b in r.labels_px.values()):
            return False
        ys, xs = int(px[1]), int(px[0])
        return r.image[ys - 4:ys + 5, xs - 4:xs + 5].min() > 150

    pts = np.array([c.points[p].value for p in "ABC"])
    o, rad = np.array(c.points[c.shapes["c1"].points[0]].value), c.shapes["c1"].radius
    rng = np.random.default_rng(0)
    inside, between = [], []
    while len(inside) < 3 or len(between) < 3:
        w = rng.dirichlet([2, 2, 2])
        xy = w @ pts
        if clear(xy):
            inside.append(xy)
        ang = rng.uniform(0, 2 * np.pi)
        xy = o + rad * rng.uniform(0.5, 0.97) * np.array([np.cos(ang), np.sin(ang)])
        bary = np.linalg.solve(np.vstack([pts.T, np.ones(3)]), np.append(xy, 1))
        if bary.min() < -0.05 and clear(xy):
            between.append(xy)
    for xy in inside:  # inside the triangle: not shaded
        px, py = (int(v) for v in to_px(xy))
        assert r.image[py, px].min() > 240
    for xy in between:  # inside the circumcircle, outside the triangle: grey
        px, py = (int(v) for v in to_px(xy))
        assert abs(int(r.image[py, px][0]) - 0xB8) < 12 and np.ptp(r.image[py, px]) < 6


def test_render_never_overlaps_labels_on_random_problems():
    for seed in range(6):
        rng = random.Random(seed)
        c = grammar.sample(rng, 3)
        r = R.render(c, size=384, dpi=48)
        assert R.labels_overlap(r) == [], seed
        for n, b in r.labels_px.items():  # no label covers another point
            assert not [m for m, (x, y) in r.points_px.items()
                        if m != n and b[0] < x < b[2] and b[1] < y < b[3]], (seed, n)
    with pytest.raises(ValueError, match="size"):
        R.render(c, size=10)


# -------------------------------------------------------------- degenerate input
def test_degenerate_constructions_rejected():
    c = grammar.Construction()
    for n, (x, y) in zip("ABC", [(0, 0), (2, 2), (5, 5)], strict=True):
        c.given(n, x, y)
    c.shape("triangle", ["A", "B", "C"], 0)
    with pytest.raises(grammar.DegenerateError, match="collinear triangle"):
        c.check()
    c = grammar.Construction()
    c.given("A", 1, 1)
    c.given("B", 1, 1)
    c.shape("circle", ["A"], 0, radius=lambda ops: g.dist(ops, c.xy("A", ops.exact),
                                                          c.xy("B", ops.exact)))
    with pytest.raises(grammar.DegenerateError, match="zero radius"):
        c.check()


def test_degenerate_draws_are_resampled_never_emitted(monkeypatch):
    draws = iter([(0, 0), (3, 3), (6, 6)])  # the first triangle is collinear
    real = rules._lattice
    monkeypatch.setattr(rules, "_lattice", lambda rng, lo=0, hi=8: next(draws, None)
                        or real(rng, lo, hi))
    stats = grammar.SampleStats()
    c = grammar.sample(random.Random(0), 0, stats=stats, bases=["triangle"])
    assert stats.reasons.get("collinear triangle") == 1, stats.reasons
    c.check()
    monkeypatch.undo()
    stats = grammar.SampleStats()
    for seed in range(40):
        c = grammar.sample(random.Random(seed), 4, stats=stats)
        c.check()  # every returned construction is well formed
    assert stats.degenerate > 0


def test_timeouts_drop_the_problem(monkeypatch):
    def slow(*a, **k):  # burns CPU: the limit counts CPU time
        t = time.process_time()
        while time.process_time() - t < 2.0:
            pass
        raise AssertionError("not interrupted")

    monkeypatch.setattr(solver, "canonical", slow)
    monkeypatch.setattr(solver, "is_zero", slow)
    rec, stats = geosym.make_problem(5, geosym.GenConfig(timeout=0.02, render=False))
    assert rec is None and stats.timeouts > 0 and stats.no_question == 1
    with pytest.raises(solver.SolverTimeout):
        with solver.time_limit(0.05):
            slow()


def test_solver_flags_a_disagreeing_float_check():
    seed = _seed("segment", [("midpoint", 0)])
    c = grammar.build("segment", [("midpoint", 0)], seed)
    name = c.steps[-1].outputs[0]
    p = c.points[name]
    p.value = (p.value[0] + 1e-6, p.value[1])  # corrupt the float evaluation
    a = c.steps[0].outputs[0][0]
    with pytest.raises(solver.Inexact, match="relative error"):
        solver.solve(c, ("length", a, name))


# ----------------------------------------------------------------------- verifier
@pytest.mark.parametrize("pred", ["2*sqrt(5)", "sqrt(20)", "√20", "2√5", "2 sqrt(5)",
                                  "\\sqrt{20}", "2\\sqrt{5}", "4.47214", "20^(1/2)",
                                  "4*sqrt(5)/2"])
def test_verifier_accepts_equivalent_forms(pred):
    assert geosym.verify(pred, "2*sqrt(5)")


@pytest.mark.parametrize("pred", ["2*sqrt(6)", "4.4", "4.47", "", None, "x", "2*sqrt(5)*x",
                                  "__import__('os').system('true')", "4,47", "sqrt(-20)",
                                  "lambda: 1"])
def test_verifier_rejects_wrong_forms(pred):
    assert not geosym.verify(pred, "2*sqrt(5)")


def test_verifier_latex_pi_degrees_and_reward():
    assert geosym.verify("\\frac{25\\pi}{4}", "25*pi/4")
    assert geosym.verify("25π/4", "25*pi/4")
    assert geosym.verify("6.25pi", "25*pi/4")
    assert not geosym.verify("25/4", "25*pi/4")
    assert geosym.verify("45°", "45") and geosym.verify("45 degrees", "45")
    assert not geosym.verify("135", "45")
    comps = ["so the area is ... Answer: 3/2", "\\boxed{1.5}", "Answer: 2/3", "no answer",
             "\\boxed{\\frac{3}{2}}"]
    np.testing.assert_array_equal(geosym.reward(comps, ["3/2"] * 5), [1, 1, 0, 0, 1])
    assert geosym.reward(comps, ["3/2"] * 5).dtype == np.float32
    with pytest.raises(ValueError, match="2 answers"):
        geosym.reward(comps, ["1", "2"])
    with pytest.raises(ValueError, match="not an exact number"):
        geosym.verify("1", "banana")


# ------------------------------------------------------------- splits, builders
def test_stratified_splits_and_curated_bench(records):
    recs, _ = records
    sp_ = geosym.split(recs, bench_per_cell=2, seed=0)
    assert set(sp_) == set(geosym.dataset.SPLITS)
    texts = [set(r["question"] for r in v) for v in sp_.values()]
    assert sum(len(t) for t in texts) == len(set().union(*texts))  # no question in two splits
    bench = sp_["bench"]
    cells = collections.Counter((r["question_type"], r["stratum"]) for r in bench)
    assert max(cells.values()) <= 2 and len(cells) >= 10
    assert max(r["n_points"] for r in bench) <= 10
    assert len({(r["question_type"], r["stratum"], r["answer"]) for r in bench}) == len(bench)
    rest = sp_["train"] + sp_["validation"] + sp_["test"]
    pool = geosym.strata_counts(rest)
    for name, frac in zip(("train", "validation", "test"), (0.8, 0.1, 0.1), strict=True):
        got = geosym.strata_counts(sp_[name])
        for s in geosym.STRATA:  # each stratum is cut in the same proportions (up to rounding)
            assert abs(got[s] - frac * pool[s]) <= 1.0, (name, s, got, pool)
    with pytest.raises(ValueError, match="fractions"):
        geosym.split(recs, fractions=(0.5, 0.5, 0.5))


def test_builders_produce_readable_datasets(tmp_path):
    recs, _ = geosym.generate(6, seed=4, config=geosym.GenConfig(image_size=128, dpi=16))
    splits = {"train": recs[:4], "bench": recs[4:]}
    ds = geosym.to_hf(splits)
    ds.save_to_disk(str(tmp_path / "hf"))
    import datasets

    back = datasets.load_from_disk(str(tmp_path / "hf"))
    assert back["train"].num_rows == 4 and back["bench"]["answer"] == [r["answer"] for r in
                                                                       recs[4:]]
    img = back["train"][0]["image"]
    assert img.size == (128, 128)
    pytest.importorskip("tensorflow_datasets")
    from lab.data import tfds as ltfds

    builder = geosym.build_tfds(splits, tmp_path / "tfds")
    loaded = ltfds.load(builder.data_dir)
    assert len(loaded["train"]) == 4 and len(loaded["bench"]) == 2
    ex = loaded["train"][1]
    assert ex["answer"] == recs[1]["answer"] and ex["image"].shape == (128, 128, 3)
    from PIL import Image

    orig = np.asarray(Image.open(io.BytesIO(recs[1]["image"])).convert("RGB"))
    np.testing.assert_array_equal(ex["image"], orig)


def test_gen_config_bad_input():
    with pytest.raises(ValueError, match="min_rules"):
        geosym.GenConfig(min_rules=3, max_rules=1)
    with pytest.raises(ValueError, match="kind"):
        geosym.GenConfig(kind="volume")
    with pytest.raises(ValueError, match="base rule"):
        grammar.build("hexagon", [])
    with pytest.raises(ValueError, match="does not apply"):
        grammar.build("circle", [("median", 0)])
