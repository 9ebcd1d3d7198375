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
    assert all(isinstance(c["holds"], bool) for c in results["claims"])
    for task in s2net.TASKS:
        for kind in s2net.MODELS:
            entry = results["table"][task][kind]
            assert -1.0 <= entry["score"] <= 1.0 and entry["pj"] > 0, (task, kind, entry)
            assert (entry["spikes"] > 0) == (kind in ("s2net", "snn")), (task, kind)
    report = (tmp_path / "report.md").read_text()
    assert "| binding | s2net | ARI |" in report


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
