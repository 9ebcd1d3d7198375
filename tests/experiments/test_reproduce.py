"""experiments/reproduce.py: discovery, the combined report, failures that do not stop the run."""

import json
import os

import pytest
from absl import flags

from experiments import reproduce
from lab.outputs import claim, write_outputs


def test_discover_finds_geomem_and_skips_launchers_without_a_config():
    names = reproduce.discover()
    assert "geomem" in names
    assert "reproduce" not in names and "train_lm" not in names


def test_only_geomem_writes_scoreboard_status_and_rewritten_plots(tmp_path):
    summary = reproduce.run_all("test", str(tmp_path), only=["geomem"])
    assert summary["failed"] == [] and [e["name"] for e in summary["experiments"]] == ["geomem"]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Lab reproduction report (preset `test`)")
    assert "## Scoreboard" in report and "## Status" in report
    n_claims = len(summary["experiments"][0]["claims"])
    assert n_claims == summary["claims_total"] > 0
    assert f"{summary['claims_held']} of {n_claims} claims hold" in report
    assert report.count("| geomem | yes |") + report.count("| geomem | no |") == n_claims
    assert "![dims_vs_logn.png](geomem/dims_vs_logn.png)" in report
    assert report.count("\n## geomem\n") == 1 and "\n### Claims\n" in report  # demoted
    assert (tmp_path / "geomem" / "dims_vs_logn.png").exists()
    assert json.loads((tmp_path / "results.json").read_text())["claims_total"] == n_claims


def _fake_registry(monkeypatch, ran):
    def get_config(preset):
        return {"preset": preset}

    def broken(config, workdir):
        ran.append("broken")
        raise RuntimeError("deliberate failure")

    def fine(config, workdir):
        ran.append("fine")
        return write_outputs(workdir, name="fine", config=config, report="fine body",
                             results={"claims": [claim("Fine works.", "m", 1.0, True)]})

    monkeypatch.setattr(reproduce, "discover", lambda root=None: ["broken", "fine"])
    monkeypatch.setattr(reproduce, "load", lambda name: (get_config, {"broken": broken,
                                                                      "fine": fine}[name]))


def test_a_failing_experiment_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    ran = []
    _fake_registry(monkeypatch, ran)
    summary = reproduce.run_all("test", str(tmp_path))
    assert ran == ["broken", "fine"]
    assert summary["failed"] == ["broken"] and summary["claims_held"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "| broken | failed |" in report and "RuntimeError: deliberate failure" in report
    assert "| fine | yes | Fine works. |" in report and "fine body" in report
    assert "deliberate failure" in (tmp_path / "broken" / "error.txt").read_text()


def test_main_exits_1_after_writing_the_report_when_one_failed(tmp_path, monkeypatch):
    _fake_registry(monkeypatch, [])
    flags.FLAGS(["reproduce", f"--workdir={tmp_path}", "--preset=test"])
    try:
        with pytest.raises(SystemExit) as e:
            reproduce.main([])
        assert e.value.code == 1
        assert (tmp_path / "report.md").exists()
    finally:
        flags.FLAGS.unparse_flags()


def test_unknown_only_and_preset_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"--only names \['nope'\] are not registered"):
        reproduce.run_all("test", str(tmp_path), only=["nope"])
    with pytest.raises(ValueError, match="preset='fast' is unknown"):
        reproduce.run_all("fast", str(tmp_path))
    assert not os.listdir(tmp_path)


def test_every_launcher_imports_in_one_process_without_defining_flags():
    # Launchers define --config/--workdir only when run as programs (lab.launch), so
    # reproduce, pytest and notebooks can import all of them together.
    import importlib

    for name in reproduce.discover():
        module = importlib.import_module(f"experiments.{name}")
        assert callable(module.run)
    assert "config" not in flags.FLAGS
