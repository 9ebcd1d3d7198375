"""lab.config.validate, lab.atomic and lab.outputs: errors that name the key, atomic writes,
JSON safety, rounded report numbers, regime checks."""

import json
import math
import os

import ml_collections
import numpy as np
import pytest

from lab import atomic, outputs
from lab.config import SEEDS, check_preset, validate


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


def test_the_shared_seeds_check_takes_int_seeds_only():
    ref = ml_collections.ConfigDict({"seeds": (0, 1)})
    validate(ml_collections.ConfigDict({"seeds": (3,)}), ref, {"seeds": SEEDS})
    for bad in [(), (0, 1.5), (True,)]:
        with pytest.raises(ValueError, match="config.seeds=.*non-empty tuple of int seeds"):
            validate(ml_collections.ConfigDict({"seeds": bad}), ref, {"seeds": SEEDS})


def test_mean_over_reads_nested_keys_of_each_row():
    rows = [{"acc": {"a": 0.2, "b": 1.0}, "n": 1}, {"acc": {"a": 0.6, "b": 0.0}, "n": 3}]
    assert outputs.mean_over(rows, "n") == 2.0
    assert outputs.mean_over(rows, "acc", "a") == pytest.approx(0.4)
    assert outputs.means_over(rows, ("a", "b"), "acc") == pytest.approx({"a": 0.4, "b": 0.5})
    with pytest.raises(ValueError, match="at least one row"):
        outputs.mean_over([], "n")
    with pytest.raises(KeyError):
        outputs.mean_over(rows, "acc", "c")


def test_paired_se_is_the_standard_error_of_the_paired_differences():
    a, b = [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]     # differences 1, 0, 0, 1
    assert outputs.paired_se(a, b) == pytest.approx(np.std([1, 0, 0, 1], ddof=1) / 2)
    # pairing matters: the same values, each pair moving together, have no spread
    assert outputs.paired_se([0.1, 0.5, 0.9], [0.0, 0.4, 0.8]) == pytest.approx(0.0)
    assert outputs.paired_se([1.0], [0.0]) == math.inf      # one pair: no claim can hold
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        outputs.paired_se([1.0, 0.0, 1.0], [0.0, 1.0])


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
    t = outputs.markdown_table([{"a": 1.23456, "b": None}, {"a": float("nan"), "b": "s|t"}])
    assert t.splitlines() == ["| a | b |", "|---|---|", "| 1.23 |  |", "| nan | s\\|t |"]
    assert outputs.markdown_table([{"a": 0.98765}], floatfmt=".4f").splitlines()[2] == "| 0.9877 |"
    assert outputs.markdown_table([{"d": {"x": 0.98958, "n": 3}}]).splitlines()[2] == (
        "| x=0.99, n=3 |")
    assert outputs.markdown_table([]) == "(no rows)\n"


@pytest.mark.parametrize("value, text", [
    (0.9895833333333334, "0.99"), (1.23456, "1.23"), (-0.0123456, "-0.0123"),
    (0.000123456, "0.000123"), (123.456, "123"), (12345.678, "12346"), (2.5e7, "2.5e+07"),
    (np.float32(0.5), "0.5"), (7, "7"), (np.int64(123456), "123456"), (True, "True"),
    (float("inf"), "inf"), (0.0, "0"),
])
def test_format_number_keeps_three_significant_digits(value, text):
    assert outputs.format_number(value) == text


def test_format_value_prints_dicts_and_lists_compactly():
    assert outputs.format_value({"prkv": 0.9895833333333334, "snapkv": 0.7708333333333334}) == (
        "prkv=0.99, snapkv=0.771")
    assert outputs.format_value({"fit": {"a": 1.23456, "b": -0.5}, "n": [8, 16],
                                 "gp": None}) == "fit=(a=1.23, b=-0.5), n=[8, 16], gp=none"
    assert outputs.format_value(np.array([0.333333, 0.666666])) == "[0.333, 0.667]"
    assert outputs.format_value("3/4") == "3/4"


def test_atomic_write_json_that_fails_part_way_keeps_the_old_file(tmp_path):
    path = tmp_path / "results.json"
    atomic.write_json(str(path), {"a": 1})
    # the first key is written into the temporary file before the second fails to serialise
    with pytest.raises(TypeError, match="not JSON serializable"):
        atomic.write_json(str(path), {"big": list(range(10_000)), "bad": object()})
    with pytest.raises(ValueError, match="Out of range float"):
        atomic.write_json(str(path), {"big": list(range(10_000)), "nan": float("nan")})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(os.listdir(tmp_path)) == ["results.json"]  # no temporary file left
    atomic.write_text(str(tmp_path / "sub" / "r.md"), "x\n")  # makes the directory
    atomic.write_bytes(str(path), b"{}")
    assert (tmp_path / "sub" / "r.md").read_text() == "x\n" and path.read_bytes() == b"{}"
    with pytest.raises(ValueError, match="mode='a'"):
        with atomic.open_atomic(str(path), "a"):
            pass


def test_lab_train_does_not_import_the_report_module():
    import subprocess
    import sys

    code = "import sys, lab.train; print('lab.outputs' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root), check=True)
    assert out.stdout.strip() == "False"


def test_regime_is_written_tabled_and_decides_informativeness(tmp_path):
    ok = outputs.regime("full-cache exact match in [0.3, 0.95]", np.float64(0.81234), True)
    bad = outputs.regime("one pass below 0.9", 0.9895833333333334, np.bool_(False))
    assert bad == {"check": "one pass below 0.9", "measured": 0.9895833333333334, "holds": False}
    c = outputs.claim("It works.", "accuracy", {"a": 0.98765, "b": 0.5}, True)
    res = outputs.write_outputs(str(tmp_path), name="exp", config={}, report="body",
                                results={"claims": [c], "regime": [ok, bad]})
    assert res["regime"] == [ok, bad]
    assert outputs.regime_holds(res) is False and outputs.regime_holds({"regime": [ok]}) is True
    assert outputs.regime_holds({"claims": [c]}) is None  # none stated: unchecked
    report = (tmp_path / "report.md").read_text()
    assert "| yes | It works. | accuracy | a=0.988, b=0.5 |" in report
    assert "## Regime" in report and "| no | one pass below 0.9 | 0.99 |" in report
    assert "| yes | full-cache exact match in [0.3, 0.95] | 0.812 |" in report
    assert "so its claims are not informative" in report
    # a check with a part speaks for that part's claims only
    c_b = outputs.claim("B works.", "m", 0.1, False, part="B")
    bad_b = outputs.regime("B's truth not flat", 1, False, part="B")
    assert c_b["part"] == "B" and "part" not in c and bad_b["part"] == "B"
    res_b = {"claims": [c, c_b], "regime": [ok, bad_b]}
    assert outputs.claim_informative(res_b, c) is True
    assert outputs.claim_informative(res_b, c_b) is False
    assert outputs.claim_informative({"claims": [c]}, c) is None
    assert outputs.claim_informative(res, c_b) is False      # a check without a part fails
    assert "the part 'B' fails" in outputs.regime_verdict(res_b)
    assert outputs.regime_verdict({"regime": [ok]}).startswith("Every regime check holds")
    with pytest.raises(ValueError, match=r"results\['regime'\] of 'exp'.*expected a list"):
        outputs.write_outputs(str(tmp_path), name="exp", config={}, report="",
                              results={"claims": [c], "regime": [{"check": "x"}]})
