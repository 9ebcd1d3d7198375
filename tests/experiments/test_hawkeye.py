"""The Hawkeye launcher end to end at the test preset, and its config checks."""

import json
import os

import pytest

from configs.hawkeye import get_config
from experiments import hawkeye as exp


def test_run_at_test_preset_writes_honest_claims(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for f in ("config.json", "results.json", "report.md"):
        assert os.path.exists(tmp_path / f), f
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert len(on_disk["claims"]) == 8 and len(on_disk["regime"]) == 3
    interp = on_disk["claims"][0]
    assert interp["holds"] and interp["measured"] == "2/2"       # 1 strategy x 2 targets
    assert on_disk["claims"][1]["holds"]                          # bit-exact quantisers
    assert on_disk["regime"][0]["holds"] and on_disk["regime"][0]["measured"] == "2/2"
    assert all(r["interpret"] == r["lowering"] == r["without"] == "pass"
               for r in results["taxonomy"])
    search = results["searches"][0]
    assert search["tried"] == 2 and search["cost"] == "analytic"
    modes = [(r["target"], r["search"]) for r in results["compare"]]
    assert modes == [("mi350", "grounded"), ("mi350", "ungrounded")]
    grounded = results["compare"][0]
    assert grounded["winner_passes_target_tests"] and grounded["tried"] == 4
    if exp.tx.detect() is None:   # no GPU: speed is not claimed
        assert search["speedup_vs_xla"] == "not measured"
        gpu_claim = on_disk["claims"][7]
        assert gpu_claim["holds"] is False and "not tested" in gpu_claim["measured"]
        assert all(g["status"].startswith("not run") for g in results["gpu"])
    assert "## Grounded vs ungrounded search" in (tmp_path / "report.md").read_text()


def test_bad_config_fails_before_work(tmp_path):
    c = get_config("test")
    c.sweep.formats = ["fp6"]
    with pytest.raises(ValueError, match="sweep.formats"):
        exp.run(c, str(tmp_path))
    c = get_config("test")
    c.search.workloads = ["matmul:64x64:bfloat16@hopper"]
    with pytest.raises(ValueError, match="shape=\\(64, 64\\)"):
        exp.run(c, str(tmp_path))
    c = get_config("test")
    c.search.workloads = ["matmul:64x64x64:bfloat16@volta"]
    with pytest.raises(ValueError, match="target='volta'"):
        exp.run(c, str(tmp_path))
    assert not os.path.exists(tmp_path / "results.json")


def _cmp(target, mode, cost, features, fails="", deployable=None, start=10.0):
    return {"target": target, "search": mode, "winner_cost_s": cost,
            "winner_features": features, "winner_fails": fails,
            "winner_passes_target_tests": not fails, "deployable_cost_s": deployable,
            "start_cost_s": start}


TAX = [{"interpret": "pass", "lowering": "pass", "without": "pass"},
       {"interpret": "skip", "lowering": "skip", "without": "skip"}]
HOPPER = "tiling+mma+bulk_copy+warp_specialization"
COMPARE = [_cmp("hopper", "grounded", 1.0, HOPPER),
           _cmp("hopper", "ungrounded", 0.9, "tiling", fails="mma", deployable=1.5),
           _cmp("mi350", "grounded", 2.0, "tiling+mma+pipelining"),
           _cmp("mi350", "ungrounded", 2.0, "tiling+mma+pipelining", deployable=2.0)]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    fmts = [{"bit_exact_vs_numpy": True, "scaled_matmul_vs_dequant_ref": 1e-7}] * 2
    searches = [{"passed": 3}]
    gpu = [{"status": "measured", "speedup_vs_xla": 1.1}]

    def holds(**change):
        args = {"tax": TAX, "fmts": fmts, "searches": searches, "compare": COMPARE, "gpu": gpu,
                **change}
        return [c["holds"] for c in exp.claim_rules(**args)]

    def only(i):
        return [j != i for j in range(8)]

    assert holds() == [True] * 8
    assert holds(tax=[{"interpret": "fail"}]) == only(0)
    bad_fmt = [{"bit_exact_vs_numpy": False, "scaled_matmul_vs_dequant_ref": 1e-3}]
    assert holds(fmts=bad_fmt) == [True, False, False] + [True] * 5
    assert holds(searches=[{"passed": 3}, {"passed": 0}]) == only(3)
    # a grounded winner without the target's signature feature (no TMA on Hopper)
    no_tma = [_cmp("hopper", "grounded", 1.0, "tiling+mma")] + COMPARE[1:]
    assert holds(compare=no_tma)[4] is False
    # ungrounded winners that all pass the target's tests: grounding changed nothing
    clean = COMPARE[:1] + [_cmp("hopper", "ungrounded", 1.2, HOPPER, deployable=1.2)] + COMPARE[2:]
    assert holds(compare=clean) == only(5)
    # the ungrounded search deploys something cheaper than the grounded winner somewhere
    cheaper = COMPARE[:3] + [_cmp("mi350", "ungrounded", 1.5, "tiling+mma+pipelining",
                                  deployable=1.5)]
    assert holds(compare=cheaper) == only(6)
    # no strict win anywhere (equal costs everywhere)
    tie = COMPARE[:1] + [_cmp("hopper", "ungrounded", 0.9, "tiling", "mma", 1.0)] + COMPARE[2:]
    assert holds(compare=tie) == only(6)
    assert holds(gpu=[{"status": "measured", "speedup_vs_xla": 0.5}]) == only(7)
    assert holds(gpu=[{"status": "no gpu"}]) == only(7)


def test_regime_rules_hold_and_fail_on_fabricated_results():
    sep = [{"baseline_over_example": 2.0}, {"baseline_over_example": 1.2}]

    def holds(tax=TAX, compare=COMPARE, separation=sep):
        return [c["holds"] for c in exp.regime_checks(tax, compare, separation)]

    assert holds() == [True, True, True]
    assert holds(tax=[{"interpret": "pass", "lowering": "pass", "without": "fail"}]) == [
        False, True, True]
    assert holds(tax=[{"interpret": "pass", "lowering": "fail", "without": "pass"}])[0] is False
    near_optimal = [dict(COMPARE[0], start_cost_s=1.5)] + COMPARE[1:]
    assert holds(compare=near_optimal) == [True, False, True]
    assert holds(separation=[{"baseline_over_example": 1.01}] * 2 + sep[:1]) == [
        True, True, False]
