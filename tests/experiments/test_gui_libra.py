"""The GUI-Libra experiment end to end at the ``test`` preset; its claim and regime rules on
fabricated results (each seen holding and failing); the rank correlation on hand cases."""

import json
import math
import os

import pytest

from configs.gui_libra import get_config
from experiments import gui_libra as exp


def test_gui_libra_runs_end_to_end_at_the_test_preset(tmp_path):
    # The session's zoo cache: the notebook's run of the same preset reuses the policies.
    results = exp.run(get_config("test"), str(tmp_path / "out"))
    for name in ("config.json", "results.json", "report.md", "gui_libra.png"):
        assert os.path.exists(tmp_path / "out" / name), name
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 6
    assert len(results["regime"]) == 4
    assert set(results["arms"]) == set(exp.ARMS) and set(results["shortcuts"]) == {
        "first", "majority", "random"}
    assert [r["policy"] for r in exp.main_table(results)][:5] == list(exp.ARMS)
    for arm in exp.ARMS:  # every trained arm has its checkpoint evaluations
        assert results["curves"][arm] and "success" in results["curves"][arm][-1]
    assert results["policies"]["sft"][0] in ("trained", "cached")


def _arm(step, ground, success):
    return {"step_accuracy": step, "grounding_accuracy": ground, "success": success}


def _fab(aware=(0.82, 0.83, 0.55), plain=(0.70, 0.72, 0.35), long=(0.6, 0.55, 0.2),
         rl=(0.85, 0.86, 0.7), rl_plain=(0.84, 0.85, 0.6), rho=0.8, n_off=500, n_on=200,
         shortcuts=(0.31, 0.27, 0.26), chance=0.3, multi=0.15):
    arms = {"sft_action_aware": _arm(*aware), "sft_no_reweight": _arm(*plain),
            "sft_long_cot": _arm(*long), "rl_adaptive": _arm(*rl), "rl_plain": _arm(*rl_plain)}
    sc = {n: _arm(v, v, 0.0) for n, v in zip(("first", "majority", "random"), shortcuts,
                                              strict=True)}
    return {"arms": arms, "shortcuts": sc, "chance": chance, "multi_valid": multi,
            "spearman": rho, "n_offline": n_off, "n_online": n_on}


def _holds(rules):
    return [r["holds"] for r in rules]


def test_claims_hold_on_a_case_built_for_them_and_fail_one_by_one():
    assert _holds(exp.claim_rules(_fab())) == [True] * 6
    same = (0.82, 0.83, 0.55)
    assert _holds(exp.claim_rules(_fab(plain=same)))[:2] == [False, False]
    assert not exp.claim_rules(_fab(long=(0.6, 0.83, 0.2)))[2]["holds"]
    assert not exp.claim_rules(_fab(rl=(0.85, 0.86, 0.57)))[3]["holds"]  # within 2 SE
    assert not exp.claim_rules(_fab(rl_plain=(0.84, 0.85, 0.7)))[4]["holds"]
    assert not exp.claim_rules(_fab(rho=0.3))[5]["holds"]
    assert not exp.claim_rules(_fab(rho=float("nan")))[5]["holds"]
    # The same differences on too few episodes are not significant.
    assert not exp.claim_rules(_fab(n_on=10))[0]["holds"]


def test_regime_holds_in_range_and_fails_outside():
    assert _holds(exp.regime_rules(_fab())) == [True] * 4
    assert not exp.regime_rules(_fab(aware=(0.38, 0.4, 0.3)))[0]["holds"]   # near shortcuts
    assert not exp.regime_rules(_fab(aware=(0.99, 0.99, 0.5)))[0]["holds"]  # nothing left
    assert not exp.regime_rules(_fab(aware=(0.8, 0.8, 0.95)))[1]["holds"]
    assert not exp.regime_rules(_fab(shortcuts=(0.6, 0.27, 0.26)))[2]["holds"]
    assert not exp.regime_rules(_fab(multi=0.02))[3]["holds"]


def test_spearman_on_hand_cases():
    assert exp.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert exp.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert exp.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert exp.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(exp.spearman([1, 1, 1], [1, 2, 3]))


def test_bad_config_is_refused_naming_the_key():
    c = get_config("test")
    c.rl.group_size = 1
    with pytest.raises(ValueError, match="rl.group_size"):
        exp.check_config(c)


def test_a_final_model_evaluated_twice_counts_once():
    a = {"step_accuracy": 0.5, "success": 0.2}
    b = {"step_accuracy": 0.7, "success": 0.4}
    curve = [{"step": 266, **a}, {"step": 532, **b}, {"step": 534, **b}]
    assert [c["step"] for c in exp.distinct_checkpoints(curve)] == [266, 532]
    assert exp.distinct_checkpoints([]) == []
