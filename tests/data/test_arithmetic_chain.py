"""The arithmetic chain parser: generated chains parse and check, and malformed steps, missing
answers, wrong, missing or extra steps are wrong steps, never a crash."""

import hashlib

import pytest

from lab.data.synthetic.arithmetic import (
    ChainStep,
    arithmetic,
    check_chain,
    parse_answer,
    parse_chain,
    parse_prompt,
    parse_step,
)

PROBLEM = ([23, 7, 15], "+-")   # "23+7-15=?", reference chain "23+7=30;30-15=15\nA: 15"


def test_every_generated_chain_parses_and_checks():
    ds = arithmetic(300, seed=3, steps=(1, 5), digits=(1, 3), ops="+-*")
    for row in ds:
        steps, answer = parse_chain(row["completion"])
        assert answer == int(row["answer"])
        assert len(steps) == row["steps"] and all(s.arithmetic_ok for s in steps)
        assert parse_prompt(row["prompt"]) == (row["operands"], row["ops"])
        check = check_chain(row["completion"], row["operands"], row["ops"])
        assert check.chain_correct and check.first_error is None
        assert check.steps_gold == (True,) * row["steps"]


def test_the_generator_output_is_unchanged():
    """The zoo's cached models were trained on these rows (their keys assume them)."""
    ds = arithmetic(64, seed=0)
    text = "".join(p + c for p, c in zip(ds["prompt"], ds["completion"], strict=True))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "5f4805c61a80c2df"


def test_negative_partials_parse():
    steps, answer = parse_chain("31-48=-17;-17-90=-107\nA: -107")
    assert [(s.left, s.op, s.right, s.result) for s in steps] == [(31, "-", 48, -17),
                                                                 (-17, "-", 90, -107)]
    assert answer == -107 and all(s.arithmetic_ok for s in steps)


@pytest.mark.parametrize("text", ["23+7=3a", "23+7=", "23+=30", "23 + 7 = 30 extra", "", "x",
                                  "23+7=30=1", "23/7=3", "23+-7=16"])
def test_a_malformed_step_is_a_step_that_is_not_well_formed(text):
    step = parse_step(text)
    assert step == ChainStep(text) and not step.well_formed and not step.arithmetic_ok


def test_a_malformed_step_in_a_chain_is_a_wrong_step():
    check = check_chain("23+7=3a;30-15=15\nA: 15", *PROBLEM)
    # the malformed first step is wrong; the second's left operand follows no written result
    assert check.steps_valid == (False, False) and check.steps_gold == (False, False)
    assert check.first_error == 0 and check.answer == 15 and check.answer_correct
    assert not check.chain_correct  # the right answer from a broken chain is not a right chain


def test_a_missing_or_malformed_answer_is_none():
    for text in ("23+7=30;30-15=15", "23+7=30;30-15=15\n", "23+7=30;30-15=15\nA: 1 5",
                 "23+7=30;30-15=15\nA:", "23+7=30;30-15=15\nB: 15"):
        steps, answer = parse_chain(text)
        assert answer is None and len(steps) == 2
        check = check_chain(text, *PROBLEM)
        assert check.steps_valid == (True, True) and check.first_error is None
        assert not check.answer_correct and not check.chain_correct
    assert parse_answer("1+2=3\nA: 3\nA: 4") == 4  # the last answer line counts
    assert parse_answer("A: -12") == -12 and parse_answer("") is None


def test_an_arithmetic_slip_is_wrong_and_the_steps_after_it_are_checked_on_their_own():
    check = check_chain("23+7=31;31-15=16\nA: 16", *PROBLEM)
    assert check.steps_valid == (False, True)      # step 2 follows from the written 31
    assert check.steps_gold == (False, False)      # but it is not the reference step
    assert check.first_error == 0 and not check.answer_correct


def test_a_wrong_operand_a_short_and_a_long_chain():
    # copies the wrong operand from the prompt: arithmetic right, step wrong
    check = check_chain("23+8=31;31-15=16\nA: 16", *PROBLEM)
    assert parse_step("23+8=31").arithmetic_ok and check.steps_valid == (False, True)
    short = check_chain("23+7=30\nA: 30", *PROBLEM)
    assert short.steps_valid == (True,) and short.first_error == 1 and not short.chain_correct
    long = check_chain("23+7=30;30-15=15;15+1=16\nA: 15", *PROBLEM)
    assert long.steps_valid == (True, True, False) and long.first_error == 2
    assert long.answer_correct and not long.chain_correct
    empty = check_chain("\nA: 15", *PROBLEM)
    assert empty.steps_valid == () and empty.first_error == 0 and not empty.chain_correct
    only_answer = parse_chain("A: 15")
    assert only_answer == ([], 15)


def test_bad_problems_and_inputs_are_value_errors():
    with pytest.raises(ValueError, match="text=None"):
        parse_chain(None)
    with pytest.raises(ValueError, match="prompt='hello'"):
        parse_prompt("hello")
    with pytest.raises(ValueError, match=r"operands=\[1, 2\], ops='\+-'"):
        check_chain("1+2=3\nA: 3", [1, 2], "+-")
    with pytest.raises(ValueError, match="ops='/'"):
        check_chain("1/2=0\nA: 0", [1, 2], "/")
