"""lab.timing: a section that times the host runs while the other workers are stopped."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from lab import timing

# A worker that appends a time stamp to its file every 10 ms, ``seconds`` * 100 times.
BUSY = textwrap.dedent("""
    import sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    with open(path, "a") as f:
        for _ in range(int(seconds * 100)):
            f.write(f"{time.time()}\\n"); f.flush(); time.sleep(0.01)
""")
# A worker that waits 0.3 s, then times a 0.5 s section alone (its start and end go to its
# file); with ``die`` it exits inside the section.
TIMER = textwrap.dedent("""
    import os, sys, time
    from lab import timing
    path, die = sys.argv[1], sys.argv[2] == "die"
    time.sleep(0.3)
    with timing.alone("a test section"):
        t0 = time.time(); time.sleep(0.5)
        if die:
            os._exit(0)
        with open(path, "w") as f:
            f.write(f"{t0} {time.time()}\\n")
""")


def _schedule(tmp_path, die=False):
    """Starts two busy workers and one timer under :class:`timing.Grants`, polling as
    ``experiments.reproduce`` does until all exit; returns the stamps and the grants."""
    grants = timing.Grants(str(tmp_path / "alone"))
    env = dict(os.environ, **grants.env())
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(tmp_path / f"busy{i}"), "1.5"],
                              env=env) for i in range(2)]
    procs.append(subprocess.Popen([sys.executable, "-c", TIMER, str(tmp_path / "timer"),
                                   "die" if die else "live"], env=env))
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(timing.POLL_SECONDS)
            grants.poll([p.pid for p in procs if p.poll() is None])
    finally:
        grants.close()
    stamps = [[float(t) for t in (tmp_path / f"busy{i}").read_text().split()] for i in range(2)]
    return stamps, grants, procs


def test_the_other_workers_stop_during_a_section_and_continue_after(tmp_path):
    stamps, grants, procs = _schedule(tmp_path)
    assert [p.returncode for p in procs] == [0, 0, 0] and grants.granted == 1
    t0, t1 = map(float, (tmp_path / "timer").read_text().split())
    assert t1 - t0 >= 0.5
    for s in stamps:
        assert not [t for t in s if t0 + 0.02 < t < t1]    # stopped for the whole section
        assert [t for t in s if t < t0] and [t for t in s if t > t1]  # ran before and after
        assert s[-1] - s[0] > 1.5 + 0.4                    # the section's time was added
    assert not os.listdir(grants.directory) and not grants.held


def test_a_worker_that_dies_inside_its_section_releases_the_others(tmp_path):
    stamps, grants, procs = _schedule(tmp_path, die=True)
    assert grants.granted == 1 and not grants.held and not grants.stopped
    assert all(p.returncode == 0 for p in procs)   # the busy ones were continued and finished
    assert not os.listdir(grants.directory)        # its request and grant files are gone


def test_without_a_scheduler_a_section_is_a_no_op_and_nests(monkeypatch):
    monkeypatch.delenv(timing.ENV, raising=False)
    with timing.alone("outer"), timing.alone("inner"):
        pass
    with pytest.raises(ValueError, match="why=''"):
        with timing.alone(""):
            pass


def test_a_process_the_scheduler_did_not_start_runs_its_section_at_once(tmp_path, monkeypatch):
    """A worker's own child inherits the variables, but its parent is not the scheduler:
    no request is made (the scheduler would never grant it)."""
    monkeypatch.setenv(timing.ENV, str(tmp_path))
    monkeypatch.setenv(timing.SCHEDULER_ENV, str(os.getppid() + 1))
    with timing.alone("a grandchild's section"):
        assert os.listdir(tmp_path) == []
