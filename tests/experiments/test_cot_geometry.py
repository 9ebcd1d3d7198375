"""experiments.cot_geometry: the run at the test preset (zoo model, arithmetic) and on the real
path (a tiny random Qwen3 checkpoint on a MATH500-format file), the claim and regime rules on
fabricated results where each should hold and where it should not, and bad configs."""

import dataclasses
import json
import os

import numpy as np
import pytest

from configs.cot_geometry import get_config
from experiments import cot_geometry as exp
from lab import zoo
from lab.data.synthetic.mixture import mixture
from tests.checkpoints import tiny_qwen3


def test_test_preset_end_to_end(tmp_path):
    config = get_config("test")
    res = exp.run(config, str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "cot_geometry_spectra.png",
                 "cot_geometry_layers.png"):
        assert os.path.getsize(tmp_path / name) > 0, name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == res["claims"] == exp.claim_rules(res)
    assert res["regime"] == exp.regime_checks(res) and len(res["claims"]) == 7
    assert res["layer"] == 2 and sorted(res["layers"]) == ["0", "1", "2"]  # cot-xs: 2 blocks
    assert res["n_chains"] == 5 * config.task.n_per_level
    # harder levels write longer chains: the length baseline is measured, not assumed
    tokens = res["tokens_by_level"]
    assert tokens["5"] > tokens["1"] + 20
    m = res["layers"]["2"]
    assert 0 <= m["difficulty"]["d_rho"]["auc"] <= 1
    assert set(res["baselines"]["correctness"]) >= {"difficulty", "confidence", "prefix_tokens"}
    report = (tmp_path / "report.md").read_text()
    assert "| easy vs hard | generated_tokens | baseline (length) |" in report
    assert len(exp.main_table(res)) == 14


