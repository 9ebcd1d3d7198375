"""experiments/geomem.py end to end at the test preset, and its config errors."""

import json
import os

import ml_collections
import pytest

from configs.geomem import get_config
from experiments import geomem


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("geomem"))
    return workdir, geomem.run(get_config("test"), workdir)


def test_writes_config_results_report_and_plots(outputs):
    workdir, results = outputs
    for f in ("config.json", "results.json", "report.md", "dims_vs_logn.png",
              "accuracy_vs_dim.png", "multihop.png"):
        assert os.path.getsize(os.path.join(workdir, f)) > 0, f
    with open(os.path.join(workdir, "results.json")) as f:
        on_disk = json.load(f)
    assert on_disk == results
    assert json.load(open(os.path.join(workdir, "config.json")))["preset"] == "test"
    report = open(os.path.join(workdir, "report.md")).read()
    assert "## Claims" in report and "![dims_vs_logn.png](dims_vs_logn.png)" in report


def test_results_hold_the_issue_fields_and_rule_decided_claims(outputs):
    _, results = outputs
    cfg = get_config("test")
    table = {row["n"]: row for row in results["table"]}
    for n in cfg.train.ns:
        assert table[n]["d_train"] is None or table[n]["d_train"] in cfg.train.d_grid
    for n in cfg.construction.ns:  # construction width d = m + R, m on the grid
        assert table[n]["d_construction"] - cfg.n_relations in cfg.construction.m_grid
    # The construction needs more room as N grows, but far less than N does.
    d = [table[n]["d_construction"] for n in cfg.construction.ns]
    assert d == sorted(d) and d[-1] / d[0] < cfg.construction.ns[-1] / cfg.construction.ns[0] / 4
    p = results["probe"]
    assert p["superposition_construction"]["r2_heldout"] > 0.999
    assert p["gating_construction"]["selectivity"] > 0.999
    assert 0.0 <= p["zero_shot_accuracy"] <= 1.0
    assert len(results["claims"]) == 10 and len(results["regime"]) == 9
    # the stored verdicts are the rules applied to the stored numbers
    assert geomem._claims(results, cfg) == results["claims"]
    sup = results["claims"][2]
    assert sup["measured"]["trained"] == p["superposition"]["r2_heldout"]
    assert sup["holds"] == (p["superposition"]["r2_heldout"] >= cfg.claims.superposition_r2)
    assert geomem.regime_checks(results, cfg) == results["regime"]
    # The counting bound is compared per N: d / bound as the main table states it.
    for row in results["table"]:
        if row["d_construction"] is not None:
            assert row["construction_over_bound"] == pytest.approx(
                row["d_construction"] / row["d_bound_1bit"])


def fabricated(cfg):
    """Results where every claim and regime rule holds, shaped as geomem.run writes them."""
    from lab.methods.geomem import capacity

    r, target = cfg.n_relations, cfg.target_accuracy

    def cons_row(n):
        d = round(2.5 * capacity.bound_dim(n, r, 1.0))
        return {"n": n, "m": d - r, "d": d}

    lo = min(cfg.train.d_grid)
    ns = [64, 128, 256, 512, 1024]
    depth = []
    for hops, d_cot in ((1, 44), (2, 48), (3, 50)):
        b = capacity.bound_dim(1024, r ** hops, 1.0)
        d_no = round(2.5 * b)
        depth.append({"hops": hops, "m_no_cot": d_no - hops * r, "m_cot": d_cot - r,
                      "d_no_cot": d_no, "d_cot": d_cot, "ratio_no_cot": d_no / b})
    train = [{"d": d, "cot": c, "no_cot": o, "cot_follows_corruption": 0.98} for d, c, o in
             ((4, 0.9, 0.3), (6, 0.995, 0.5), (8, 1.0, 0.8), (12, 1.0, 0.95), (16, 1.0, target))]
    return {
        "construction": [cons_row(n) for n in (16, 64, 256, 1024, 4096)],
        "train": [{"n": n, "d": lo + 1 + k} for k, n in enumerate(ns)],
        "probe": {"n": 1024, "d": 16, "superposition": {"r2_heldout": 0.95},
                  "superposition_random": {"r2_heldout": 0.0}, "gating": {"selectivity": 0.7},
                  "gating_init": {"selectivity": 0.3}, "gating_construction": {"selectivity": 1},
                  "zero_shot_accuracy": 0.95, "random_table_accuracy": 0.001,
                  "refit_subjects_trained_network": 0.6, "refit_subjects_random_network": 0.1,
                  "accuracy_before_transfer": 1.0},
        "multihop": {"n": 1024, "train_n": 256, "construction": depth, "train": train},
        "shortcuts": {"train_1hop": {"relation_only": 1 / 1024, "copy_subject": 2 / 1024,
                                     "chance": 1 / 1024, "n": 1024}},
    }


def _set(res, path, value):
    *head, last = path.split(".")
    node = res
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value


