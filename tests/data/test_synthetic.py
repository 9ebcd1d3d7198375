"""Synthetic generators: determinism, ground truth recomputed independently, difficulty
monotone in its knobs, and the obvious shortcut heuristics at chance.

Shortcut bounds: on N=400 samples a heuristic at chance p has a standard error
sqrt(p(1-p)/400) <= 0.025; every bound below is chance + 0.08 (> 3 standard errors).
"""

import collections
import re

import numpy as np
import pytest

from lab.data import (
    arithmetic,
    associative_recall,
    copy,
    extract_answer,
    icl_classification,
    kv_retrieval,
    needle,
    render_kv_prompt,
    variable_tracking,
)

N = 400
MARGIN = 0.08


def rate(flags):
    return float(np.mean(flags))


def most_frequent_number(text):
    nums = re.findall(r"\d+", text)
    return collections.Counter(nums).most_common(1)[0][0]


@pytest.mark.parametrize("gen,kw", [
    (arithmetic, {}), (variable_tracking, {"context_len": 200}), (needle, {"context_len": 200}),
    (kv_retrieval, {}), (icl_classification, {}), (copy, {}), (associative_recall, {}),
])
def test_deterministic_in_seed_and_has_common_columns(gen, kw):
    a, b, c = gen(20, 3, **kw), gen(20, 3, **kw), gen(20, 4, **kw)
    assert a.to_list() == b.to_list()
    assert a["prompt"] != c["prompt"]
    for col in ("prompt", "completion", "answer", "difficulty", "task"):
        assert col in a.column_names
    for row in a:
        assert extract_answer(row["completion"]) == row["answer"]
        assert row["prompt"].endswith("\n")


# ----------------------------------------------------------------------------- arithmetic

def _eval_left_to_right(expr):
    head = re.match(r"-?\d+", expr)  # a partial result may be negative
    acc = int(head.group())
    tokens = re.findall(r"\d+|[+\-*]", expr[head.end():])
    for op, x in zip(tokens[0::2], tokens[1::2], strict=True):
        acc = {"+": acc + int(x), "-": acc - int(x), "*": acc * int(x)}[op]
    return acc


def test_arithmetic_ground_truth_and_chain():
    ds = arithmetic(N, seed=0, steps=(1, 5), digits=(1, 3), ops="+-*")
    for r in ds:
        expr = r["prompt"].removesuffix("=?\n")
        assert int(r["answer"]) == _eval_left_to_right(expr)
        chain = r["completion"].split("\n")[0].split(";")
        assert len(chain) == r["steps"]
        for step in chain:  # every written step is itself correct
            lhs, rhs = step.split("=")
            assert _eval_left_to_right(lhs) == int(rhs), step
        assert r["difficulty"] == r["steps"] * r["digits"]


def test_arithmetic_difficulty_monotone():
    by_steps = [np.mean([len(c) for c in arithmetic(100, 1, steps=s, digits=2)["completion"]])
                for s in (1, 2, 3, 4)]
    by_digits = [np.mean([len(c) for c in arithmetic(100, 1, steps=2, digits=d)["completion"]])
                 for d in (1, 2, 3)]
    assert np.all(np.diff(by_steps) > 0) and np.all(np.diff(by_digits) > 0)


def test_arithmetic_shortcuts_near_zero():
    ds = arithmetic(N, seed=0)
    first, last, biggest, summed, frequent = [], [], [], [], []
    for r in ds:
        ops, ans = r["operands"], r["answer"]
        first.append(str(ops[0]) == ans)
        last.append(str(ops[-1]) == ans)
        biggest.append(str(max(ops)) == ans)
        summed.append(str(sum(ops)) == ans)  # ignore the operators
        frequent.append(most_frequent_number(r["prompt"]) == ans)
    for name, flags in [("first", first), ("last", last), ("max", biggest),
                        ("sum", summed), ("most frequent", frequent)]:
        # "sum" is right whenever every op is "+": 1/2^steps of chains, 0.23 on average here
        bound = 0.30 if name == "sum" else MARGIN
        assert rate(flags) <= bound, (name, rate(flags))


