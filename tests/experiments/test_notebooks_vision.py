"""notebooks/vision.ipynb runs top to bottom at the test preset (outputs stripped in git).

Each section prints a marker line that this test checks, so a section that silently stops
producing its result fails here.
"""

import re

import pytest

from tests.experiments.notebooks import check_stripped, execute, figures, source

NAME = "vision.ipynb"


def test_notebook_is_stripped():
    code = check_stripped(NAME)
    assert 'PRESET = "test"' in source(code)


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    nb, text = execute(NAME, monkeypatch, timeout=600)
    # The tiny zoo VLM reads its one object's colour from the image (held out).
    m = re.search(r"VLM vlm-test \{'all frames': ([0-9.]+), 'evidence only': ([0-9.]+), "
                  r"'no frames': ([0-9.]+)\}", text)
    assert m, "the video accuracies line is missing"
    m = re.search(r"images \(held out\): \{[^}]*'colour': ([0-9.]+)", text)
    assert m and float(m.group(1)) > 0.6, m and m.group(0)
    # A flat map keeps all 16 frames, one sharp peak keeps few.
    m = re.search(r"GRIDPROBE M_eff flat / one peak / probed: (\d+) (\d+) (\d+)", text)
    assert m and int(m.group(1)) == 16 and int(m.group(2)) <= 2, m and m.group(0)
    assert re.search(r"GRIDPROBE claims 6", text)
    # vMF samples' mean resultant length within Monte Carlo error, density within 1e-5.
    rows = re.findall(r"mean resultant length ([0-9.]+) \(expected ([0-9.]+)\), "
                      r"log-density relative error vs scipy ([0-9.e+-]+)", text)
    assert len(rows) == 3
    for got, want, err in rows:
        assert abs(float(got) - float(want)) < 0.03 and float(err) < 1e-5
    m = re.search(r"GRAM loss rotated and scaled: ([0-9.e+-]+) \| unrelated: ([0-9.]+)", text)
    assert m and float(m.group(1)) < 1e-5 and float(m.group(2)) > 0.01
    assert figures(nb) == 2
