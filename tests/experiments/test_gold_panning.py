"""experiments/gold_panning.py end to end at the test preset, the Hugging Face path on a tiny
random Qwen3 checkpoint written here, the claim and regime rules on fabricated results, its
config errors, and (slow) the default reader's regime."""

import json
import os

import numpy as np
import pytest

from configs.gold_panning import get_config
from experiments import gold_panning
from lab import zoo
from lab.methods import gold_panning as gp
from tests.checkpoints import tiny_qwen3

METHODS = ("single_pass", "psc", "gold_panning", "info_gain", "bayes_random_order",
           "gold_panning_mismatch", "bayes_random_order_mismatch")


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
    for m in METHODS:  # answer-level F1 beside target identification, on every row
        assert all(0 <= r["answer_f1"] <= 1 and r["answer_f1"] >= r["accuracy"] - 1e-9
                   for r in real[m])
    assert list(results["sim_rounds"]) == [str(n) for n in cfg.sim.ns]
    assert list(results["real_by_n"]) == [str(n) for n in cfg.real_ns]
    assert results["real_rounds_fit"] == pytest.approx(gold_panning.fit_log(
        cfg.real_ns, [results["real_by_n"][str(n)]["rounds"] for n in cfg.real_ns]))
    assert results["task"] == {"n_docs": cfg.real_n, "n_near": cfg.n_near,
                               "generator": "kv_near_miss"}
    # each claim's verdict is its rule applied to the stored numbers
    assert results["claims"] == gold_panning.claim_rules(cfg, results)
    assert len(results["claims"]) == 5
    fit = results["rounds_fit"]
    assert fit == pytest.approx(gold_panning.fit_log(
        cfg.sim.ns, [results["sim_rounds"][str(n)] for n in cfg.sim.ns]))
    assert results["claims"][2]["measured"] == fit
    acc = results["claims"][4]["measured"]
    assert acc["gold_panning"] == real["gold_panning"][-1]["accuracy"]
    assert acc["bayes_random_order_mismatch"] == real["bayes_random_order_mismatch"][-1][
        "accuracy"]
    assert acc["single_pass"] == real["single_pass"][0]["accuracy"]
    # the regime, decided on the stored profile and single-pass row (no PSC row at m=8 here)
    assert results["regime"] == gold_panning.regime_checks(results)
    assert len(results["regime"]) == 3
    assert results["regime"][0]["measured"] == pytest.approx(np.ptp(results["profile"]["tpr"]))
    assert results["regime"][2]["measured"] == real["single_pass"][0]["accuracy"]


def _fabricated(tpr, fpr, single, psc8=None):
    real = {"single_pass": [{"budget": 1, "queries": 1.0, "accuracy": single, "f1": single}],
            "psc": [] if psc8 is None else [{"budget": 8, "queries": 8.0, "accuracy": psc8,
                                             "f1": psc8}]}
    return {"profile": {"tpr": tpr, "fpr": fpr}, "real": real}


def test_regime_needs_a_position_bias_and_room_above_one_pass():
    # Lost in the middle: TPR 0.85 at the ends, 0.3 in the middle; one pass 0.55, PSC-8 0.8.
    bias = gold_panning.regime_checks(_fabricated([0.85, 0.3, 0.35, 0.8], [0.05] * 4, 0.55,
                                                  psc8=0.8))
    assert [r["holds"] for r in bias] == [True, True, True, True]
    assert bias[0]["measured"] == pytest.approx(0.55) and bias[3]["measured"] == pytest.approx(
        0.25)
    assert "best - worst >= 0.2" in bias[0]["check"] and "<= 0.9" in bias[2]["check"]
    # The old default's lm-xs-docs on exact lookup at N=16: TPR 0.92 .. 1.0, one pass 0.93,
    # PSC-8 0.98: no bias to exploit, nothing left to recover.
    flat = gold_panning.regime_checks(_fabricated([0.92, 1.0, 0.96, 0.97], [0.01] * 4, 0.93,
                                                  psc8=0.98))
    assert [r["holds"] for r in flat] == [False, False, False, False]
    assert flat[0]["measured"] == pytest.approx(0.08)
    # sampling noise: a per-position spread of 0.3 from one outlier among 8 flat positions,
    # while the 4 group means span only 0.15
    noisy = gold_panning.regime_checks(_fabricated([0.5] * 7 + [0.2], [0.0] * 8, 0.5, 0.7))
    assert [r["holds"] for r in noisy] == [True, False, True, True]
    assert noisy[1]["measured"] == pytest.approx(0.15)
    # the bounds are inclusive; PSC only slightly above one pass is not "clearly below"
    edge = gold_panning.regime_checks(_fabricated([0.5, 0.7], [0.0, 0.0], 0.9, 0.95))
    assert [r["holds"] for r in edge] == [True, True, True, False]


def test_main_table_is_the_real_lm_rows():
    row = {"budget": 1, "queries": 1.0, "accuracy": 0.5, "f1": 0.4, "answer_f1": 0.6}
    real = {m: [row] for m in METHODS}
    table = gold_panning.main_table({"real": real})
    assert [r["method"] for r in table] == list(METHODS)
    assert table[0] == {"method": "single_pass", "budget": 1, "mean queries": 1.0,
                        "accuracy": 0.5, "F1": 0.4, "answer F1": 0.6}


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
    ("real_ns", [2, 3], r"real_ns=\[2, 3\].*real_n=4"),
    ("n_near", 3, "n_near=3"),
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


