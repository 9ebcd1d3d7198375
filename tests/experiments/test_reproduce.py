"""experiments/reproduce.py: discovery, the combined report (claims marked informative by their
run's regime), failures that do not stop the run; experiments/results_doc.py's page."""

import json
import os
import sys
import textwrap

import pytest
from absl import flags

from experiments import reproduce, results_doc
from lab import zoo
from lab.outputs import claim, regime, write_outputs


def test_discover_finds_geomem_and_skips_launchers_without_a_config():
    names = reproduce.discover()
    assert "geomem" in names
    assert "reproduce" not in names and "train_lm" not in names


def test_experiments_out_of_the_main_job_are_named_with_their_reason(tmp_path):
    names = reproduce.discover()
    out = reproduce.left_out(names)
    assert not {"card", "geomem", "gridprobe", "tcr"} & set(out)   # every regime holds today
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "a.py").write_text('OUT_OF_MAIN_JOB = "not yet"\n')
    (tmp_path / "experiments" / "b.py").write_text("# OUT_OF_MAIN_JOB = 'a comment'\n")
    (tmp_path / "experiments" / "c.py").write_text('OUT_OF_MAIN_JOB = ("two "\n    "lines")\n')
    assert reproduce.left_out(["a", "b", "c"], root=str(tmp_path)) == {
        "a": "not yet", "c": "two lines"}
    (tmp_path / "experiments" / "d.py").write_text("OUT_OF_MAIN_JOB = 3\n")
    with pytest.raises(ValueError, match=r"d.py: OUT_OF_MAIN_JOB = 3; expected a non-empty str"):
        reproduce.left_out(["d"], root=str(tmp_path))
    report = reproduce.combined_report("test", [], str(tmp_path), {"a": "not yet"})
    assert "- `a`: not yet" in report


def test_only_geomem_writes_scoreboard_status_and_rewritten_plots(tmp_path):
    summary = reproduce.run_all("test", str(tmp_path), only=["geomem"])
    assert summary["failed"] == [] and [e["name"] for e in summary["experiments"]] == ["geomem"]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Lab reproduction report (preset `test`)")
    assert "## Scoreboard" in report and "## Status" in report
    on_disk = json.loads((tmp_path / "geomem" / "results.json").read_text())
    n_claims = len(on_disk["claims"])
    assert summary["experiments"][0]["claims"] == on_disk["claims"]
    assert summary["claims_total"] == n_claims == 10
    held = sum(c["holds"] for c in on_disk["claims"])
    assert summary["claims_held"] == held
    assert f"{held} of {n_claims} claims hold" in report
    # one scoreboard row per claim and one regime row per check
    assert report.count("| geomem | yes |") + report.count("| geomem | no |") == \
        n_claims + len(on_disk["regime"])
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

    def off(config, workdir):  # its claims hold, but outside the regime where they mean much
        ran.append("off")
        return write_outputs(workdir, name="off", config=config, report="off body", results={
            "claims": [claim("Off works.", "m", {"a": 0.9895833333333334, "b": 12}, True),
                       claim("Off also works.", "m", 0.5, False)],
            "regime": [regime("accuracy in [0.3, 0.95]", 0.9895833333333334, False),
                       regime("spread >= 0.1", 0.25, True)]})

    def on(config, workdir):
        ran.append("on")
        return write_outputs(workdir, name="on", config=config, report="on body", results={
            "claims": [claim("On works.", "m", 0.123456, True)],
            "regime": [regime("accuracy in [0.3, 0.95]", 0.5, True)]})

    def parts(config, workdir):  # its second part's check fails: only that part's claims
        ran.append("parts")
        return write_outputs(workdir, name="parts", config=config, report="parts body",
                             results={
            "claims": [claim("A works.", "m", 1.0, True),
                       claim("B works.", "m", 0.2, False, part="B")],
            "regime": [regime("task solved", 1.0, True),
                       regime("B's truth not flat", 1, False, part="B")]})

    runs = {"broken": broken, "fine": fine, "off": off, "on": on, "parts": parts}
    monkeypatch.setattr(reproduce, "discover", lambda root=None: list(runs))
    monkeypatch.setattr(reproduce, "load", lambda name: (get_config, runs[name]))


def test_a_failing_experiment_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    ran = []
    _fake_registry(monkeypatch, ran)
    summary = reproduce.run_all("test", str(tmp_path))
    assert ran == ["broken", "fine", "off", "on", "parts"]
    assert summary["failed"] == ["broken"] and summary["claims_held"] == 4
    report = (tmp_path / "report.md").read_text()
    assert "| broken | failed |" in report and "RuntimeError: deliberate failure" in report
    assert "| fine | yes | unchecked | Fine works. |" in report and "fine body" in report
    assert "deliberate failure" in (tmp_path / "broken" / "error.txt").read_text()


