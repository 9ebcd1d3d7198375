"""notebooks/post_training.ipynb runs top to bottom at the test preset (outputs stripped
in git); each section prints a marker line this test checks."""

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "post_training.ipynb"


def test_notebook_is_stripped():
    check_stripped(NAME)


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    _, text = execute(NAME, monkeypatch, timeout=900)
    assert "malformed action -> malformed reward 0.0" in text
    assert "decisive spans:" in text and "GUI chance:" in text
    assert "GUI-LIBRA claims held:" in text
    assert "labels flipped:" in text and "shortcut caption_only" in text
    assert "HUMOR claims held:" in text
    assert "executor labels: ('wrong', 'advance', 'misleading', 'advance')" in text
    assert "CARD claims held:" in text
