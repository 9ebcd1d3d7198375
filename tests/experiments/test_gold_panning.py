"""experiments/gold_panning.py end to end at the test preset, and its config errors."""

import json
import os

import numpy as np
import pytest

from configs.gold_panning import get_config
from experiments import gold_panning
from lab import zoo
from lab.methods import gold_panning as gp

METHODS = ("single_pass", "psc", "gold_panning", "uncertainty", "bayes_random_order",
           "gold_panning_mismatch")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("gold_panning"))
    return workdir, gold_panning.run(get_config("test"), workdir)


def test_writes_results_report_and_plot(outputs):
    workdir, results = outputs
    for f in ("config.json", "results.json", "report.md", "gold_panning.png"):
        assert os.path.getsize(os.path.join(workdir, f)) > 0, f
    with open(os.path.join(workdir, "results.json")) as f:
        on_disk = json.load(f)
    assert {k: v for k, v in on_disk.items() if k != "plots"} == results
    report = open(os.path.join(workdir, "report.md")).read()
    assert "## Claims" in report and "Diagnosticity profile" in report


def test_curves_profiles_and_claims_are_measured(outputs):
    _, results = outputs
    cfg = get_config("test")
    for key in ("profile", "profile_mismatch"):
        for rate in ("tpr", "fpr"):
            v = np.asarray(results[key][rate])
            assert v.shape == (cfg.real_n,) and ((0 <= v) & (v <= 1)).all()
    real = results["real"]
    for m in METHODS:
        for row in real[m]:
            assert 0 <= row["accuracy"] <= 1 and 0 <= row["f1"] <= 1
            assert row["queries"] <= row["budget"]
    assert [r["budget"] for r in real["psc"]] == list(cfg.psc_m)
    # GOLD PANNING's curve is a prefix of one run: queries never decrease with the budget
    q = [r["queries"] for r in real["gold_panning"]]
    assert q == sorted(q)
    # every query reached the LM and was counted
    assert real["model_queries"] >= cfg.n_eval * (1 + max(cfg.psc_m) + 4)
    assert list(results["sim_rounds"]) == [str(n) for n in cfg.sim.ns]
    assert len(results["claims"]) == 4
    # each claim's verdict is its rule applied to the numbers stored beside it
    fit = results["rounds_fit"]
    assert fit == pytest.approx(gold_panning.fit_log(
        cfg.sim.ns, [results["sim_rounds"][str(n)] for n in cfg.sim.ns]))
    log_claim, mismatch = results["claims"][2], results["claims"][3]
    assert log_claim["measured"] == fit
    assert log_claim["holds"] == (fit["b"] > 0 and fit["r2"] >= cfg.claims.log_r2)
    acc = mismatch["measured"]
    assert acc["gold_panning"] == real["gold_panning"][-1]["accuracy"]
    chance = 1 / cfg.real_n + 2 * np.sqrt((1 / cfg.real_n) * (1 - 1 / cfg.real_n) / cfg.n_eval)
    assert mismatch["holds"] == (
        acc["gold_panning"] > chance and acc["mismatch_profile_signal"] >= cfg.sim.min_signal
        and acc["gold_panning_mismatch"] >= acc["gold_panning"] - cfg.claims.mismatch_gap)
    # the regime, decided on the stored profile and single-pass row
    assert results["regime"] == gold_panning.regime_checks(results)
    spread = np.ptp(np.subtract(results["profile"]["tpr"], results["profile"]["fpr"]))
    assert results["regime"][0]["measured"] == pytest.approx(spread)
    assert results["regime"][1]["measured"] == real["single_pass"][0]["accuracy"]


def _fabricated(tpr, fpr, single):
    return {"profile": {"tpr": tpr, "fpr": fpr},
            "real": {"single_pass": [{"budget": 1, "queries": 1.0, "accuracy": single,
                                      "f1": single}]}}


def test_regime_needs_a_position_bias_and_room_above_one_pass():
    # Lost-in-the-middle reader: TPR 0.85 at the ends, 0.3 in the middle; one pass 0.55.
    bias = gold_panning.regime_checks(_fabricated([0.85, 0.3, 0.35, 0.8], [0.05] * 4, 0.55))
    assert [r["holds"] for r in bias] == [True, True]
    assert bias[0]["measured"] == pytest.approx(0.55) and bias[1]["measured"] == 0.55
    assert "max - min >= 0.1" in bias[0]["check"] and "<= 0.9" in bias[1]["check"]
    # A reader that finds the gold at every slot (TPR 0.92 .. 1.0, the default run's lm-xs-docs)
    # and answers one pass at 0.93: no bias to exploit, nothing left to recover.
    flat = gold_panning.regime_checks(_fabricated([0.92, 1.0, 0.96, 0.97], [0.01] * 4, 0.93))
    assert [r["holds"] for r in flat] == [False, False]
    assert flat[0]["measured"] == pytest.approx(0.08) and flat[1]["measured"] == 0.93
    # the margins are inclusive and the spread is of TPR - FPR, not of TPR alone
    edge = gold_panning.regime_checks(_fabricated([0.5, 0.5], [0.0, 0.1], 0.9))
    assert [r["holds"] for r in edge] == [True, True]
    assert gold_panning.regime_checks(_fabricated([0.5, 0.6], [0.0, 0.1], 0.91))[0][
        "measured"] == pytest.approx(0.0)