def test_compiled_programs_are_released_after_each_experiment(tmp_path, monkeypatch):
    # XLA maps each CPU executable into the process; a dozen experiments' programs
    # kept alive passed vm.max_map_count and killed the main job at a compile.
    import jax
    import jax.numpy as jnp

    double = jax.jit(lambda x: 2 * x)
    sizes = []

    def compiles(config, workdir):
        sizes.append(double._cache_size())  # what the previous experiment left
        double(jnp.ones(3 + len(sizes)))
        return write_outputs(workdir, name="c", config=config, report="", results={})

    monkeypatch.setattr(reproduce, "discover", lambda root=None: ["a", "b"])
    monkeypatch.setattr(reproduce, "load", lambda name: (lambda p: {"preset": p}, compiles))
    reproduce.run_all("test", str(tmp_path))
    assert sizes == [0, 0] and double._cache_size() == 0


def test_the_models_table_says_where_each_zoo_model_came_from(tmp_path, monkeypatch):
    """A run names each zoo model it loaded: cached on this host, or (``retrain``) trained in
    this run with its training time; ``LAB_ZOO`` is restored after a retraining run."""
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(zoo.SOURCE_ENV, raising=False)
    spec = zoo.get_spec("lm-test")
    zoo.load_spec(spec, progress=False)
    monkeypatch.setitem(zoo.TRAININGS, spec.key, 0)  # as a later process sees it

    def uses_zoo(config, workdir):
        zoo.load("lm-test", progress=False)
        zoo.load("lm-test", progress=False)  # loaded twice, listed once
        return write_outputs(workdir, name="uses_zoo", config=config, report="body",
                             results={"claims": [claim("Zoo works.", "m", 1.0, True)]})

    monkeypatch.setattr(reproduce, "discover", lambda root=None: ["uses_zoo"])
    monkeypatch.setattr(reproduce, "load", lambda name: (lambda p: {"preset": p}, uses_zoo))
    summary = reproduce.run_all("test", str(tmp_path / "a"))
    (model,) = summary["experiments"][0]["models"]
    assert model["key"] == spec.key and model["source"] == "cached"
    report = (tmp_path / "a" / "report.md").read_text()
    assert "## Models" in report and f"| uses_zoo | {spec.key} | cached on this host |" in report
    assert "Zoo training in this run: 0 models, 0 s" in report
    summary = reproduce.run_all("test", str(tmp_path / "b"), retrain=True)
    (model,) = summary["experiments"][0]["models"]
    assert model["source"] == "trained" and model["train_seconds"] > 0 and summary["retrain"]
    assert zoo.TRAININGS[spec.key] == 1 and zoo.SOURCE_ENV not in os.environ
    report = (tmp_path / "b" / "report.md").read_text()
    assert f"| uses_zoo | {spec.key} | trained in this run | float32 |" in report
    assert "Zoo training in this run: 1 models" in report


def test_claims_of_a_run_whose_regime_fails_are_not_informative(tmp_path, monkeypatch):
    _fake_registry(monkeypatch, [])
    summary = reproduce.run_all("test", str(tmp_path))
    informative = {e["name"]: e["informative"] for e in summary["experiments"]}
    assert informative == {"broken": None, "fine": None, "off": False, "on": True,
                           "parts": False}
    assert summary["claims_total"] == 6 and summary["claims_held"] == 4
    # parts' claim A is informative (its checks hold), its claim B is not
    assert summary["claims_informative"] == 2 and summary["claims_informative_held"] == 2
    report = (tmp_path / "report.md").read_text()
    assert "4 of 6 claims hold" in report
    assert ("Informative (the regime checks of their run, or of their part of it, hold): 2 "
            "claims, 2 of them hold. Not informative (such a check fails): 3. Unchecked "
            "(their experiment states no regime): 1.") in report
    assert "| parts | yes | yes | A works. |" in report
    assert "| parts | no | no | B works. |" in report
    assert "| parts | no | [B] B's truth not flat | 1 |" in report
    parts = (tmp_path / "parts" / "report.md").read_text()
    assert "| no | [B] B works. | m | 0.2 |" in parts
    assert "A regime check of the part 'B' fails: that part's claims are not" in parts
    # measured values rounded to 3 significant digits; a dict as key=value pairs
    assert "| off | yes | no | Off works. | m | a=0.99, b=12 |" in report
    assert "| off | no | no | Off also works. | m | 0.5 |" in report
    assert "| on | yes | yes | On works. | m | 0.123 |" in report
    assert "| off | no | accuracy in [0.3, 0.95] | 0.99 |" in report  # the regime table
    assert "| on | yes | accuracy in [0.3, 0.95] | 0.5 |" in report
    assert "0.9895833333333334" not in report and '{"a"' not in report
    assert json.loads((tmp_path / "results.json").read_text())["claims_informative"] == 2


