"""The TAR baselines launcher end to end at the ``test`` preset, and its claim and regime
rules on fabricated results (each rule seen holding and failing)."""

import json
import os

import pytest

from configs.tar_baselines import get_config
from experiments import tar_baselines as tb
from lab.methods import tar


def test_tar_baselines_runs_end_to_end(tmp_path):
    config = get_config("test")
    results = tb.run(config, str(tmp_path))
    for name in ("config.json", "results.json", "report.md"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 3
    assert len(results["regime"]) == 3
    assert set(results["table"]) == set(tb.PREDICTORS)
    for name in tb.PREDICTORS:
        assert os.path.exists(tmp_path / "submissions" / f"{name}.csv")
        assert set(results["table"][name]["tasks"]) == set(tar.TASKS)
    # the tracker reads the synthetic labels back from the frames
    assert results["table"]["tracker"]["tasks"]["mcq"]["score"] == 1.0
    assert results["text_metric"] == "rouge_l"
    assert "| tracker |" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="test_videos"):
        config.test_videos = 2
        tb.check_config(config)


def _res(choice=(0.5, 0.2), iou=0.2, text=0.4):
    tasks = {t: {"score": text} for t in tb.TEXT_TASKS}
    tasks.update(bcq={"score": choice[0]}, mcq={"score": choice[1]},
                 temporal_localization={"score": iou})
    return {"tasks": tasks}


def _table(**tracker):
    table = {p: _res() for p in tb.SHORTCUTS}
    table["tracker"] = _res(choice=(1.0, 1.0), iou=1.0, text=1.0) if not tracker else _res(
        **tracker)
    return table


CHANCE = {"bcq": 0.5, "mcq": 0.2}


def test_claims_hold_on_a_table_built_to_show_them():
    assert [c["holds"] for c in tb.claims(_table(), CHANCE)] == [True, True, True]


def test_each_claim_fails_when_its_rule_is_broken():
    t = _table()
    t["last_frame"] = _res(choice=(0.5, 0.35))  # a shortcut 0.15 above chance on mcq
    assert [c["holds"] for c in tb.claims(t, CHANCE)] == [False, True, True]
    t = _table()
    t["majority"] = _res(iou=0.7)  # the prior interval localises nearly as well
    assert [c["holds"] for c in tb.claims(t, CHANCE)] == [True, False, True]
    t = _table(choice=(1.0, 1.0), iou=1.0, text=0.45)  # text metric cannot separate
    assert [c["holds"] for c in tb.claims(t, CHANCE)] == [True, True, False]


def _items(yes, n=10):
    return [tar.Item("bcq", f"v{i}", "q", "Yes" if i < yes else "No") for i in range(n)]


def test_regime_checks_hold_and_fail():
    assert all(r["holds"] for r in tb.regime_checks(_table(), _items(5)))
    held = [r["holds"] for r in tb.regime_checks(_table(choice=(0.9, 1.0), iou=0.5),
                                                 _items(8))]
    assert held == [False, False, False]
