"""The Agent-REINFORCE experiment end to end at the ``test`` preset; its claim and regime
rules on fabricated results (each seen holding and failing); bad configs."""

import copy
import json
import os

import pytest

from configs.agent_reinforce import get_config
from experiments import agent_reinforce as exp


@pytest.mark.slow
def test_agent_reinforce_runs_end_to_end_at_the_test_preset(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "agent_reinforce.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 8
    assert results["regime"] == exp.regime_rules(results) and len(results["regime"]) == 4
    c = get_config("test")
    for name in exp.SEARCHES:
        assert len(results["curves"][name]["mean"]) == c.n_graphs
        assert len(results["test"][name]) == c.seeds
        best = results["curves"][name]["mean"]
        assert all(b >= a for a, b in zip(best, best[1:], strict=False))   # best so far
    assert len(results["width_curve"]) == c.sweep_width
    assert len(results["depth_curve"]) == c.sweep_depth + 1
    assert [r["search"] for r in exp.search_table(results)] == list(exp.SEARCHES)
    assert exp.main_table(results) == exp.search_table(results)    # results.md's table


def _fab(agent=0.7, reinforce=0.6, random=0.6, fixed=0.6, hv=(0.5, 0.4, 0.4), best=0.72,
         largest=0.65, other=True, width=(0.5, 0.6, 0.62, 0.62), depth=(0.5, 0.7, 0.68),
         differ=True, loss=0.05, gap=0.2, ratio=2.0, spread=0.2, majority=0.05):
    return {
        "auc": {"agent": [agent] * 3, "reinforce": [reinforce] * 3, "random": [random] * 3},
        "test": {"agent": [agent] * 3, "reinforce": [reinforce] * 3, "random": [random] * 3},
        "fixed_test": {"best_of_n": fixed, "self_refine": fixed - 0.1, "debate": fixed - 0.2},
        "hypervolume": dict(zip(exp.SEARCHES, hv, strict=True)),
        "mix": {"test_best": best, "test_largest": largest, "other_model": other},
        "width_curve": list(width), "depth_curve": list(depth),
        "levels": {"differ": differ, "easy_loss": loss, "hard_loss": 0.0},
        "single": [{"accuracy": 0.3, "flops": 1.0}, {"accuracy": 0.3 + gap, "flops": ratio}],
        "spread": spread, "majority": majority,
    }


def _holds(rules):
    return [r["holds"] for r in rules]


def test_claim_rules_hold_and_fail():
    assert _holds(exp.claim_rules(_fab())) == [True] * 8
    for i, kw in [(0, dict(agent=0.6)), (0, dict(random=0.8, fixed=0.5)),
                  (1, dict(reinforce=0.75, fixed=0.5)), (2, dict(fixed=0.75)),
                  (3, dict(hv=(0.3, 0.4, 0.2))), (4, dict(other=False)),
                  (4, dict(best=0.66)), (5, dict(width=(0.5, 0.6, 0.7, 0.8))),
                  (5, dict(width=(0.5, 0.51, 0.51, 0.51))), (6, dict(depth=(0.5, 0.6, 0.7))),
                  (7, dict(differ=False)), (7, dict(loss=0.01))]:
        assert _holds(exp.claim_rules(_fab(**kw)))[i] is False, kw
    # an interior optimum counts as saturation even when the last step falls a lot
    assert _holds(exp.claim_rules(_fab(width=(0.5, 0.7, 0.55, 0.6))))[5] is True


def test_regime_rules_hold_and_fail():
    assert _holds(exp.regime_rules(_fab())) == [True] * 4
    for i, kw in enumerate([dict(gap=0.05), dict(ratio=1.2), dict(spread=0.05),
                            dict(majority=0.3)]):
        assert _holds(exp.regime_rules(_fab(**kw)))[i] is False, kw


def test_bad_config_names_the_key():
    bad = copy.deepcopy(get_config("test"))
    bad.n_dev = 99
    with pytest.raises(ValueError, match="config.n_dev=99"):
        exp.check_config(bad)
    bad = copy.deepcopy(get_config("test"))
    bad.pool = ("cot-xs",)
    with pytest.raises(ValueError, match="config.pool"):
        exp.check_config(bad)
    bad = copy.deepcopy(get_config("test"))
    bad.max_width = 0
    with pytest.raises(ValueError, match="config.max_width=0"):
        exp.check_config(bad)