def test_main_table_is_the_real_lm_rows():
    row = {"budget": 1, "queries": 1.0, "accuracy": 0.5, "f1": 0.4}
    real = {m: [row] for m in METHODS}
    table = gold_panning.main_table({"real": real})
    assert [r["method"] for r in table] == list(METHODS)
    assert table[0] == {"method": "single_pass", "budget": 1, "mean queries": 1.0,
                        "accuracy": 0.5, "F1": 0.4}


def test_fit_log_recovers_a_log_law():
    ns = [8, 16, 32, 64]
    fit = gold_panning.fit_log(ns, [1.0 + 2.0 * np.log(n) for n in ns])
    assert fit["a"] == pytest.approx(1.0) and fit["b"] == pytest.approx(2.0)
    assert fit["r2"] == pytest.approx(1.0)


def test_queries_to_match_finds_the_first_budget_at_psc_f1():
    curves = {"psc": [{"f1": 0.5, "queries": 1.0, "budget": 1},
                      {"f1": 0.8, "queries": 8.0, "budget": 8}],
              "gold_panning": [{"f1": 0.6, "queries": 1.0}, {"f1": 0.85, "queries": 3.5},
                               {"f1": 0.9, "queries": 4.0}]}
    m = gold_panning.queries_to_match(curves, 8)
    assert m["gp_queries"] == 3.5 and m["saving"] == pytest.approx(1 - 3.5 / 8)
    assert gold_panning.queries_to_match(curves, 8, tol=0.25)["gp_queries"] == 1.0
    assert gold_panning.queries_to_match(curves, 1)["gp_queries"] == 1.0


@pytest.mark.parametrize("key, value, match", [
    ("gp.threshold", 1.5, "gp.threshold=1.5"),
    ("real_n", 1, "real_n=1"),
    ("gp.floor", 0.0, "gp.floor=0.0"),
    ("psc_m", [0, 2], "psc_m"),
    ("sim.ns", [8], "sim.ns"),
    ("claims.psc_m", 3, "claims.psc_m=3"),
])
def test_bad_config_fails_before_any_work(tmp_path, key, value, match):
    cfg = get_config("test")
    node = cfg
    *head, last = key.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    before = sum(zoo.TRAININGS.values())
    with pytest.raises(ValueError, match=match):
        gold_panning.run(cfg, str(tmp_path / "out"))
    assert sum(zoo.TRAININGS.values()) == before and not (tmp_path / "out").exists()


def test_unknown_config_key_is_named(tmp_path):
    cfg = get_config("test")
    cfg.gp.thresold = 0.5
    with pytest.raises(ValueError, match="gp.thresold"):
        gold_panning.run(cfg, str(tmp_path))


def test_simulated_query_matches_lm_interface():
    prof = gp.make_profile([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    q = gp.simulated_query(prof, np.array([2, 0]))
    obs = q(np.array([0, 1]), np.array([[2, 0, 1], [1, 2, 0]]))
    assert obs.tolist() == [0, 2]  # the position holding each row's gold document


def test_claim_rules_hold_and_fail_on_fabricated_results():
    c = get_config("test")
    good = {"psc_f1": 0.9, "psc_queries": 8, "gp_queries": 3.0, "saving": 0.625}
    sims = {ns: dict(good) for ns in c.sim.ns}
    fit = {"a": 1.0, "b": 0.5, "r2": 0.95}
    acc = {"gold_panning": 0.9, "gold_panning_mismatch": 0.9 - c.claims.mismatch_gap / 2,
           "mismatch_profile_signal": c.sim.min_signal + 0.1}

    def holds(**change):
        args = {"match_real": good, "match_sim": sims, "fit": fit, "acc": acc, **change}
        return [x["holds"] for x in gold_panning.claim_rules(c, 16, **args)]

    assert holds() == [True] * 4
    few = {**good, "saving": c.claims.min_saving / 2}                  # too small a saving
    assert holds(match_real=few) == [False, True, True, True]
    assert holds(match_real={**good, "gp_queries": None}) == [False, True, True, True]
    assert holds(match_real={**good, "psc_f1": 1 / 16}) == [False, True, True, True]  # chance
    assert holds(match_sim={**sims, c.sim.ns[0]: few}) == [True, False, True, True]
    assert holds(fit={**fit, "b": -0.1}) == [True, True, False, True]
    assert holds(fit={**fit, "r2": c.claims.log_r2 - 0.1}) == [True, True, False, True]
    worse = {**acc, "gold_panning_mismatch": 0.9 - 2 * c.claims.mismatch_gap}
    assert holds(acc=worse) == [True, True, True, False]
    flat = {**acc, "mismatch_profile_signal": c.sim.min_signal / 2}   # no signal to mismatch
    assert holds(acc=flat) == [True, True, True, False]
