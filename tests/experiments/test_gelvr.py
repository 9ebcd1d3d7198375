"""The GeLVR / GePO experiment end to end at the ``test`` preset, and its claim and regime
rules on fabricated results (each rule seen holding and failing)."""

import json
import os

import numpy as np
import pytest

from configs.gelvr import get_config
from experiments import gelvr as exp
from lab.data import image_qa
from lab.methods.gelvr.training import PerceptionData


def test_gelvr_runs_end_to_end_at_the_test_preset(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "gelvr.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 6
    assert results["claims"] == exp.claim_rules(results)
    assert results["regime"] == exp.regime_rules(results) and len(results["regime"]) == 5
    seeds = len(get_config("test").seeds)
    for name in (*exp.VARIANTS, "zoo model"):
        assert len(results["accuracy"][name]) == seeds, name
        for per_seed in results["accuracy"][name]:
            assert set(per_seed) == {"high", "low"}
            assert all(0.0 <= v <= 1.0 for v in per_seed.values())
    rows = [r["variant"] for r in exp.main_table(results)]
    assert rows[:len(exp.VARIANTS)] == list(exp.VARIANTS)
    assert "| gelvr |" in (tmp_path / "report.md").read_text()


def _acc(gelvr=0.6, latent=0.5, text=0.5, direct=0.5, gepo=0.7, gauss=0.6, no_reg=0.6,
         gap=0.1, seeds=2):
    """Per-variant accuracies (the same on every seed; full resolution ``gap`` above low)
    where every claim holds at the defaults."""
    def per(v):
        return [{"high": v + gap / 2, "low": v - gap / 2} for _ in range(seeds)]
    return {"direct": per(direct), "text_cot": per(text), "latent": per(latent),
            "gelvr": per(gelvr), "gepo": per(gepo), "gepo_no_reg": per(no_reg),
            "gaussian_rl": per(gauss), "zoo model": per(0.4)}


def _measured(**kw):
    m = {"question_only": kw.pop("question_only", 0.26), "shortcut": kw.pop("shortcut", 0.27),
         "chance": 0.25, "gepo_reward": kw.pop("reward", 0.5)}
    return dict(m, accuracy=_acc(**kw))


def _holds(rules):
    return [r["holds"] for r in rules]


def test_claim_and_regime_rules_hold_on_a_case_built_to_hold():
    m = _measured()
    assert _holds(exp.claim_rules(m)) == [True] * 6
    assert _holds(exp.regime_rules(m)) == [True] * 5


@pytest.mark.parametrize("i, kwargs", [
    (0, dict(latent=0.59)),           # the geometry loss adds less than the margin
    (1, dict(text=0.65)),             # the text chain is better
    (2, dict(direct=0.6)),            # no gain over answering directly
    (3, dict(gepo=0.61, gauss=0.5, no_reg=0.5)),   # RL barely moves the SFT model
    (4, dict(gauss=0.7)),             # the Gaussian policy does as well
    (5, dict(no_reg=0.71)),           # the regulariser does not help
])
def test_each_claim_rule_fails_on_a_case_built_to_fail(i, kwargs):
    holds = _holds(exp.claim_rules(_measured(**kwargs)))
    assert not holds[i] and sum(holds) == 5


def test_a_gain_on_one_seed_only_does_not_hold():
    m = _measured()
    m["accuracy"]["latent"][1] = {"high": 0.7, "low": 0.7}    # seed 1: latent above gelvr
    (c,) = [c for c in exp.claim_rules(m) if "without the geometry" in c["claim"]]
    assert c["measured"]["mean"] < 0.02 or min(c["measured"]["per_seed"]) < 0
    assert not c["holds"]


@pytest.mark.parametrize("i, kwargs", [
    (0, dict(direct=0.3)),            # fine-tuning barely above chance
    (0, dict(direct=0.88, gelvr=0.95, gepo=0.99, gap=0.1)),   # full resolution at ceiling
    (1, dict(gap=0.02)),              # the resolutions do not differ
    (2, dict(question_only=0.4)),     # the question answers
    (3, dict(shortcut=0.45)),         # the option present in the image answers
    (4, dict(reward=0.97)),           # RL's reward is saturated
])
def test_each_regime_rule_fails_on_a_case_built_to_fail(i, kwargs):
    assert not _holds(exp.regime_rules(_measured(**kwargs)))[i]


def test_bad_config_names_the_key():
    c = get_config("test")
    c.task.low_factor = 3
    with pytest.raises(ValueError, match=r"config.task.low_factor=3 is invalid; expected a "
                                         r"divisor of task.size=16"):
        exp.check_config(c)
    c = get_config("test")
    c.num_slots = 1
    with pytest.raises(ValueError, match=r"num_slots"):
        exp.check_config(c)
    c = get_config("test")
    c.sft.slot_coef = -1.0
    with pytest.raises(ValueError, match=r"sft.slot_coef"):
        exp.check_config(c)


def _rows(n, **kw):
    ds = image_qa(n, 0, size=32, low_size=16, object_size=(7, 9), question_types="match",
                  **kw)
    return PerceptionData(list(ds["question"]), list(ds["options"]),
                          np.asarray(ds["answer_index"]), None, None, None, None,
                          np.asarray(ds["question_type"]), list(ds["objects"]))


def test_unbound_shortcut_reads_kinds_on_match_and_is_closed_by_the_lures():
    # match's options are kinds: with lures every option is in the picture (chance); with
    # no distractors only the answer's kind is, and the shortcut answers every row
    assert abs(exp.unbound_shortcut(_rows(800, distractors=6), 0) - 0.25) < 0.05
    assert exp.unbound_shortcut(_rows(100, distractors=0), 0) == 1.0
