"""The absl entry point every launcher shares.

A launcher ends with::

    if __name__ == "__main__":
        launch.main(run)

which defines ``--config`` (``config_flags.DEFINE_config_file``, locked, so an
unknown ``--config.key`` fails loudly) and ``--workdir`` and calls
``run(config, workdir)``. The flags are defined only when the launcher is the
program, never at import, so that any number of launchers can be imported in
one process (``experiments.reproduce``, pytest, a notebook) without absl's
``DuplicateFlagError``. The console shows Lab's log lines, one at the start and one at
the end of the run, and progress bars; other libraries' INFO logs only with
``--verbosity=1`` or more (:func:`lab.console.quiet_third_party_logs`). Compiled programs
persist in ``$LAB_CACHE/xla`` (:func:`lab.host.use_compile_cache`), so a rerun loads them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from absl import app, flags, logging
from ml_collections import config_flags

from lab import console, host


def _name() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name.rsplit(".", 1)[-1] if spec else os.path.basename(sys.argv[0])


def main(run: Callable[..., dict]) -> None:
    config_flags.DEFINE_config_file("config", lock_config=True)
    flags.DEFINE_string("workdir", None, "Output directory.", required=True)

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        console.quiet_third_party_logs()
        host.use_compile_cache()
        name, config, workdir = _name(), flags.FLAGS.config, flags.FLAGS.workdir
        logging.info("%s: preset %s, writing to %s", name, config.get("preset"), workdir)
        t0 = time.time()
        results = run(config, workdir)
        claims = results.get("claims", []) if isinstance(results, dict) else []
        logging.info("%s: done in %.0f s; %d of %d claims hold; %s", name, time.time() - t0,
                     sum(bool(c.get("holds")) for c in claims), len(claims),
                     os.path.join(workdir, "report.md"))

    app.run(_main)
