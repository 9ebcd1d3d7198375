"""TAR's VLM experiment end to end at the ``test`` preset, and its claim and regime rules on
fabricated results (each rule seen holding and failing)."""

import json
import os

import numpy as np
import pytest

from configs.tar import GROUP_ORDER, get_config
from experiments import tar as ex
from lab.methods import tar
from lab.methods.tar import vlm as tv


def test_tar_vlm_runs_end_to_end(tmp_path):
    config = get_config("test")
    results = ex.run(config, str(tmp_path))
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 3
    assert len(results["regime"]) == 4
    runs = ["qa", "qa+temporal", "qa+temporal+scene", "no_video"]
    assert list(ex.runs(GROUP_ORDER)) == runs
    assert set(results["table"]) == {*ex.BASELINES, "zero_shot", *runs}
    for name in results["table"]:
        assert os.path.exists(tmp_path / "submissions" / f"{name}.csv")
        assert set(results["table"][name]["tasks"]) == set(tar.TASKS)
    assert results["sft"]["source"] == "trained"
    assert set(results["sft"]["runs"]) == {"pretrained", *runs}
    assert [r["group"] for r in results["per_group"]] == list(GROUP_ORDER)
    assert set(results["perception"]) == {"<pad>", *tv.REGIONS}
    report = (tmp_path / "report.md").read_text()
    assert "| qa+temporal+scene |" in report and "Zero-shot against fine-tuned" in report
    assert "reasoning trace naming the video's event" in report
    with pytest.raises(ValueError, match="groups"):
        config.groups = ("question_answering", "question_answering")
        ex.check_config(config)


def test_fine_tuning_items_follow_the_config():
    rng = np.random.default_rng(0)
    items = [it for vid, _, log in tar.make_videos(0, 3)
             for it in tar.labels.label_video(vid, log, rng)]
    train = {t: [it for it in items if it.task == t] for t in tar.TASKS}
    config = get_config("test")
    config.trace, config.choice_text = False, False
    assert ex.fine_tuning_items(config, train) == train
    config.trace = True
    traced = ex.fine_tuning_items(config, train)
    assert all(it.answer.startswith("<think> ") for its in traced.values() for it in its)
    assert all(it.answer[-1] in "ABCDE" for it in traced["mcq"])
    config.choice_text = True
    texts = ex.fine_tuning_items(config, train)["mcq"]
    assert [it.answer.split("</think> ")[1] for it in texts] == [
        tar.metrics.parse_options(it.question)[it.answer] for it in train["mcq"]]


def _res(bcq=0.5, mcq=0.2, iou=0.2, group=0.3):
    tasks = {t: {"score": 0.4} for t in tar.TASKS}
    tasks.update(bcq={"score": bcq}, mcq={"score": mcq},
                 temporal_localization={"score": iou})
    return {"tasks": tasks, "groups": {g: group for g in GROUP_ORDER}}


def _items(acc, n=40):
    """Per-item scores with mean ``acc`` on bcq and mcq (paired by position)."""
    hit = np.arange(n) < round(acc * n)
    return {"bcq": hit.astype(float), "mcq": hit.astype(float),
            "temporal_localization": np.zeros(n)}


def _case(accs=(0.6, 0.7, 0.8), no_video=0.3, iou=0.6, base_iou=0.2):
    names = ["qa", "qa+temporal", "qa+temporal+scene"]
    table = {n: _res(iou=iou) for n in names}
    table.update(no_video=_res(iou=base_iou), majority=_res(iou=base_iou),
                 question_only=_res(iou=base_iou))
    per_item = {n: _items(a) for n, a in zip(names, accs, strict=True)}
    per_item["no_video"] = _items(no_video)
    return table, per_item


def _held(table, per_item):
    return [c["holds"] for c in ex.claims(table, per_item, GROUP_ORDER)]


def test_claims_hold_on_results_built_to_show_them():
    assert _held(*_case()) == [True, True, True]


def test_each_claim_fails_when_its_rule_is_broken():
    assert _held(*_case(no_video=0.75)) == [False, True, True]      # text alone does as well
    # a gain past the margin (0.15) that is within two paired standard errors (0.10 each):
    # the full model and its no-video twin get different items right
    table, per_item = _case()
    full, blind = np.zeros(40), np.zeros(40)
    full[:26], blind[20:] = 1.0, 1.0
    per_item["qa+temporal+scene"].update(bcq=full, mcq=full)
    per_item["no_video"].update(bcq=blind, mcq=blind)
    claim = ex.claims(table, per_item, GROUP_ORDER)[0]
    assert claim["measured"]["gain"] >= ex.SEES_MARGIN and not claim["holds"]
    assert _held(*_case(base_iou=0.55)) == [True, False, True]      # the prior interval
    assert _held(*_case(accs=(0.7, 0.65, 0.8))) == [True, True, False]  # a step that loses
    # one group: neither the localisation nor the ablation claim is stated
    table, per_item = _case()
    per_item["question_answering"] = per_item["qa"]
    assert len(ex.claims(table, per_item, GROUP_ORDER[:1])) == 1


def _perception(recall):
    return {k: {"n": 10, "recall": recall} for k in ("<pad>", *tv.REGIONS)}


def test_regime_checks_hold_and_fail():
    chance = {"bcq": 0.5, "mcq": 0.2}
    items = [tar.Item("bcq", f"v{i}", "q", "Yes" if i < 5 else "No") for i in range(10)]
    table = {"qa+temporal+scene": _res(bcq=0.8, mcq=0.6)}
    assert all(r["holds"] for r in ex.regime_checks(table, items, chance, GROUP_ORDER,
                                                    _perception(0.8)))
    table = {"qa+temporal+scene": _res(bcq=0.55, mcq=0.6)}     # bcq within 0.1 of chance
    got = [r["holds"] for r in ex.regime_checks(table, items[:6], chance, GROUP_ORDER,
                                                _perception(0.3))]
    assert got == [False, False, True, False]
    table = {"qa+temporal+scene": _res(bcq=1.0, mcq=0.99)}     # at the ceiling
    got = [r["holds"] for r in ex.regime_checks(table, items, chance, GROUP_ORDER,
                                                _perception(0.8))]
    assert got == [True, True, False, True]
