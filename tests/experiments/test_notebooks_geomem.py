"""notebooks/geomem.ipynb executes top to bottom at the test preset (outputs stored stripped)."""

import pytest

from tests.experiments.notebooks import check_stripped, execute, figures, source

NAME = "geomem.ipynb"


def test_notebook_is_stored_without_outputs():
    code = check_stripped(NAME)
    assert "get_config('test')" in source(code)


@pytest.mark.slow
def test_notebook_runs_at_test_preset(monkeypatch):
    nb, text = execute(NAME, monkeypatch, timeout=600)
    assert "results.json" in text and "report.md" in text
    assert figures(nb) == 3