# ---------------------------------------------------------------------- variable tracking

def _resolve(prompt):
    context, question = prompt.rstrip("\n").rsplit("\n", 1)
    table = dict(re.findall(r"\b([a-z]{3})=(\w+)\.", context))
    var = question.removesuffix("=?")
    hops = 0
    while not table[var].isdigit():
        var, hops = table[var], hops + 1
    return table[var], hops + 1


def test_variable_tracking_ground_truth_and_length():
    ds = variable_tracking(200, seed=0, hops=(1, 5), context_len=(300, 600), n_chains=3)
    for r in ds:
        answer, hops = _resolve(r["prompt"])
        assert answer == r["answer"] and hops == r["hops"] == r["difficulty"]
        assert len(r["candidates"]) == 3 and r["candidates"][r["answer_rank"]] == r["answer"]
        for off in r["evidence_offsets"]:
            assert r["prompt"][off:off + 3] in r["completion"]
    long = variable_tracking(8, seed=1, hops=4, context_len=2048)
    lengths = [len(p) for p in long["prompt"]]
    assert all(2048 - 30 <= n <= 2048 for n in lengths), lengths


def test_variable_tracking_difficulty_monotone():
    lens = [np.mean([len(c) for c in variable_tracking(50, 2, hops=h, context_len=256)
                     ["completion"]]) for h in (1, 2, 3, 4)]
    assert np.all(np.diff(lens) > 0)


def test_variable_tracking_shortcuts_at_chance():
    n_chains = 4
    ds = variable_tracking(N, seed=0, hops=(1, 4), context_len=256, n_chains=n_chains)
    first = [r["candidates"][0] == r["answer"] for r in ds]
    last = [r["candidates"][-1] == r["answer"] for r in ds]  # nearest to the question
    frequent = [most_frequent_number(r["prompt"]) == r["answer"] for r in ds]
    for name, flags in [("first", first), ("last/nearest", last), ("most frequent", frequent)]:
        assert rate(flags) <= 1 / n_chains + MARGIN, (name, rate(flags))


# --------------------------------------------------------------------------------- needle

def test_needle_ground_truth_and_depth():
    ds = needle(200, seed=0, context_len=(256, 1024), n_needles=4)
    for r in ds:
        table = dict(re.findall(r"The number of (\w{4}) is (\d+)\.", r["prompt"]))
        assert len(table) == 4 and table[r["key"]] == r["answer"]
        assert r["prompt"].count(r["answer"]) == 1
        assert r["prompt"][r["needle_offset"]:].startswith(f"The number of {r['key']} ")
        assert 0 <= r["depth"] < 1
    depths = np.array(ds["depth"])
    assert depths.min() < 0.15 and depths.max() > 0.75  # needles spread over the context
    for r in ds:  # the chain of thought restates exactly the asked needle
        assert r["completion"] == f"{r['key']} is {r['answer']}\nA: {r['answer']}"
    plain = needle(20, seed=0, context_len=256, cot=False)
    assert plain["prompt"] == needle(20, seed=0, context_len=256)["prompt"]
    assert all(c == f"A: {a}" for c, a in zip(plain["completion"], plain["answer"], strict=True))
    diffs = [needle(20, 1, context_len=c)["difficulty"][0] for c in (256, 512, 1024, 2048)]
    assert diffs == sorted(diffs) and len(set(diffs)) == 4


def test_needle_shortcuts_at_chance():
    k = 4
    ds = needle(N, seed=0, context_len=256, n_needles=k)
    first = [r["candidates"][0] == r["answer"] for r in ds]
    last = [r["candidates"][-1] == r["answer"] for r in ds]
    frequent = [most_frequent_number(r["prompt"]) == r["answer"] for r in ds]
    for name, flags in [("first", first), ("last/nearest", last), ("most frequent", frequent)]:
        assert rate(flags) <= 1 / k + MARGIN, (name, rate(flags))


# --------------------------------------------------------------------------- kv retrieval

