"""notebooks/kernels.ipynb runs top to bottom at the test preset (outputs stripped in git)."""

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "kernels.ipynb"


def test_notebook_is_stripped():
    code = check_stripped(NAME)
    assert "import lab" in "".join(code[0]["source"])


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    _, text = execute(NAME, monkeypatch, timeout=300)
    assert "bit-exact vs numpy" in text
    assert "split_k" in text and "pass" in text
