"""The GridProbe experiment: its claim and regime rules on fabricated results (each seen
holding and failing), bad config, and the run end to end at the ``test`` preset."""

import json
import os

import numpy as np
import pytest

from configs.gridprobe import get_config
from experiments import gridprobe as exp


def _row(pair, selector, acc, gflops):
    return {"pair": pair, "selector": selector, "accuracy": acc, "se": 0.03, "frames": 4.0,
            "gflops": gflops}


def _results(good: bool) -> dict:
    g = 0.70 if good else 0.40
    table = [_row("large/large", "monolithic", 0.72, 1.0),
             _row("small/large", "gridprobe", g, 0.5 if good else 0.9),
             _row("small/small", "gridprobe", 0.45, 0.2),
             _row("small/large", "uniform", 0.5, 0.3),
             _row("small/small", "uniform", 0.4, 0.1),
             _row("large/large", "uniform", 0.5, 0.3),
             _row("large/large", "gridprobe", 0.6, 1.2)]
    gain = 0.2 if good else 0.01
    paired = {p: {"gain_uniform": gain, "se_uniform": 0.04}
              for p in ("small/small", "large/large", "small/large")}
    paired["small/large"].update(gain_small=0.25 if good else -0.05, se_small=0.04)
    return {"table": table, "paired": paired,
            "spearman": {"rho": 0.4, "p": 0.001, "n": 160} if good else
            {"rho": 0.1, "p": 0.3, "n": 160},
            "chance": 0.25,
            "context": {"small": {"evidence": (0.8 if good else 0.3, 0.03),
                                  "random": (0.4, 0.03), "no_frames": (0.25, 0.03)}}}


def test_claim_rules_hold_and_fail():
    good, bad = exp.claims_of(_results(True)), exp.claims_of(_results(False))
    assert len(good) == len(bad) == 6
    assert all(c["holds"] for c in good), [c for c in good if not c["holds"]]
    assert not any(c["holds"] for c in bad), [c for c in bad if c["holds"]]
    # near-monolithic accuracy but too much compute fails the first claim alone
    r = _results(True)
    r["table"][1]["gflops"] = 0.8
    assert [c["holds"] for c in exp.claims_of(r)] == [False] + [True] * 5
    # a negative correlation with a small p fails
    r["spearman"] = {"rho": -0.5, "p": 1e-4, "n": 160}
    assert not exp.claims_of(r)[4]["holds"]


def test_regime_rule_holds_and_fails():
    assert exp.regime_of(_results(True))[0]["holds"]
    assert not exp.regime_of(_results(False))[0]["holds"]
    r = _results(True)
    r["context"]["small"]["random"] = (0.75, 0.03)      # evidence barely above random
    assert not exp.regime_of(r)[0]["holds"]


def test_real_path_regime_rule_holds_and_fails():
    """The real path's check: the QA model with all frames beats the question alone."""
    r = {"real": {"reads": {"large": {"all_frames": 0.60, "no_frames": 0.40}}}}
    assert [c["holds"] for c in exp.regime_of(r)] == [True]
    r["real"]["reads"]["large"]["all_frames"] = 0.43            # within 0.05 of the question
    assert [c["holds"] for c in exp.regime_of(r)] == [False]
    r["real"]["reads"] = {"small": {"all_frames": 0.70, "no_frames": 0.30},
                          "large": {"all_frames": 0.40, "no_frames": 0.45}}
    assert [c["holds"] for c in exp.regime_of(r)] == [True, False]    # one check per model


def test_one_model_real_run_states_the_claims_it_can_decide():
    """With one model only large/large runs: its gain over uniform and the M_eff
    correlation (named for the benchmark's difficulty), each holding and failing."""
    r = _results(True)
    r["table"] = [row for row in r["table"] if row["pair"] == "large/large"]
    r["paired"] = {"large/large": r["paired"]["large/large"]}
    r["difficulty"] = "the videomme duration class"
    good = exp.claims_of(r)
    assert [c["holds"] for c in good] == [True, True]
    assert "videomme duration class" in good[1]["claim"]
    r["paired"]["large/large"]["gain_uniform"] = 0.05           # within 2 paired SE
    r["spearman"] = {"rho": 0.3, "p": 0.2, "n": 40}
    assert [c["holds"] for c in exp.claims_of(r)] == [False, False]