def test_real_path_on_a_tiny_random_qwen3_and_math500(tmp_path):
    """``--config.model=<hf dir> --config.math500.path=<jsonl>``: the whole run on a random
    checkpoint; it solves nothing, so the correctness AUCs are undefined and the regime fails
    (said, not hidden)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tiny_qwen3(ckpt, "Problem: What is 1+1?\nSolution: \\boxed{2}")
    path = tmp_path / "math500.jsonl"
    with open(path, "w") as f:
        for i in range(10):
            f.write(json.dumps({"problem": f"What is {i}+{i}?", "solution": "", "level": i % 5 + 1,
                                "answer": str(2 * i), "subject": "Algebra"}) + "\n")
    config = get_config("test")
    config.model, config.math500.path = str(ckpt), str(path)
    config.math500.max_new_tokens = 6
    config.geometry.layers = "-1"
    res = exp.run(config, str(tmp_path / "out"))
    assert res["source"] == "math500" and res["n_chains"] == 10 and res["layer"] == 1
    assert list(res["layers"]) == ["1"]
    assert res["accuracy_by_level"] == {str(k): 0.0 for k in range(1, 6)}
    assert res["zoo_regime_ok"] is None and len(res["regime"]) == 3
    assert res["regime"][0]["holds"] is False and not any(c["holds"] for c in res["claims"])
    assert res["layers"]["1"]["correctness"]["geometry"]["auc"] is None  # NaN -> null
    assert "not informative" in (tmp_path / "out" / "report.md").read_text()


def test_training_prompts_are_the_mixtures(monkeypatch):
    spec = zoo.get_spec("cot-xs")
    small = dataclasses.replace(spec, data={**spec.data, "n_train": 300})
    monkeypatch.setattr(zoo, "get_spec", lambda name: small)
    want = set(mixture(300, small.data["seed"], small.data["tasks"])["prompt"])
    assert exp.training_prompts("cot-xs") == want


def _auc(a, se=0.02):
    return {"auc": a, "se": se, "n_pos": 100, "n_neg": 100}


def fabricated(d_rho=0.9, length=0.85, window=0.75, geometry=0.75, geo_se=0.03,
               confidence=0.7, difficulty=0.7, prefix=0.65, within=0.65,
               fwd=(0.7, 0.72), rev=(0.7, 0.7), counts=(200, 50, 100, 100),
               acc=(0.8, 0.5), min_length=13, zoo_ok=True):
    """Results where every claim and regime check holds at the defaults."""
    layer = {
        "difficulty": {"d_rho": _auc(d_rho), "d_rho_window": _auc(window),
                       "d_rho_residual": _auc(0.55), "participation_ratio": _auc(0.6)},
        "correctness": {"geometry": _auc(geometry, geo_se),
                        "geometry_within": {"levels": {}, "mean": within}},
        "transfer": {"forward": {"transfer": _auc(fwd[0]), "in_distribution": _auc(fwd[1])},
                     "reverse": {"transfer": _auc(rev[0]), "in_distribution": _auc(rev[1])}},
    }
    return {
        "layer": 2, "layers": {"2": layer},
        "baselines": {"difficulty": {"generated_tokens": _auc(length),
                                     "prompt_tokens": _auc(length)},
                      "correctness": {"difficulty": _auc(difficulty),
                                      "confidence": _auc(confidence),
                                      "prefix_tokens": _auc(prefix),
                                      "confidence_within": {"levels": {}, "mean": 0.55}}},
        "groups": {"easy": {"correct": counts[0], "wrong": counts[1], "accuracy": acc[0]},
                   "hard": {"correct": counts[2], "wrong": counts[3], "accuracy": acc[1]}},
        "accuracy_by_level": {"1": acc[0], "5": acc[1]}, "min_length": min_length,
        "window": 8, "min_prefix": 3, "zoo_regime_ok": zoo_ok,
    }


def holds(entries):
    return [e["holds"] for e in entries]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    assert holds(exp.claim_rules(fabricated())) == [True] * 7
    cases = [
        (dict(d_rho=0.79, length=0.7), 0),            # weak separation (still beats length)
        (dict(length=1.0), 1),                        # length separates better
        (dict(d_rho=0.85, length=0.85), 1),           # a tie is not better
        (dict(window=0.69), 2),                       # fails at equal token count
        (dict(geometry=0.59, confidence=0.5, difficulty=0.5, prefix=0.5), 3),
        (dict(geometry=0.62, geo_se=0.07, confidence=0.5, difficulty=0.5, prefix=0.5), 3),
        (dict(confidence=0.76), 4),                   # the model's confidence is better
        (dict(prefix=0.75), 4),                       # the prefix's length is as good
        (dict(within=0.59), 5),
        (dict(within=float("nan")), 5),               # no level with both classes
        (dict(fwd=(0.59, 0.6)), 6),                   # transfers below 0.6
        (dict(rev=(0.64, 0.7)), 6),                   # more than 0.05 below in-distribution
    ]
    for kwargs, i in cases:
        got = holds(exp.claim_rules(fabricated(**kwargs)))
        want = [True] * 7
        want[i] = False
        assert got == want, (kwargs, got)
    # undefined AUCs (a run that solves nothing) decide nothing as held
    nan = float("nan")
    assert not any(holds(exp.claim_rules(fabricated(
        d_rho=nan, window=nan, geometry=nan, geo_se=nan, within=nan, fwd=(nan, nan),
        rev=(nan, nan)))))


def test_regime_rules_hold_and_fail_on_fabricated_results():
    assert holds(exp.regime_checks(fabricated())) == [True] * 4
    assert holds(exp.regime_checks(fabricated(counts=(200, 19, 100, 100)))) == [
        False, True, True, True]
    assert holds(exp.regime_checks(fabricated(acc=(0.8, 0.66)))) == [True, False, True, True]
    assert holds(exp.regime_checks(fabricated(min_length=7))) == [True, True, False, True]
    assert holds(exp.regime_checks(fabricated(zoo_ok=False))) == [True, True, True, False]
    assert len(exp.regime_checks(fabricated(zoo_ok=None))) == 3   # not a zoo model


def test_helpers_residualise_and_split():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 60, 200)
    values = 3 + 2 * np.log(lengths)
    np.testing.assert_allclose(exp.residualised(values, lengths), 0, atol=1e-9)
    levels = np.repeat([1, 2, 3], [10, 20, 31])
    test = exp.split(levels, 0.5, 0)
    assert [int(test[levels == k].sum()) for k in (1, 2, 3)] == [5, 10, 16]
    w = exp.within_level(np.r_[np.arange(10), np.arange(10)],
                         np.r_[np.arange(10) >= 5, np.zeros(10, bool)], np.repeat([1, 2], 10))
    assert w == {"levels": {"1": 1.0}, "mean": 1.0}   # level 2 has no correct chain


def test_bad_config_fails_before_any_work(tmp_path):
    def fails(match, **changes):
        config = get_config("test")
        for key, value in changes.items():
            node = config
            *path, last = key.split(".")
            for p in path:
                node = node[p]
            node[last] = value
        with pytest.raises(ValueError, match=match):
            exp.run(config, str(tmp_path))

    fails(r"config.geometry.rho=0.0 is invalid; expected a fraction of variance in \(0, 1\]",
          **{"geometry.rho": 0.0})
    fails(r"config.geometry.rho=1.5 is invalid", **{"geometry.rho": 1.5})
    fails(r"config.hard_levels=\[2, 4\] is invalid; expected levels disjoint", hard_levels=[2, 4])
    fails(r"config.math500.path='/nope.jsonl' is invalid", **{"math500.path": "/nope.jsonl"})
    fails(r"config.predictor.features='speed' is invalid", **{"predictor.features": "speed"})
    fails(r"within task.steps", transfer_target=[4, 6])
    fails(r"config.geometry.layers='0,last' is invalid", **{"geometry.layers": "0,last"})
    # known once the model is loaded (its number of layers), still before any generation
    fails(r"config.geometry.layer=-1 is invalid; expected one of the measured "
          r"geometry.layers='0,1'", **{"geometry.layers": "0,1"})
    fails(r"layer=5 is outside the model's layers 0..2", **{"geometry.layer": 5})
    config = get_config("test")
    config.unlock()
    config.geometry.rhoo = 0.9
    with pytest.raises(ValueError, match=r"unknown config keys \['geometry.rhoo'\]"):
        exp.run(config, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_the_default_model_is_in_the_regime_by_its_stored_metrics():
    """cot-xs's stored regime (held-out prompts, 200 per level): it holds, accuracy falls
    from the default's easy levels (1-2 steps: difficulty 2, 4) to its hard ones (4-5 steps:
    8, 10) by more than the regime's 0.15, and at 150 problems per level both groups
    expect well over 20 correct and 20 wrong chains."""
    zoo.load("cot-xs")
    reg = zoo.metrics("cot-xs")["regime"]
    assert reg["checks"]["ok"]
    acc = {int(k): v["accuracy"] for k, v in reg["by_difficulty"].items()}
    easy, hard = (acc[2] + acc[4]) / 2, (acc[8] + acc[10]) / 2
    assert easy - hard >= exp.MIN_ACC_DROP
    n = 2 * get_config("default").task.n_per_level
    assert min(n * easy, n * (1 - easy), n * hard, n * (1 - hard)) >= 2 * exp.MIN_PER_CLASS


@pytest.mark.deep
def test_default_run_is_in_the_regime(tmp_path):
    """The default run's own regime checks hold (measured on its 750 chains: easy 0.80 vs
    hard 0.49, 61 wrong easy chains, shortest chain 13 tokens)."""
    res = exp.run(get_config("default"), str(tmp_path))
    assert holds(res["regime"]) == [True] * 4, res["regime"]
