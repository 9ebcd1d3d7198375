"""notebooks/reasoning.ipynb runs top to bottom at the test preset (outputs stripped in git).

Each section prints a marker line that this test checks, so a section that silently stops
producing its result fails here.
"""

import re

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "reasoning.ipynb"


def test_notebook_is_stripped():
    check_stripped(NAME)


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    _, text = execute(NAME, monkeypatch, timeout=900)
    for marker in ("COTGEO claims held:", "IPG claims held:", "GLR claims held:"):
        assert marker in text, marker
    # TCR-Agent: every answer it gives on a parsed story is exact.
    m = re.search(r"TCR agent parsed ([0-9.]+) of the stories, exact on ([0-9.]+)", text)
    assert m and float(m.group(1)) > 0.5 and float(m.group(2)) == 1.0
