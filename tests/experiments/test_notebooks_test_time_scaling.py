"""notebooks/test_time_scaling.ipynb runs top to bottom at the test preset (outputs stripped
in git); each section prints a marker line this test checks."""

import re

import pytest

from tests.experiments.notebooks import check_stripped, execute

NAME = "test_time_scaling.ipynb"


def test_notebook_is_stripped():
    check_stripped(NAME)


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    _, text = execute(NAME, monkeypatch, timeout=900)
    # The hand-built scorer's best 2-path is exemplars 1 then 3 (values 0.9, 0.7).
    m = re.search(r"top paths under the hand-built scorer: \[\[(\d+), (\d+)\]", text)
    assert m and (int(m.group(1)), int(m.group(2))) == (1, 3)
    assert "MAZE claims held:" in text
    # Agent-REINFORCE: the tiny space normalises, and its experiment reports its claims.
    assert "sum of p over the tiny space: 1.0" in text
    assert re.search(r"accuracy \d\.\d{3}, [\d.]+ MFLOPs per problem", text)
    assert "AGENT-REINFORCE claims held:" in text
