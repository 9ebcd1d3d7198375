"""lab.config.validate and lab.outputs: errors that name the key, atomic writes, JSON safety."""

import json
import math
import os

import ml_collections
import numpy as np
import pytest

from lab import outputs
from lab.config import check_preset, validate


def _ref():
    c = ml_collections.ConfigDict()
    c.n = 8
    c.lr = 0.1
    c.flag = True
    c.name = "x"
    c.grid = [1, 2]
    c.sub = ml_collections.ConfigDict({"k": 3})
    return c


def test_validate_accepts_reference_and_int_for_float():
    c = _ref()
    c.lr = 1  # an int where a float is expected is fine
    assert validate(c, _ref()) is c


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c.__setitem__("extra", 1), "unknown config keys ['extra']"),
    (lambda c: c["sub"].__setitem__("typo", 1), "unknown config keys ['sub.typo']"),
    (lambda c: c.__setitem__("n", "8"), "config.n='8' has type str; expected int"),
    (lambda c: c.__setitem__("n", 2.5), "config.n=2.5 has type float; expected int"),
    (lambda c: c.__setitem__("flag", 1), "config.flag=1 has type int; expected bool"),
    (lambda c: c.__setitem__("n", True), "config.n=True has type bool; expected int"),
    (lambda c: c.__setitem__("grid", 3), "config.grid=3 has type int; expected list"),
])
def test_validate_names_key_value_and_expected(mutate, needle):
    c = _ref().to_dict()  # a plain dict: ConfigDict itself refuses some wrong types
    mutate(c)
    with pytest.raises(ValueError) as e:
        validate(c, _ref())
    assert needle in str(e.value)


def test_validate_missing_key_and_checks():
    c = _ref()
    del c["sub"]
    with pytest.raises(ValueError, match=r"missing keys \['sub.k'\]"):
        validate(c, _ref())
    c = _ref()
    c.n = -1
    with pytest.raises(ValueError, match=r"config.n=-1 is invalid; expected > 0"):
        validate(c, _ref(), {"n": (lambda v: v > 0, "> 0")})
    with pytest.raises(ValueError, match="no key 'nope'"):
        validate(_ref(), _ref(), {"nope": lambda v: True})


def test_check_preset():
    assert check_preset(None) == "default"
    assert check_preset("test") == "test"
    with pytest.raises(ValueError, match="preset='fast' is unknown"):
        check_preset("fast")


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    outputs.write_json(str(path), {"a": 1})

    real_fsync = os.fsync

    def broken(fd):  # the data are written, then the run dies before the rename
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(KeyboardInterrupt):
        outputs.write_json(str(path), {"a": 2, "big": list(range(1000))})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(os.listdir(tmp_path)) == ["results.json"]  # no temporary file left


def test_to_jsonable_handles_nan_numpy_and_nesting():
    got = outputs.to_jsonable({"nan": float("nan"), "inf": np.float32(np.inf),
                               "arr": np.array([1.5, np.nan]), "i": np.int64(3),
                               "b": np.bool_(True), "t": (1, 2), 4: "key"})
    assert got == {"nan": None, "inf": None, "arr": [1.5, None], "i": 3, "b": True,
                   "t": [1, 2], "4": "key"}
    json.dumps(got, allow_nan=False)  # strictly valid JSON


def test_write_outputs_requires_claims_and_writes_all(tmp_path):
    with pytest.raises(ValueError, match="no 'claims' list"):
        outputs.write_outputs(str(tmp_path), name="x", config={}, results={}, report="")
    c = outputs.claim("It works.", "accuracy", np.float32(0.5), np.bool_(True))
    assert c == {"claim": "It works.", "metric": "accuracy", "measured": 0.5, "holds": True}
    res = outputs.write_outputs(str(tmp_path), name="exp", config=_ref(),
                                results={"claims": [c], "v": math.nan}, report="body",
                                plots=["p.png"])
    assert res["v"] is None and res["plots"] == ["p.png"]
    assert json.loads((tmp_path / "config.json").read_text())["sub"] == {"k": 3}
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# exp") and "| yes | It works. | accuracy | 0.5 |" in report
    assert "![p.png](p.png)" in report


def test_markdown_table_formats():
    t = outputs.markdown_table([{"a": 1.23456, "b": None}, {"a": float("nan"), "b": "s"}])
    assert t.splitlines() == ["| a | b |", "|---|---|", "| 1.235 |  |", "| nan | s |"]
    assert outputs.markdown_table([]) == "(no rows)\n"
