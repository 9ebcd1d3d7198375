"""What a launcher's console shows: Lab's own log lines and progress bars, not library internals.

Orbax logs every checkpoint save at INFO through ``absl.logging`` (manager, handler,
signalling-thread and throughput messages, ~60 lines per save), jax logs its backend
probing, matplotlib its font cache. :func:`quiet_third_party_logs`, called by
:func:`lab.launch.main` and ``experiments.reproduce``, drops INFO and DEBUG records whose
call site is outside this checkout's first-party directories (:data:`FIRST_PARTY`), unless
absl's ``--verbosity`` is 1 or more. Warnings and errors always pass, whoever logs them.
The filter decides by the record's source file, not its logger's name, because orbax logs
through absl's logger as Lab does.
"""

from __future__ import annotations

import logging as py_logging
import os

from absl import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_PARTY = tuple(os.path.join(ROOT, d) + os.sep
                    for d in ("lab", "kernels_pallas", "experiments", "configs", "benchmarks"))
THIRD_PARTY_VERBOSITY = 1  # absl --verbosity at which third-party INFO logs are shown


def is_first_party(pathname: str) -> bool:
    """Whether a log record's source file is in Lab's own directories."""
    return os.path.abspath(pathname).startswith(FIRST_PARTY)


class ThirdPartyFilter(py_logging.Filter):
    """Passes warnings and errors, Lab's own records, and everything at ``--verbosity >= 1``."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        return (record.levelno >= py_logging.WARNING or is_first_party(record.pathname)
                or logging.get_verbosity() >= THIRD_PARTY_VERBOSITY)


_FILTER = ThirdPartyFilter()


def quiet_third_party_logs() -> ThirdPartyFilter:
    """Installs :class:`ThirdPartyFilter` on absl's handler and on the root logger's handlers
    (once each; safe to call again); returns the filter.

    The verbosity is read at each record, so ``--verbosity=1`` given on the command line
    (parsed after this is called) still shows every library's INFO lines.
    """
    handlers = [logging.get_absl_handler(), *py_logging.getLogger().handlers]
    for h in handlers:
        if _FILTER not in h.filters:
            h.addFilter(_FILTER)
    return _FILTER