def _curve(accuracy, queries=1.0, budget=1):
    return {"budget": budget, "queries": queries, "accuracy": accuracy, "f1": accuracy}


def _fabricated_results(c, *, psc=0.6, gp_f1=0.62, gp_queries=3.0, sim_saving=True,
                        fit_b=0.5, real_fit_b=0.5, mismatch=0.6, random_mm=0.4, single=0.3,
                        signal=0.5):
    """A results dict for :func:`claim_rules`: PSC reaches ``psc`` at m = claims.psc_m,
    GOLD PANNING reaches ``gp_f1`` after ``gp_queries`` and keeps it to the top budget."""
    def curves(psc_f1, gp_acc, gp_q):
        top = max(c.budgets)
        return {"psc": [_curve(psc_f1, float(c.claims.psc_m), c.claims.psc_m)],
                "gold_panning": [_curve(0.2), _curve(gp_acc, gp_q, top)],
                "gold_panning_mismatch": [_curve(mismatch, gp_q, top)],
                "bayes_random_order_mismatch": [_curve(random_mm, 5.0, top)],
                "single_pass": [_curve(single)]}
    sim_q = gp_queries if sim_saving else c.claims.psc_m * (1 - c.claims.min_saving / 2)
    return {"real": curves(psc, gp_f1, gp_queries),
            "sim": {str(n): curves(0.9, 0.92, sim_q) for n in c.sim.ns},
            "rounds_fit": {"a": 1.0, "b": fit_b, "r2": 0.95},
            "real_rounds_fit": {"a": 1.0, "b": real_fit_b, "r2": 0.95},
            "mismatch_profile_signal": signal}


def test_claim_rules_hold_and_fail_on_fabricated_results():
    c = get_config("default")   # N = 32, 64 prompts: the default's standard errors

    def holds(**change):
        return [x["holds"] for x in gold_panning.claim_rules(c, _fabricated_results(c, **change))]

    assert holds() == [True] * 5
    # a saving below min_saving (8 shuffles vs 6 queries = 25% < 30%)
    assert holds(gp_queries=6.0) == [False, False, True, True, True]
    assert holds(sim_saving=False) == [True, False, True, True, True]
    assert holds(gp_f1=0.55) == [False, True, True, True, True]       # never reaches PSC's F1
    assert holds(psc=1 / 32) == [False, True, True, True, True]       # PSC at chance
    assert holds(fit_b=-0.1) == [True, True, False, True, True]       # rounds fall with N
    assert holds(real_fit_b=-0.1) == [True, True, True, False, True]
    # the mismatch claim: within the gap of matched, beats random-order Bayes and one pass
    # under the mismatched profile by two standard errors (0.17 at 64 prompts, rate 0.5)
    assert holds(mismatch=0.62 - 2 * c.claims.mismatch_gap) == [True, True, True, True, False]
    assert holds(random_mm=0.55) == [True, True, True, True, False]   # only 0.05 above random
    assert holds(single=0.5) == [True, True, True, True, False]       # only 0.1 above one pass
    assert holds(signal=c.sim.min_signal / 2) == [True, True, True, True, False]
    # matched at chance: nothing for a mismatch to lose
    assert holds(gp_f1=1 / 32, mismatch=1 / 32, random_mm=0.0, single=0.0)[4] is False


def test_hf_path_on_a_tiny_random_qwen3(tmp_path):
    """``--config.model=<hf dir>``: a Qwen3 checkpoint loaded by lab.zoo.load_model runs the
    whole experiment, and the report names the directory."""
    tiny_qwen3(tmp_path, "D1: kwfb=417.\nD2: qczd=925.\nkwfb=?\nkwfb=417\nA: 417")
    config = get_config("test")
    config.model = config.model_mismatch = str(tmp_path)
    out = gold_panning.run(config, str(tmp_path / "out"))
    assert out["zoo"] == {"model": str(tmp_path), "mismatch": str(tmp_path)}
    assert out["real"]["model_queries"] >= config.n_eval * (1 + max(config.psc_m) + 5)
    assert str(tmp_path) in open(tmp_path / "out" / "report.md").read()


@pytest.mark.deep
def test_default_reader_has_the_regime():
    """The default's reader (lm-xs-docs, shipped) on the default's task (N = 32, 4 near-miss
    distractors): TPR spans >= 0.2 over positions and over groups of positions, one pass
    answers <= 0.9 and PSC at 8 shuffles >= 0.1 more (the regime_checks thresholds). The
    default run measured TPR 0 .. 0.71 (groups 0.08 .. 0.55), one pass 0.38, PSC-8 0.61."""
    c = get_config("default")
    model, tok, _ = gold_panning.load_lm(c.model, c.zoo)
    prof = gold_panning.calibrate(model, tok, c.real_n, c.n_calib, c.batch_size,
                                  gold_panning.CALIB_SEED, c.n_near)
    ds = gold_panning.documents(32, gold_panning.EVAL_SEED, c.real_n, c.n_near)
    gold = np.asarray(ds["gold_doc"])
    q = gold_panning.LMQuery(model, tok, ds, c.batch_size)
    single = float(np.mean(gp.single_pass(q, c.real_n, len(gold)) == gold))
    psc8 = float(np.mean(gp.psc(q, c.real_n, len(gold), 8)[:, -1] == gold))
    checks = gold_panning.regime_checks(_fabricated(prof.tpr, prof.fpr, single, psc8))
    assert [r["holds"] for r in checks] == [True] * 4, checks