def _fake_run(workdir, name, preset, results):
    os.makedirs(workdir / name)
    (workdir / name / "config.json").write_text(json.dumps({"preset": preset}))
    (workdir / name / "results.json").write_text(json.dumps(results))


def test_results_doc_writes_regime_claims_and_main_table_per_experiment(tmp_path):
    runs = tmp_path / "runs"
    _fake_run(runs, "prkv", "default", {
        "claims": [claim("PRKV on par.", "mean exact match",
                         {"prkv": 0.7708333333333334, "snapkv": 0.8020833333333334}, False)],
        "regime": [regime("full-cache exact match on needle in [0.3, 0.95]", 0.8125, True)],
        "accuracy": {t: {p: {"0.0": 0.9, "0.5": a} for p, a in
                         (("full", 0.9), ("snapkv", 0.61111), ("prkv", 0.65432))}
                     for t in ("needle", "variable_tracking")}})
    _fake_run(runs, "geomem", "default", {
        "claims": [claim("Width grows like log N.", "R^2", 0.987654, True)],
        "table": [{"n": 64, "d_train": 12, "r2": 0.912345}]})
    out = tmp_path / "docs" / "results.md"
    results_doc.write(str(runs), str(out), names=["geomem", "prkv", "s2net"])
    page = out.read_text()
    assert page.startswith("# Results\n")
    assert "2 experiments. 1 of 2 claims hold; 1 claims are informative (the regime" in page
    assert "No results for: s2net." in page
    geo, prkv = page.split("## geomem\n")[1].split("## prkv\n")
    assert "Preset `default`. 1 of 1 claims hold. The experiment states no regime" in geo
    assert "| yes | Width grows like log N. | R^2 | 0.988 |" in geo
    assert "| n | d_train | r2 |" in geo and "| 64 | 12 | 0.912 |" in geo  # first row list
    assert "Every regime check holds: the claims are informative." in prkv
    assert "| yes | full-cache exact match on needle in [0.3, 0.95] | 0.812 |" in prkv
    assert "| no | PRKV on par. | mean exact match | prkv=0.771, snapkv=0.802 |" in prkv
    # prkv's own main_table: exact match per policy and ratio, mean over its tasks
    assert "| policy | r=0 | r=0.5 |" in prkv and "| prkv | 0.9 | 0.654 |" in prkv
    assert "Run on its own" not in page

    # A run of its own (an experiment the main job leaves out) joins the page in name order.
    _fake_run(tmp_path / "alone", "lone", "default", {
        "claims": [claim("Alone it works.", "gain", 0.1, True)]})
    page = results_doc.render(str(runs), extra={"lone": str(tmp_path / "alone" / "lone")})
    assert "3 experiments. 2 of 3 claims hold" in page
    assert page.index("## geomem") < page.index("## lone") < page.index("## prkv")
    assert ("## lone\n\nRun on its own (`python -m experiments.lone`), outside the main "
            "job.\n") in page
    with pytest.raises(ValueError, match=r"extra\['tar'\]='/nowhere' holds no results.json"):
        results_doc.render(str(runs), extra={"tar": "/nowhere"})


def test_results_doc_refuses_test_preset_and_empty_workdirs(tmp_path):
    _fake_run(tmp_path, "fine", "test", {"claims": []})
    with pytest.raises(ValueError, match=r"\['fine'\] ran at preset 'test'"):
        results_doc.render(str(tmp_path))
    assert "## fine" in results_doc.render(str(tmp_path), allow_test=True)
    with pytest.raises(ValueError, match="holds no <experiment>/results.json"):
        results_doc.render(str(tmp_path / "fine"))


def test_main_exits_1_after_writing_the_report_when_one_failed(tmp_path, monkeypatch):
    _fake_registry(monkeypatch, [])
    flags.FLAGS(["reproduce", f"--workdir={tmp_path}", "--preset=test", "--jobs=1"])
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
    with pytest.raises(ValueError, match=r"jobs=0; expected an int >= 1"):
        reproduce.run_all("test", str(tmp_path), jobs=0)
    assert not os.listdir(tmp_path)


def test_every_launcher_imports_in_one_process_without_defining_flags():
    # Launchers define --config/--workdir only when run as programs (lab.launch), so
    # reproduce, pytest and notebooks can import all of them together.
    import importlib

    for name in reproduce.discover():
        module = importlib.import_module(f"experiments.{name}")
        assert callable(module.run)
    assert "config" not in flags.FLAGS


