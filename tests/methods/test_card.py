"""CARD's coherence executor on hand-written good and bad chains, the verbose solver, the
shortcut answers (near chance), the registered coherence reward and bad input."""

import numpy as np
import pytest

from lab.methods import card
from lab.train import rewards

OPS, PROB = [49, 18, 30], "+-"   # 49+18-30 = 37


def test_a_clean_chain_advances_every_step_and_scores_one():
    e = card.execute("49+18=67;67-30=37\nA: 37", OPS, PROB)
    assert e.labels == ("advance", "advance") and e.answer_correct and e.complete
    assert card.coherence_reward("49+18=67;67-30=37\nA: 37", OPS, PROB) == 1.0


@pytest.mark.parametrize("text,labels,reward", [
    ("49+18=66;49+18=67;67-30=37\nA: 37", ("wrong", "advance", "advance"), 2 / 3),
    ("49+18=67;67+0=67;67-30=37\nA: 37", ("advance", "misleading", "advance"), 2 / 3),
    ("49+18=67;67-30=37;37-1=36\nA: 37", ("advance", "advance", "misleading"), 2 / 3),
    ("49+18=67;oops;67-30=37\nA: 37", ("advance", "wrong", "advance"), 2 / 3),
    ("49+18=66;66-30=36\nA: 36", ("wrong", "misleading"), card.FLOOR),
    ("49+18=67;67-30=37\nA: 38", ("advance", "advance"), card.FLOOR),
    ("49+18=67;67-30=37", ("advance", "advance"), card.FLOOR),   # no answer line
    ("A: 37", (), 0.0),                                          # an answer alone
    ("67-30=37\nA: 37", ("misleading",), 0.0),                   # skips the first step
])
def test_bad_chains_are_penalised(text, labels, reward):
    assert card.execute(text, OPS, PROB).labels == labels
    assert card.coherence_reward(text, OPS, PROB) == pytest.approx(reward)


def test_registered_coherence_reward_reads_the_problem_column():
    s = rewards.score(["card_coherence"], ["p", "p"], ["49+18=67;67-30=37\nA: 37", "A: 1"],
                      {"problem": ["49+18-30=?\n"] * 2})
    assert s.per_fn["card_coherence"].tolist() == [1.0, card.FLOOR]


def test_incoherent_fraction_counts_steps():
    texts = ["49+18=67;67-30=37\nA: 37", "49+18=66;49+18=67;67-30=37\nA: 37"]
    assert card.incoherent_fraction(texts, ["49+18-30=?\n"] * 2) == pytest.approx(1 / 5)


def test_verbose_solver_is_noisy_and_mostly_correct():
    rows = card.problems(300, 0, steps=(2, 4), digits=2)
    rng = np.random.default_rng(0)
    texts = [card.verbose_solution(r["operands"], r["ops"], rng) for r in rows]
    ex = [card.execute(t, r["operands"], r["ops"]) for t, r in zip(texts, rows, strict=True)]
    correct = np.mean([e.answer_correct for e in ex])
    assert 0.5 < correct < 0.95
    assert card.incoherent_fraction(texts, [r["problem"] for r in rows]) > 0.15
    clean = [card.verbose_solution(r["operands"], r["ops"], rng, p_fail=0, p_detour=0,
                                   p_uncorrected=0) for r in rows]
    assert clean == [r["reference"] for r in rows]
    with pytest.raises(ValueError, match="p_fail"):
        card.verbose_solution(OPS, PROB, rng, p_fail=1.5)


def test_shortcut_answers_stay_near_chance():
    train = card.problems(500, 1, steps=(1, 4), digits=(1, 2))
    test = card.problems(500, 2, steps=(1, 4), digits=(1, 2))
    for name in card.SHORTCUTS:
        assert card.shortcut_accuracy(card.shortcut_answers(name, train), test) < 0.06, name
    with pytest.raises(ValueError, match="shortcut"):
        card.shortcut_answers("oracle", train)


def test_bad_input_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="operands"):
        card.execute("A: 1", [1, 2], "+-")
    with pytest.raises(ValueError, match="dataset is empty"):
        card.train_sft(None, None, [], steps=1, batch_size=1, learning_rate=1e-3, seq_len=8)