CLAIM_BREAKS = [  # (claim index, what is changed) - each must turn that claim false
    (0, lambda res: [row.update(d=30, m=28) for row in res["construction"]]),  # flat d
    (0, lambda res: [row.update(d=50 - 4 * k, m=48 - 4 * k)  # falling d
                     for k, row in enumerate(res["construction"])]),
    (0, lambda res: res.update(construction=res["construction"][:3])),  # three N values
    (0, lambda res: _set(res, "construction.2.d", None)),  # one N misses 99%
    (1, lambda res: [row.update(d=8) for row in res["train"]]),
    (1, lambda res: [row.update(d=10 - k) for k, row in enumerate(res["train"])]),
    (1, lambda res: res.update(train=res["train"][:4])),  # four N values
    (1, lambda res: [row.update(d=2 + row["n"] // 64) for row in res["train"]]),  # linear in N
    (2, lambda res: _set(res, "probe.superposition.r2_heldout", 0.89)),
    (3, lambda res: _set(res, "probe.gating.selectivity", 0.49)),
    (3, lambda res: _set(res, "probe.gating_init.selectivity", 0.8)),  # not above init
    (4, lambda res: _set(res, "probe.zero_shot_accuracy", 0.89)),
    (5, lambda res: _set(res, "probe.refit_subjects_random_network", 0.55)),
    (6, lambda res: _set(res, "construction.4.d", 120)),  # ratio to the bound jumps at one N
    (6, lambda res: [row.update(d=40) for row in res["construction"]]),  # flat: ratio falls
    (7, lambda res: _set(res, "multihop.construction.2.ratio_no_cot", 6.0)),
    (7, lambda res: _set(res, "multihop.construction.2.d_cot", 80)),  # CoT grows with hops
    (7, lambda res: res["multihop"].update(construction=res["multihop"]["construction"][:1])),
    (8, lambda res: [row.update(no_cot=row["cot"]) for row in res["multihop"]["train"]]),
    (8, lambda res: [row.update(cot=0.9) for row in res["multihop"]["train"]]),  # CoT never 99%
    (9, lambda res: [row.update(cot=row["no_cot"] - 0.01) for row in res["multihop"]["train"]]),
]

_TEST = get_config("test")
REGIME_BREAKS = [  # (regime index, what is changed)
    (0, lambda res: _set(res, "construction.0.m", min(_TEST.construction.m_grid))),  # grid's
    (0, lambda res: _set(res, "construction.3.m", None)),  # first point passes; none passes
    (1, lambda res: _set(res, "train.0.d", min(_TEST.train.d_grid))),
    (1, lambda res: _set(res, "train.4.d", None)),
    (2, lambda res: _set(res, "multihop.construction.1.m_cot", None)),
    (2, lambda res: _set(res, "multihop.construction.0.m_no_cot", min(_TEST.multihop.m_grid))),
    (3, lambda res: _set(res, "multihop.train.0.no_cot", 0.995)),  # one pass at ceiling
    (4, lambda res: _set(res, "multihop.train.4.cot", 0.9) or
     _set(res, "multihop.train.4.no_cot", 0.9)),  # neither arm learns the task
    (5, lambda res: _set(res, "multihop.train.4.cot_follows_corruption", 0.4)),  # bypasses e_1
    (6, lambda res: _set(res, "probe.random_table_accuracy", 0.2)),
    (6, lambda res: _set(res, "probe.superposition_random.r2_heldout", 0.3)),
    (7, lambda res: _set(res, "shortcuts.train_1hop.copy_subject", 6 / 1024)),
    (8, lambda res: _set(res, "probe.accuracy_before_transfer", 0.95)),
]


def test_fabricated_results_hold_every_claim_and_regime_check():
    cfg = get_config("test")
    res = fabricated(cfg)
    assert [c["holds"] for c in geomem._claims(res, cfg)] == [True] * 10
    assert [c["holds"] for c in geomem.regime_checks(res, cfg)] == [True] * 9


@pytest.mark.parametrize("index, edit", CLAIM_BREAKS)
def test_each_claim_rule_fails_on_numbers_that_break_it(index, edit):
    cfg = get_config("test")
    res = fabricated(cfg)
    edit(res)
    assert not geomem._claims(res, cfg)[index]["holds"]


@pytest.mark.parametrize("index, edit", REGIME_BREAKS)
def test_each_regime_check_fails_on_numbers_that_break_it(index, edit):
    cfg = get_config("test")
    res = fabricated(cfg)
    edit(res)
    checks = geomem.regime_checks(res, cfg)
    assert not checks[index]["holds"]
    assert sum(not c["holds"] for c in checks) >= 1


def test_every_claim_and_regime_rule_is_broken_by_some_case():
    assert {i for i, _ in CLAIM_BREAKS} == set(range(10))
    assert {i for i, _ in REGIME_BREAKS} == set(range(9))


def _loose(cfg):
    return ml_collections.ConfigDict(cfg.to_dict(), type_safe=False)


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.__setitem__("n_relation", 2), "unknown config keys ['n_relation']"),
    (lambda c: c.train.__setitem__("steps", "100"), "config.train.steps='100' has type str"),
    (lambda c: c.construction.__setitem__("ns", [0, 64]),
     "config.construction.ns=[0, 64] is invalid; expected a non-empty list of ints >= 2"),
    (lambda c: c.__setitem__("n_relations", 1), "config.n_relations=1 is invalid"),
    (lambda c: c.train.__setitem__("d_grid", []), "config.train.d_grid=[] is invalid"),
    (lambda c: c.__setitem__("preset", "huge"), "preset='huge' is unknown"),
])
def test_bad_config_fails_before_any_work(tmp_path, edit, needle):
    cfg = _loose(get_config("test"))
    edit(cfg)
    with pytest.raises(ValueError) as e:
        geomem.run(cfg, str(tmp_path / "w"))
    assert needle in str(e.value)
    assert not os.path.exists(tmp_path / "w")
