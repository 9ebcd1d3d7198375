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
    assert len(results["claims"]) == 8
    # the stored verdicts are the rules applied to the stored numbers
    assert geomem._claims(results, cfg) == results["claims"]
    sup = results["claims"][2]
    assert sup["measured"]["trained"] == p["superposition"]["r2_heldout"]
    assert sup["holds"] == (p["superposition"]["r2_heldout"] >= cfg.claims.superposition_r2)
    # Capacity-depth: the one-pass construction needs more width for two hops than CoT does.
    depth = results["multihop"]["construction"]
    assert depth[1]["d_no_cot"] > depth[1]["d_cot"]


def test_claim_rules_flip_with_the_numbers(outputs):
    """The probe and multi-hop claims on the run's results with chosen numbers put in: each
    holds just past its threshold and fails just short of it."""
    import copy

    _, results = outputs
    cfg = get_config("test")
    th = cfg.claims

    def verdicts(**probe):
        res = copy.deepcopy(results)
        gains = probe.pop("cot_gain")
        res["probe"]["superposition"]["r2_heldout"] = probe["r2"]
        res["probe"]["gating"]["selectivity"] = probe["sel"]
        res["probe"]["gating_init"]["selectivity"] = 0.3
        res["probe"]["zero_shot_accuracy"] = probe["zero_shot"]
        res["probe"]["refit_subjects_trained_network"] = 0.5 + probe["refit"]
        res["probe"]["refit_subjects_random_network"] = 0.5
        res["multihop"]["train"] = [{"two_hop_cot": 0.5 + g, "two_hop_no_cot": 0.5}
                                    for g in gains]
        claims = geomem._claims(res, cfg)
        return [claims[i]["holds"] for i in (2, 3, 4, 5, 7)]  # sup., gating, zero-shot, refit, CoT

    eps = 1e-3
    assert verdicts(r2=th.superposition_r2 + eps, sel=max(th.gating_selectivity, 0.3) + eps,
                    zero_shot=th.zero_shot_accuracy + eps, refit=th.refit_margin + eps,
                    cot_gain=[0.2, -0.1]) == [True, True, True, True, True]
    assert verdicts(r2=th.superposition_r2 - eps, sel=0.3,  # not above initialisation
                    zero_shot=th.zero_shot_accuracy - eps, refit=th.refit_margin - eps,
                    cot_gain=[0.1, -0.2]) == [False, False, False, False, False]


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
