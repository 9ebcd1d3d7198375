"""Lets several absl launchers be imported in one pytest process.

Every ``experiments/<name>.py`` defines ``--config`` and ``--workdir`` at import
(the launcher pattern, DESIGN.md); absl refuses a second definition of a flag
from another module (DuplicateFlagError). Before each test module here is
imported, the launcher flags defined by a previous one are removed, as
``experiments.reproduce`` does when it imports the launchers in one process.
"""

import pytest
from absl import flags

LAUNCHER_FLAGS = ("config", "workdir")


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):
        for name in LAUNCHER_FLAGS:
            if name in flags.FLAGS:
                delattr(flags.FLAGS, name)
