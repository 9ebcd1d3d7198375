"""The absl entry point every launcher shares.

A launcher ends with::

    if __name__ == "__main__":
        launch.main(run)

which defines ``--config`` (``config_flags.DEFINE_config_file``, locked, so an
unknown ``--config.key`` fails loudly) and ``--workdir`` and calls
``run(config, workdir)``. The flags are defined only when the launcher is the
program, never at import, so that any number of launchers can be imported in
one process (``experiments.reproduce``, pytest, a notebook) without absl's
``DuplicateFlagError``.
"""

from __future__ import annotations

from collections.abc import Callable

from absl import app, flags
from ml_collections import config_flags


def main(run: Callable[..., dict]) -> None:
    config_flags.DEFINE_config_file("config", lock_config=True)
    flags.DEFINE_string("workdir", None, "Output directory.", required=True)

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        run(flags.FLAGS.config, flags.FLAGS.workdir)

    app.run(_main)
