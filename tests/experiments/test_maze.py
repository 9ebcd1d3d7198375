"""The Maze experiment end to end at the ``test`` preset; its claim and regime rules on
fabricated results (each seen holding and failing); the regime at ``default`` (deep)."""

import copy
import json
import os

import pytest

from configs.maze import get_config
from experiments import maze as exp


def test_maze_runs_end_to_end_at_the_test_preset(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "maze.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 3
    assert results["regime"] == exp.regime_rules(results) and len(results["regime"]) == 4
    c = get_config("test")
    assert results["calls"]["maze"] == 1 and results["calls"]["multimaze"] == c.m
    assert results["calls"]["best_of_n"] == c.n
    assert [r["method"] for r in exp.main_table(results)] == list(exp.METHODS)
    # one world per seed; the claims read the means over them
    assert results["seeds"] == list(c.seeds) == [0, 1]
    assert [s["seed"] for s in results["per_seed"]] == [0, 1]
    assert results["accuracy"]["maze"] == pytest.approx(
        sum(s["accuracy"]["maze"] for s in results["per_seed"]) / 2)
    assert "| seed | maze |" in (tmp_path / "report.md").read_text()


def _seed(seed, multimaze, random=0.15, bon=0.95, auc=0.8):
    m = _fab(multimaze=multimaze, random=random, bon=bon, auc=auc)
    wall = {"lm_s": 1.0, "total_s": 2.0}
    gain = bon - random
    return dict(m, seed=seed, wall={n: dict(wall) for n in exp.METHODS},
                recovered=(multimaze - random) / gain, calls_fraction=3 / 16,
                logged_calls_per_train_query=16.0, reader_loss_last=0.01,
                fixed_train_acc=0.3, planner={"s_per_query": 0.1, "lm_s_per_call": 0.01},
                scorer_loss={"first": 0.7, "last": 0.1}, timing={"total_s": 1.0})


def test_over_seeds_decides_on_the_means_and_keeps_every_seed():
    # recoveries 0.75 and 0.125 on their own; the mean accuracies recover 0.4375 < 0.5
    per_seed = [_seed(0, multimaze=0.75), _seed(1, multimaze=0.25, auc=0.6)]
    m = exp.over_seeds(per_seed)
    assert m["accuracy"]["multimaze"] == pytest.approx(0.5) and m["auc"] == pytest.approx(0.7)
    assert m["recovered"] == pytest.approx(0.4375) and m["seeds"] == [0, 1]
    assert _holds(exp.claim_rules(m)) == [True, False, True]
    assert _holds(exp.claim_rules(exp.over_seeds(per_seed[:1]))) == [True, True, True]
    assert [r["seed"] for r in exp.seed_table(dict(m, per_seed=per_seed))] == [0, 1]


def _fab(maze=0.6, fixed=0.25, random=0.15, multimaze=0.65, bon=0.95, m=3, n=16, auc=0.8,
         spread=0.9, reader=1.0, zero=0.2, majority=0.1):
    acc = {name: 0.1 for name in exp.METHODS}
    acc.update(maze=maze, fixed_best=fixed, random=random, nearest=0.15,
               multimaze=multimaze, best_of_n=bon, zero_shot=zero)
    calls = {name: 1 for name in exp.METHODS}
    calls.update(multimaze=m, best_of_n=n)
    return {"accuracy": acc, "calls": calls, "auc": auc, "spread": spread,
            "reader": reader, "majority": majority, "chance": 0.2,
            "answer_chance": 0.0625}


def _holds(rules):
    return [r["holds"] for r in rules]


def test_claim_rules_hold_and_fail():
    assert _holds(exp.claim_rules(_fab())) == [True] * 3
    for i, kw in [(0, dict(maze=0.3)), (1, dict(multimaze=0.3)), (1, dict(m=8)),
                  (1, dict(bon=0.1)), (2, dict(auc=0.5))]:
        assert _holds(exp.claim_rules(_fab(**kw)))[i] is False, kw


def test_regime_rules_hold_and_fail():
    assert _holds(exp.regime_rules(_fab())) == [True] * 4
    for i, kw in enumerate([dict(spread=0.1), dict(reader=0.5), dict(zero=0.31),
                            dict(majority=0.17)]):
        assert _holds(exp.regime_rules(_fab(**kw)))[i] is False, kw


def test_bad_config_names_the_key():
    bad = copy.deepcopy(get_config("test"))
    bad.task.k = 99
    with pytest.raises(ValueError, match="config.task.k=99"):
        exp.check_config(bad)
    bad = copy.deepcopy(get_config("test"))
    bad.m = 0
    with pytest.raises(ValueError, match="config.m=0"):
        exp.check_config(bad)
    bad = copy.deepcopy(get_config("test"))
    bad.seeds = ()
    with pytest.raises(ValueError, match=r"config.seeds=\(\) is invalid"):
        exp.check_config(bad)


@pytest.mark.deep
def test_the_regime_holds_at_the_default_preset(tmp_path):
    """Re-measures the regime: the best of 32 random trajectories beats the median by
    >= 0.15 on held-out queries, the reader learned the task, no shortcut."""
    results = exp.run(get_config("default"), str(tmp_path))
    assert _holds(results["regime"]) == [True] * 4, results["regime"]
