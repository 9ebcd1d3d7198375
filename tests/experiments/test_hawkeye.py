"""The Hawkeye launcher end to end at the test preset, and its config checks."""

import json
import os

import pytest

from configs.hawkeye import get_config
from experiments import hawkeye as exp


def test_run_at_test_preset_writes_honest_claims(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for f in ("config.json", "results.json", "report.md", "hawkeye_budget.png"):
        assert os.path.exists(tmp_path / f), f
    on_disk = json.loads((tmp_path / "results.json").read_text())
    claims = {c["claim"].split(" ")[0] + str(i): c for i, c in enumerate(on_disk["claims"])}
    assert len(claims) == 6
    interp = on_disk["claims"][0]
    assert interp["holds"] and interp["measured"] == "4/4"       # 2 strategies x 2 targets
    assert on_disk["claims"][2]["holds"]                          # bit-exact quantisers
    assert all(r["interpret"] == "pass" for r in results["taxonomy"])
    assert all(r["lowering"] == "pass" for r in results["taxonomy"])
    search = results["searches"][0]
    assert search["tried"] == 3 and search["passed"] >= 1 and search["cost"] == "analytic"
    if exp.tx.detect() is None:   # no GPU: speed is not claimed
        assert search["speedup_vs_xla"] == "not measured"
        gpu_claim = on_disk["claims"][5]
        assert gpu_claim["holds"] is False and "not tested" in gpu_claim["measured"]
        assert all(g["status"].startswith("not run") for g in results["gpu"])
    assert "## Correctness sweep" in (tmp_path / "report.md").read_text()


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


def test_claim_rules_hold_and_fail_on_fabricated_results():
    tax = [{"interpret": "pass", "lowering": "pass"}, {"interpret": "skip", "lowering": "skip"}]
    fmts = [{"bit_exact_vs_numpy": True, "scaled_matmul_vs_dequant_ref": 1e-7}] * 2
    searches = [{"passed": 3}]
    sweep = [{"best_cost_s": 2.0}, {"best_cost_s": 1.0}]
    gpu = [{"status": "measured", "speedup_vs_xla": 1.1}]

    def holds(**change):
        args = {"tax": tax, "fmts": fmts, "searches": searches, "sweep": sweep, "gpu": gpu,
                **change}
        return [c["holds"] for c in exp.claim_rules(**args)]

    assert holds() == [True] * 6
    assert holds(tax=[{"interpret": "fail", "lowering": "pass"}]) == [False] + [True] * 5
    assert holds(tax=[{"interpret": "pass", "lowering": "fail"}]) == [True, False] + [True] * 4
    bad_fmt = [{"bit_exact_vs_numpy": False, "scaled_matmul_vs_dequant_ref": 1e-3}]
    assert holds(fmts=bad_fmt) == [True, True, False, False, True, True]
    assert holds(sweep=[{"best_cost_s": 1.0}, {"best_cost_s": 2.0}])[4] is False
    assert holds(searches=[{"passed": 0}])[4] is False
    assert holds(gpu=[{"status": "measured", "speedup_vs_xla": 0.5}])[5] is False
    assert holds(gpu=[{"status": "no gpu"}])[5] is False
