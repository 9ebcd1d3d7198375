"""notebooks/geomem.ipynb executes top to bottom at the test preset (outputs stored stripped)."""

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "geomem.ipynb"


def test_notebook_is_stored_without_outputs():
    code = check_stripped(NAME)
    assert "get_config('test')" in "".join("".join(c["source"]) for c in code)


@pytest.mark.slow
def test_notebook_runs_at_test_preset(monkeypatch):
    nb, text = execute(NAME, monkeypatch, timeout=600)
    assert "results.json" in text and "report.md" in text
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3
