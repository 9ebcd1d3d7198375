"""notebooks/long_context.ipynb runs top to bottom at the test preset (outputs stripped in git)."""

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "long_context.ipynb"


def test_notebook_is_stripped():
    check_stripped(NAME)


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    _, text = execute(NAME, monkeypatch)
    # PRKV: the multi-hop chain is kept, the question's own attention sees one hop.
    assert "PRKV kept: [0, 3, 7, 11]" in text
    assert "the question's own attention reaches: [7]" in text
    assert "PRKV scoring / prefill forward: " in text  # the cost cell ran (a timing: no bound)
    assert "PRKV experiment claims:" in text
    # GOLD PANNING: the simulated sweep ran.
    assert "GOLD PANNING N=" in text
