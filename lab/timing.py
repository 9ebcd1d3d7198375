"""Timing on a shared host: sections that hold the host alone while they time it.

``experiments.reproduce --jobs=N`` runs N experiments at once, each in a process of its
own. A claim that times the host (seconds per step, a speed-up, a measured latency)
would also measure the other experiments' load. Its timed code runs inside
``with timing.alone("why")``: while the section runs, the scheduler stops every other
experiment's process (``SIGSTOP``) and continues it (``SIGCONT``) when the section ends.
The section has the host to itself and the rest of the run still overlaps; compile and
warm up before the section, time inside it.

The protocol is files in the directory ``$LAB_ALONE_DIR``, which the scheduler sets for
its workers (:meth:`Grants.env`, with its own pid in ``$LAB_ALONE_SCHEDULER``): a section
writes ``<pid>.<n>.request`` and waits for ``<pid>.<n>.granted``; the scheduler
(:class:`Grants`) grants one request at a time, after stopping the other workers, and
continues them once the request file is gone or its process has ended. Outside a worker
(a launcher run by hand, ``--jobs=1``, or a process a worker started, which inherits the
variables but is not the scheduler's child) a section does nothing, and a section inside
a section is part of the outer one.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import signal
import time
from collections.abc import Collection, Iterator

from lab.atomic import write_text

ENV, SCHEDULER_ENV = "LAB_ALONE_DIR", "LAB_ALONE_SCHEDULER"
POLL_SECONDS = 0.05
_sections = itertools.count()
_depth = 0


def _stem(directory: str, pid: int, n: int) -> str:
    return os.path.join(directory, f"{pid}.{n}")


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def alone(why: str) -> Iterator[None]:
    """Runs the body while no other worker of the scheduler computes (see the module
    docstring); ``why`` (the claim being timed) is written into the request file.

    Waits for the grant as long as the scheduler that started this process lives; if it
    is gone, the section runs without one."""
    global _depth
    directory = os.environ.get(ENV)
    if not why or not isinstance(why, str):
        raise ValueError(f"why={why!r}; expected a non-empty str naming what is timed")
    worker = directory and os.environ.get(SCHEDULER_ENV) == str(os.getppid())
    if not worker or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    stem, parent = _stem(directory, os.getpid(), next(_sections)), os.getppid()
    write_text(stem + ".request", why + "\n")
    while not os.path.exists(stem + ".granted") and os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        _remove(stem + ".granted")
        _remove(stem + ".request")


class Grants:
    """The scheduler's side: grants the sections of its workers one at a time.

    Call :meth:`poll` with the running workers' pids in the scheduler's loop, and do not
    start a worker while :attr:`held`; :meth:`close` continues every stopped worker."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.holder: tuple[int, str] | None = None  # (pid, stem) of the granted section
        self.stopped: list[int] = []
        self.granted = 0  # sections granted so far

    def env(self) -> dict[str, str]:
        """The environment variables that make a child process one of the workers."""
        return {ENV: self.directory, SCHEDULER_ENV: str(os.getpid())}

    @property
    def held(self) -> bool:
        return self.holder is not None

    def poll(self, pids: Collection[int]) -> None:
        """Ends the granted section once its request is gone or its process has exited,
        then grants the oldest request of a running worker (stopping the others)."""
        if self.holder is not None:
            pid, stem = self.holder
            if pid in pids and os.path.exists(stem + ".request"):
                return
            self._release()
        # (glob's * skips the hidden ".tmp-*" files of a request still being written)
        requests = sorted(glob.glob(os.path.join(self.directory, "*.request")),
                          key=lambda p: (os.path.getmtime(p), p))
        for path in requests:
            pid = int(os.path.basename(path).split(".")[0])
            if pid not in pids:  # its worker ended while waiting
                _remove(path)
                continue
            for other in pids:
                if other != pid:
                    os.kill(other, signal.SIGSTOP)
                    self.stopped.append(other)
            stem = path[:-len(".request")]
            self.holder = (pid, stem)
            self.granted += 1
            write_text(stem + ".granted", "")
            return

    def _release(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.holder is not None:
            _remove(self.holder[1] + ".granted")  # its process ended inside the section
        self.stopped, self.holder = [], None

    def close(self) -> None:
        """Continues every stopped worker (the scheduler is done or interrupted)."""
        self._release()
