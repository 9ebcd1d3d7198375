"""lab.console: third-party INFO logs stay off a launcher's console unless --verbosity asks."""

import logging as py_logging
import os
import subprocess
import sys

import pytest
from absl import logging

from lab import console

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORBAX = "/venv/lib/python3.12/site-packages/orbax/checkpoint/checkpoint_manager.py"


def _record(pathname: str, level: int) -> py_logging.LogRecord:
    return py_logging.LogRecord("absl", level, pathname, 1, "msg", (), None)


@pytest.fixture()
def verbosity():
    before = logging.get_verbosity()
    yield logging.set_verbosity
    logging.set_verbosity(before)


def test_filter_keeps_lab_lines_and_warnings_drops_library_info(verbosity):
    f = console.ThirdPartyFilter()
    verbosity(logging.INFO)  # absl's app.run default (--verbosity=0)
    assert not f.filter(_record(ORBAX, py_logging.INFO))
    assert not f.filter(_record(ORBAX, py_logging.DEBUG))
    assert f.filter(_record(ORBAX, py_logging.WARNING))
    assert f.filter(_record(os.path.join(ROOT, "lab", "zoo", "train.py"), py_logging.INFO))
    assert f.filter(_record(os.path.join(ROOT, "experiments", "prkv.py"), py_logging.INFO))
    assert not f.filter(_record(ROOT + "/labx/mod.py", py_logging.INFO))  # a prefix is not a dir
    verbosity(logging.DEBUG)  # --verbosity=1
    assert f.filter(_record(ORBAX, py_logging.INFO))


def test_installs_once_on_absl_handler():
    handler = logging.get_absl_handler()
    f = console.quiet_third_party_logs()
    try:
        assert console.quiet_third_party_logs() is f
        assert handler.filters.count(f) == 1
    finally:
        for h in [handler, *py_logging.getLogger().handlers]:
            h.removeFilter(f)


def test_launcher_console_has_stage_lines_and_no_orbax(tmp_path):
    """train_lm at the test preset saves an orbax checkpoint (~60 INFO lines before)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "MPLBACKEND": "Agg"}
    out = subprocess.run(
        [sys.executable, "-m", "experiments.train_lm", "--config=configs/train_lm.py:test",
         f"--workdir={tmp_path / 'w'}"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln[:1] in "IWE" and ln[1:5].isdigit()]
    sources = [ln.split("]")[0].split()[-1].split(":")[0] for ln in lines]
    assert "launch.py" in sources and "checkpoint_manager.py" not in sources
    assert len(lines) <= 5, lines
    assert any("train_lm: done in" in ln and "1 of 1 claims hold" in ln for ln in lines)
    assert (tmp_path / "w" / "train" / "checkpoints").is_dir()  # it did checkpoint