def test_paired_gains_and_spearman_on_hand_cases():
    a = np.array([0, 1, 2, 3])
    preds = {("small/small", "gridprobe"): np.array([0, 1, 0, 0]),
             ("small/small", "uniform"): np.array([0, 0, 0, 0]),
             ("small/large", "gridprobe"): np.array([0, 1, 2, 0]),
             ("small/large", "uniform"): np.array([0, 1, 2, 3])}
    g = exp.paired_gains(preds, a, ["small/small", "small/large"])
    assert g["small/small"]["gain_uniform"] == pytest.approx(0.25)
    assert g["small/large"]["gain_uniform"] == pytest.approx(-0.25)
    assert g["small/large"]["gain_small"] == pytest.approx(0.25)        # 0.75 - 0.5
    assert "gain_small" not in exp.paired_gains(preds, a, ["small/small"])["small/small"]
    assert exp.m_eff_spearman([1, 2, 3, 4], [0, 0, 1, 1])["rho"] > 0.8
    assert exp.m_eff_spearman([3, 3, 3, 3], [0, 1, 2, 0]) == {"rho": 0.0, "p": 1.0, "n": 4}
    assert exp.m_eff_spearman([1, 2, 3, 4], [1, 1, 1, 1])["p"] == 1.0


def test_bad_config():
    c = get_config("test")
    c.k = 5                                             # 25 > 16 frames
    with pytest.raises(ValueError, match="k=5 needs K\\^2=25 distinct frames"):
        exp.check_config(c)
    c = get_config("test")
    c.rule = "median"
    with pytest.raises(ValueError, match="config.rule='median'"):
        exp.check_config(c)
    c = get_config("test")
    c.confidence = "entropy"
    with pytest.raises(ValueError, match="config.confidence='entropy'"):
        exp.check_config(c)
    c = get_config("test")
    c.large = "vlm-xl"
    with pytest.raises(ValueError, match="config.large='vlm-xl'.*a zoo VLM name"):
        exp.check_config(c)


@pytest.mark.slow
def test_gridprobe_runs_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    config = get_config("test")
    config.data.n_eval = 8
    results = exp.run(config, str(tmp_path / "out"))
    for name in ("config.json", "results.json", "report.md", "importance_maps.png"):
        assert os.path.exists(tmp_path / "out" / name), name
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 6
    assert len(results["regime"]) == 2
    rows = exp.main_table(results)
    assert len(rows) == 14 and all(r["gflops"] > 0 for r in rows)
    by = {(r["pair"], r["selector"]): r for r in rows}
    assert by[("large/large", "monolithic")]["frames"] == 16
    # GridProbe's compute includes its 2K probes: above the QA pass alone at its frames
    assert by[("small/large", "gridprobe")]["gflops"] > by[("small/large", "uniform")]["gflops"]
    assert results["confidence"] == "peak"
    # KL confidences: the probes' cost adds the selector's pass over the question alone
    # (one blank frame in the zoo reader); the monolithic pass costs the same
    config.confidence = "kl"
    kl = exp.run(config, str(tmp_path / "out_kl"))
    assert kl["confidence"] == "kl" and len(kl["claims"]) == 6
    assert "Probe confidence: the KL divergence" in (tmp_path / "out_kl" / "report.md").read_text()
    by_kl = {(r["pair"], r["selector"]): r for r in exp.main_table(kl)}
    key = ("large/large", "monolithic")
    assert by_kl[key]["gflops"] == pytest.approx(by[key]["gflops"])
    reader = exp.models(config)["small"]

    def flops(m):                                      # one question, m frames, 4 options
        return reader.forward_flops(m, config.data.size, 4)

    k = config.k
    for res, by_, extra in ((results, by, 0), (kl, by_kl, flops(1))):
        m = res["fixed_m"]["small/small"]              # the QA pass, the probes, the prior
        assert by_[("small/small", "gridprobe_fixed")]["gflops"] == pytest.approx(
            (flops(m) + 2 * k * flops(k) + extra) / 1e9)