def test_kv_retrieval_answer_only_in_gold_document():
    ds = kv_retrieval(200, seed=0, n_docs=(4, 16), pairs_per_doc=3)
    for r in ds:
        docs = r["documents"]
        holders = [i for i, d in enumerate(docs) if f"={r['answer']}" in d]
        assert holders == [r["gold_doc"]]
        assert f"{r['key']}={r['answer']}" in docs[r["gold_doc"]]
        assert r["prompt"] == render_kv_prompt(docs, r["question"])
        assert sum(d.count(f"{r['key']}=") for d in docs) == 1
        assert r["completion"] == f"{r['key']}={r['answer']}\nA: {r['answer']}"
    plain = kv_retrieval(20, seed=0, cot=False)
    assert plain["prompt"] == kv_retrieval(20, seed=0)["prompt"]
    assert all(c == f"A: {a}" for c, a in zip(plain["completion"], plain["answer"], strict=True))
    pinned = kv_retrieval(30, seed=1, n_docs=16, gold_position=5)
    assert set(pinned["gold_doc"]) == {5}
    with pytest.raises(ValueError, match="gold_position"):
        kv_retrieval(2, seed=1, n_docs=4, gold_position=4)
    assert [kv_retrieval(5, 0, n_docs=d)["difficulty"][0] for d in (8, 16, 32, 64)] == [3, 4, 5, 6]


def test_kv_retrieval_gold_bias_ramps_the_gold_position():
    # slot i of 8 with probability (8 - i) / 36 ("early") or (i + 1) / 36 ("late"): means 2.33, 4.67
    def mean_gold(bias):
        return np.mean(kv_retrieval(600, seed=2, n_docs=8, pairs_per_doc=1,
                                    gold_bias=bias)["gold_doc"])

    assert abs(mean_gold("early") - 7 / 3) < 0.25 and abs(mean_gold("late") - 14 / 3) < 0.25
    # "ends": weights 4.5, 3.5, ..., 1.5, 1.5, ..., 4.5: the outer four slots hold 2/3, symmetric
    ends = np.array(kv_retrieval(600, seed=2, n_docs=8, pairs_per_doc=1,
                                 gold_bias="ends")["gold_doc"])
    assert abs(np.mean((ends < 2) | (ends > 5)) - 2 / 3) < 0.06 and abs(ends.mean() - 3.5) < 0.25
    with pytest.raises(ValueError, match="gold_bias='first'"):
        kv_retrieval(2, seed=1, n_docs=4, gold_bias="first")
    with pytest.raises(ValueError, match="gold_position=1 pins the gold document"):
        kv_retrieval(2, seed=1, n_docs=4, gold_position=1, gold_bias="late")


def test_kv_retrieval_shortcuts_at_chance():
    n_docs = 8
    ds = kv_retrieval(N, seed=0, n_docs=n_docs)
    first_doc = [r["gold_doc"] == 0 for r in ds]
    nearest_doc = [r["gold_doc"] == n_docs - 1 for r in ds]
    frequent = [most_frequent_number(r["prompt"].split("\n", 1)[1]) == r["answer"] for r in ds]
    positions = np.bincount(ds["gold_doc"], minlength=n_docs) / N
    assert positions.max() <= 1 / n_docs + MARGIN  # no favoured slot at all
    for name, flags in [("first doc", first_doc), ("nearest doc", nearest_doc),
                        ("most frequent", frequent)]:
        assert rate(flags) <= 1 / n_docs + MARGIN, (name, rate(flags))


# ------------------------------------------------------------------------------------ ICL

def _rule_answer(r):
    attr = 0 if r["rule"] == "colour" else 1
    q = r["query"].split()[attr]
    labels = {lab for item, lab in r["shots"] if item.split()[attr] == q}
    return labels


def test_icl_rule_identifiable_and_answer_follows_it():
    ds = icl_classification(200, seed=0, n_shots=(6, 12), n_classes=3)
    for r in ds:
        attr = 0 if r["rule"] == "colour" else 1
        assert _rule_answer(r) == {r["answer"]}  # the deciding value's shots agree
        by_other = collections.defaultdict(set)
        for item, lab in r["shots"]:
            by_other[item.split()[1 - attr]].add(lab)
        assert any(len(v) > 1 for v in by_other.values())  # the other attribute is refuted
        assert r["query"] not in [item for item, _ in r["shots"]]
        assert r["answer"] in r["choices"] and len(r["choices"]) == 3
    assert 0.4 < np.mean([r == "colour" for r in ds["rule"]]) < 0.6


