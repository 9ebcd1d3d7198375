"""lab.data.synthetic.near_miss: near-miss distractors are exactly one character off the asked
key, every other key at least two, and values name one document each."""

import pytest

from lab.data.synthetic.kv_retrieval import render_kv_prompt
from lab.data.synthetic.near_miss import kv_near_miss


def _dist(a, b):
    return sum(x != y for x, y in zip(a, b, strict=True))


def test_near_misses_are_one_character_off_and_others_are_not():
    ds = kv_near_miss(50, seed=3, n_docs=(8, 12), n_near=(2, 4), keep_prefix=1)
    for row in ds:
        keys = [d.split("=")[0] for d in row["documents"]]
        values = [d.split("=")[1].rstrip(".") for d in row["documents"]]
        key, g = row["key"], row["gold_doc"]
        assert keys[g] == key and values[g] == row["answer"] and row["question"] == f"{key}=?"
        assert values == row["candidates"] and len(set(values)) == len(values)
        assert len(set(keys)) == len(keys) and 8 <= row["n_docs"] <= 12
        near = [d for d in range(row["n_docs"]) if _dist(keys[d], key) == 1]
        assert near == row["near_docs"] and 2 <= row["n_near"] == len(near) <= 4
        assert g not in near
        assert all(keys[d][0] == key[0] for d in near)          # keep_prefix=1
        assert all(_dist(keys[d], key) >= 2 for d in range(row["n_docs"])
                   if d != g and d not in near)
        assert row["prompt"] == render_kv_prompt(row["documents"], row["question"])
        assert row["completion"] == f"{key}={row['answer']}\nA: {row['answer']}"


def test_gold_position_pins_the_gold_and_seed_fixes_the_data():
    ds = kv_near_miss(20, seed=1, n_docs=6, n_near=5, gold_position=4)
    assert set(ds["gold_doc"]) == {4} and set(ds["n_near"]) == {5}
    assert kv_near_miss(5, seed=7)["prompt"] == kv_near_miss(5, seed=7)["prompt"]
    assert kv_near_miss(5, seed=7)["prompt"] != kv_near_miss(5, seed=8)["prompt"]
    # n_near above n_docs - 1 is capped: every other document is a near miss
    assert set(kv_near_miss(3, n_docs=4, n_near=9)["n_near"]) == {3}


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_docs=1), "n_docs=1"),
    (dict(n_near=-1), "n_near=-1"),
    (dict(keep_prefix=4), "keep_prefix=4"),
    (dict(n_docs=4, gold_position=4), "gold_position=4"),
])
def test_bad_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kv_near_miss(2, **kwargs)


def test_shortcuts_stay_near_chance():
    # Without reading the whole key: the first / last document, a uniformly favoured slot,
    # or the first document whose key starts like the asked one (the near misses share the
    # first letter) all stay near chance; only the exact key finds the gold document.
    n, n_docs, n_near, margin = 400, 8, 3, 0.06
    ds = kv_near_miss(n, seed=0, n_docs=n_docs, n_near=n_near, keep_prefix=1)
    rate = lambda flags: sum(flags) / n  # noqa: E731
    positions = [sum(r["gold_doc"] == p for r in ds) / n for p in range(n_docs)]
    assert max(positions) <= 1 / n_docs + margin
    first = [r["gold_doc"] == 0 for r in ds]
    last = [r["gold_doc"] == n_docs - 1 for r in ds]
    assert rate(first) <= 1 / n_docs + margin and rate(last) <= 1 / n_docs + margin
    prefix = [next(d for d, doc in enumerate(r["documents"]) if doc[0] == r["key"][0])
              == r["gold_doc"] for r in ds]
    assert rate(prefix) <= 1 / (n_near + 1) + margin, rate(prefix)
    exact = [[doc.split("=")[0] for doc in r["documents"]].index(r["key"]) == r["gold_doc"]
             for r in ds]
    assert rate(exact) == 1.0
