"""The S²-Net experiment end to end at the ``test`` preset."""

import json
import os

import pytest

from configs.s2net import get_config
from experiments import s2net


@pytest.mark.slow
def test_s2net_runs_end_to_end(tmp_path):
    results = s2net.run(get_config("test"), str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "s2net.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 5
    assert results["claims"] == s2net._claims(results["table"])  # the rules on the stored table
    for task in s2net.TASKS:
        for kind in s2net.MODELS:
            entry = results["table"][task][kind]
            assert -1.0 <= entry["score"] <= 1.0 and entry["pj"] > 0, (task, kind, entry)
            assert (entry["spikes"] > 0) == (kind in ("s2net", "snn")), (task, kind)
    report = (tmp_path / "report.md").read_text()
    assert "| binding | s2net | ARI |" in report


def _table(s2net_score, s2net_pj):
    """Every (task, model) at score 0.7 and 10 pJ, S²-Net at the given score and energy."""
    return {t: {k: {"score": s2net_score if k == "s2net" else 0.7,
                    "pj": s2net_pj if k == "s2net" else 10.0} for k in s2net.MODELS}
            for t in s2net.TASKS}


def test_claim_rules_on_fabricated_tables():
    # S²-Net at ARI 0.85 (>= 0.8, 0.15 over the SNN), at half the ANN's energy, 0.15 ahead
    held = s2net._claims(_table(0.85, 5.0))
    assert [c["holds"] for c in held] == [True] * 5
    assert held[1]["measured"] == pytest.approx(0.15)
    assert held[2]["measured"] == pytest.approx({"energy_ratio": 0.5, "acc_s2net": 0.85,
                                                 "acc_ann": 0.7})
    # S²-Net at 0.64: ARI < 0.8, gain -0.06 < 0.1, more than 5 points under the ANN and
    # 6 points under its parts, even at half the energy
    low = s2net._claims(_table(0.64, 5.0))
    assert [c["holds"] for c in low] == [False] * 5
    assert low[4]["measured"] == pytest.approx(-0.06)
    # within the tolerances (1.5 points under the ANN and the parts) but at twice the energy
    costly = s2net._claims(_table(0.685, 20.0))
    assert [c["holds"] for c in costly] == [False, False, False, False, True]


def test_bad_config_fails_before_any_work(tmp_path):
    config = get_config("test")
    config.unlock()
    config.model.n_neuron = 3
    with pytest.raises(ValueError, match="unknown config keys.*model.n_neuron"):
        s2net.run(config, str(tmp_path))
    config = get_config("test")
    config.impl = "cuda"
    with pytest.raises(ValueError, match="config.impl='cuda' is invalid"):
        s2net.run(config, str(tmp_path))
    assert not os.listdir(tmp_path)