@pytest.mark.parametrize("n_classes", [2, 3])
def test_icl_shortcuts_at_chance(n_classes):
    ds = icl_classification(N, seed=0, n_classes=n_classes)
    first, last, major, vote = [], [], [], []
    for r in ds:
        labs = [lab for _, lab in r["shots"]]
        first.append(labs[0] == r["answer"])
        last.append(labs[-1] == r["answer"])
        major.append(collections.Counter(labs).most_common(1)[0][0] == r["answer"])
        words = set(r["query"].split())
        share = [lab for item, lab in r["shots"] if words & set(item.split())]
        vote.append(collections.Counter(share).most_common(1)[0][0] == r["answer"])
    chance = 1 / n_classes
    for name, flags in [("first", first), ("last", last), ("majority", major)]:
        assert rate(flags) <= chance + MARGIN, (name, rate(flags))
    # similarity vote: a built-in tie between the answer and one rival, so 1/2 at best
    assert rate(vote) <= 0.5 + MARGIN, rate(vote)


# ----------------------------------------------------------------------------------- copy

def test_copy_completion_is_the_string_and_characters_are_uniform():
    ds = copy(N, seed=0, length=(4, 40))
    for r in ds:
        assert r["prompt"] == f"Copy: {r['answer']}\n" and r["completion"] == f"A: {r['answer']}"
        assert len(r["answer"]) == r["length"] == r["difficulty"] and 4 <= r["length"] <= 40
    chars = collections.Counter("".join(ds["answer"]))
    assert len(chars) == 36
    expected = sum(chars.values()) / 36  # ~230 per character: a 6-sigma band is ~ +-90
    assert max(abs(c - expected) for c in chars.values()) < 6 * expected ** 0.5
    with pytest.raises(ValueError, match="length"):
        copy(2, length=(5, 2))


# ------------------------------------------------------------------------ associative recall

def test_associative_recall_answers_are_the_queried_values():
    ds = associative_recall(200, seed=0, n_pairs=(8, 32), n_queries=(2, 6))
    for r in ds:
        pairs_line, recall_line = r["prompt"].rstrip("\n").split("\n")
        table = dict(p.split("=") for p in pairs_line.split(", "))
        assert len(table) == r["n_pairs"] == r["difficulty"]  # keys are distinct
        assert len(set(table.values())) == len(table)          # and so are values
        assert recall_line.split()[1:] == r["keys"] and len(set(r["keys"])) == len(r["keys"])
        assert [table[k] for k in r["keys"]] == r["values"]
        chain = ";".join(f"{k}={v}" for k, v in zip(r["keys"], r["values"], strict=True))
        assert r["completion"] == f"{chain}\nA: {' '.join(r['values'])}"
    with pytest.raises(ValueError, match="n_queries"):
        associative_recall(2, n_pairs=4, n_queries=5)


def test_associative_recall_queried_slot_is_uniform():
    """No favoured position: the first query's slot among the pairs is uniform."""
    ds = associative_recall(N, seed=1, n_pairs=8, n_queries=1)
    slots = [r["prompt"].split("\n")[0].split(", ").index(f"{r['keys'][0]}={r['values'][0]}")
             for r in ds]
    assert np.bincount(slots, minlength=8).max() / N <= 1 / 8 + MARGIN


def test_generators_reject_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        arithmetic(4, steps=(3, 1))
    with pytest.raises(ValueError, match="ops"):
        arithmetic(4, ops="/")
    with pytest.raises(ValueError, match="context_len=40 is too small"):
        variable_tracking(2, hops=6, context_len=40)
    with pytest.raises(ValueError, match="n_classes"):
        icl_classification(2, n_classes=1)
    with pytest.raises(ValueError, match="n=0"):
        needle(0)
