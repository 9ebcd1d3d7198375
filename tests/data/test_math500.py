"""MATH500-format jsonl loader on a fixture the test writes; answer normalisation."""

import json

import pytest

from lab.data import answers_match, last_boxed, load_math500_jsonl, normalize_answer

RECORDS = [
    {"problem": "What is $1+1$?", "solution": "We have $1+1=\\boxed{2}$.", "answer": "2",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.",
     "answer": "\\frac{1}{2}", "subject": "Algebra", "level": "Level 3"},
    {"problem": "Angle?", "solution": "... $\\boxed{90^\\circ}$", "answer": "90^\\circ",
     "subject": "Geometry", "level": 5},
]


def write(path, records, extra_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


def test_loads_fixture(tmp_path):
    path = tmp_path / "math500.jsonl"
    write(path, RECORDS, extra_lines=[""])  # a trailing blank line is skipped
    ds = load_math500_jsonl(str(path))
    assert len(ds) == 3
    assert ds["level"] == [1, 3, 5] and ds["difficulty"] == [1, 3, 5]
    assert ds["subject"] == ["Prealgebra", "Algebra", "Geometry"]
    assert ds["unique_id"][0] == "test/prealgebra/1.json" and ds["unique_id"][1] == "line-2"
    assert set(ds["task"]) == {"math500"}
    for sol, ans in zip(ds["solution"], ds["answer"], strict=True):  # solutions agree
        assert answers_match(sol, ans)


@pytest.mark.parametrize("bad,message", [
    ({k: v for k, v in RECORDS[0].items() if k != "answer"}, "line 2: missing field 'answer'"),
    ({**RECORDS[0], "level": "hard"}, "line 2: field 'level'='hard'"),
    ({**RECORDS[0], "problem": 3}, "line 2: field 'problem'=3"),
])
def test_malformed_line_names_line_and_field(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    write(path, [RECORDS[0], bad])
    with pytest.raises(ValueError, match=message):
        load_math500_jsonl(str(path))


def test_invalid_json_and_missing_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    write(path, RECORDS[:1], extra_lines=['{"problem": "x",'])
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_math500_jsonl(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        load_math500_jsonl(str(tmp_path / "nope.jsonl"))


def test_normalize_answer():
    assert normalize_answer("$\\boxed{ \\dfrac{1}{2} }$.") == "\\frac{1}{2}"
    assert normalize_answer("\\left( 3, \\! 4 \\right)") == "(3,4)"
    assert normalize_answer("10\\text{ cm}") == "10cm"
    assert normalize_answer("90^\\circ") == "90"
    assert last_boxed("a \\boxed{x} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("no box") is None
    assert not answers_match("\\boxed{3}", "4")