def test_two_jobs_run_real_experiments_in_processes_of_their_own(tmp_path):
    """``jobs=2``: each experiment in its own process, its log beside its outputs, the same
    entries (discovery order, claims as on disk) and the run's wall-clock time reported."""
    summary = reproduce.run_all("test", str(tmp_path), only=["tar_baselines", "ipg"], jobs=2)
    assert [e["name"] for e in summary["experiments"]] == ["ipg", "tar_baselines"]
    assert summary["failed"] == [] and summary["jobs"] == 2 and summary["seconds"] > 0
    for e in summary["experiments"]:
        on_disk = json.loads((tmp_path / e["name"] / "results.json").read_text())
        assert e["claims"] == on_disk["claims"] and e["regime"] == on_disk["regime"]
        assert f"reproduce: {e['name']} ok in" in (tmp_path / f"{e['name']}.log").read_text()
    report = (tmp_path / "report.md").read_text()
    assert "minutes of wall-clock time (2 at a time)" in report


# What every scripted worker runs first: ``done(seconds)`` writes its (claimless) entry.
WORKER_PRELUDE = """
import json
def done(seconds):
    with open(ENTRY, "w") as f:
        json.dump({"name": NAME, "status": "ok", "claims": [], "regime": [],
                   "seconds": seconds, "models": [], "informative": None}, f)
"""


def _scripted_workers(monkeypatch, tmp_path, scripts):
    """Workers that run ``scripts[name]`` (Python source; ``NAME`` is the experiment,
    ``STAMPS`` a file it appends time stamps to, ``done(seconds)`` writes its entry)."""
    stamps = tmp_path / "stamps.txt"

    def command(name, preset, workdir):
        entry = reproduce._entry_path(workdir, name)
        return [sys.executable, "-c", f"ENTRY, STAMPS, NAME = {entry!r}, {str(stamps)!r}, "
                f"{name!r}" + WORKER_PRELUDE + textwrap.dedent(scripts[name])]

    monkeypatch.setattr(reproduce, "discover", lambda root=None: list(scripts))
    monkeypatch.setattr(reproduce, "_worker_command", command)
    return stamps


SLEEPER = """
    import time
    time.sleep(0.6)
    done(0.6)
"""
BUSY = """
    import time
    with open(STAMPS, "a") as f:
        for _ in range(150):  # a time stamp every 10 ms
            f.write(f"{NAME} {time.time()}\\n"); f.flush(); time.sleep(0.01)
    done(1.5)
"""
TIMER = """
    import time
    from lab import timing
    time.sleep(0.3)
    with timing.alone("a test section"):
        t0 = time.time(); time.sleep(0.6); t1 = time.time()   # both inside the section
    with open(STAMPS, "a") as f:
        f.write(f"section {t0} {t1}\\n")
    done(0.9)
"""


def test_a_timed_section_runs_while_the_other_workers_are_stopped(tmp_path, monkeypatch):
    stamps = _scripted_workers(monkeypatch, tmp_path, {"a": TIMER, "b": BUSY, "c": BUSY})
    summary = reproduce.run_all("test", str(tmp_path / "runs"), jobs=3)
    assert summary["failed"] == []
    lines = [line.split() for line in stamps.read_text().splitlines()]
    (t0, t1), = [(float(a), float(b)) for n, a, b in (x for x in lines if x[0] == "section")]
    busy = {n: [float(t) for m, t in (x for x in lines if x[0] == n)] for n in "bc"}
    for stamps_of in busy.values():
        assert not [t for t in stamps_of if t0 + 0.02 < t < t1]  # stopped beside the section
        assert [t for t in stamps_of if t < t0]   # started with the timer (3 jobs at once)
        assert [t for t in stamps_of if t > t1]   # and continued after its section
    assert not (tmp_path / "runs" / ".alone").exists()         # its files are gone


def test_a_worker_that_dies_is_a_failed_experiment_and_the_others_still_run(tmp_path,
                                                                            monkeypatch):
    _scripted_workers(monkeypatch, tmp_path, {"dies": "import os; os._exit(3)",
                                              "fine": SLEEPER})
    summary = reproduce.run_all("test", str(tmp_path / "runs"), jobs=2)
    assert summary["failed"] == ["dies"]
    dead = summary["experiments"][0]
    assert dead["error"] == "worker process exited with status 3 (log: dies.log)"
    assert "status 3" in (tmp_path / "runs" / "dies" / "error.txt").read_text()
    report = (tmp_path / "runs" / "report.md").read_text()
    assert "| dies | failed |" in report and "| fine | ok |" in report
