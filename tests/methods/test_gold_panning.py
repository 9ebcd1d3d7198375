"""GOLD PANNING on simulated models with a known diagnosticity profile, and its input checks."""

from __future__ import annotations

import numpy as np
import pytest

from lab.methods import gold_panning as gp


def lost_in_the_middle(n: int, fpr: float = 0.02) -> gp.Profile:
    """Strong primacy, weaker recency, a weak middle (TPR 0.25 .. 0.85)."""
    x = np.linspace(0.0, 1.0, n)
    return gp.make_profile(0.25 + 0.6 * (1 - x) ** 4 + 0.3 * x ** 4, np.full(n, fpr))


def test_identifies_target_with_stated_probability_in_log_rounds():
    """Stopping at belief 0.9 names the target with probability >= 0.9 (minus 3 standard
    errors), and the mean number of rounds grows like log N, not like N."""
    ns, b, thr = [8, 16, 32, 64], 300, 0.9
    rounds = []
    for n in ns:
        prof = lost_in_the_middle(n)
        gold = np.random.default_rng(n).integers(0, n, b)
        r = gp.search(gp.simulated_query(prof, gold, seed=n), n, b, prof, threshold=thr,
                      budget=100)
        acc = float(np.mean(r.prediction == gold))
        assert acc >= thr - 3 * np.sqrt(thr * (1 - thr) / b), (n, acc)
        assert r.queries.max() < 100, n  # every search stopped by the threshold
        rounds.append(r.queries.mean())
    rounds = np.array(rounds)
    print("mean rounds", dict(zip(ns, rounds.round(2), strict=True)))
    # O(log N): under 1.5 log2(N) rounds at every N (about 3.6 at N=64 here), and from
    # N=8 to N=64 (log ratio 2, linear ratio 8) the rounds less than double.
    assert (rounds < 1.5 * np.log2(ns)).all(), rounds
    assert rounds[-1] / rounds[0] < 2.0, rounds
    assert rounds[-1] > rounds[0], rounds  # a larger haystack costs rounds


def test_stopping_belief_is_calibrated_for_a_strong_model():
    """A model that follows the gold 80-90% of the time and a wrong document 8%: stopping at
    belief 0.95 names the target at least 0.95 of the time (minus 3 standard errors over
    2,000 searches). Reading each slot as an independent signal made one answer ~8x too
    convincing here: 1.1 queries, 0.926 correct."""
    n, b, thr = 16, 2000, 0.95
    x = np.linspace(0.0, 1.0, n)
    prof = gp.make_profile(0.8 + 0.1 * np.abs(2 * x - 1), np.full(n, 0.08 / (n - 1)))
    gold = np.random.default_rng(n).integers(0, n, b)
    r = gp.search(gp.simulated_query(prof, gold, seed=n), n, b, prof, threshold=thr, budget=100)
    acc = float(np.mean(r.prediction == gold))
    assert acc >= thr - 3 * np.sqrt(thr * (1 - thr) / b), (acc, r.queries.mean())


def test_reaches_psc_accuracy_with_fewer_queries():
    n, b = 16, 300
    prof = lost_in_the_middle(n)
    gold = np.random.default_rng(1).integers(0, n, b)
    psc = gp.psc(gp.simulated_query(prof, gold, seed=2), n, b, 8, seed=3)
    psc_acc = float(np.mean(psc[:, -1] == gold))
    r = gp.search(gp.simulated_query(prof, gold, seed=4), n, b, prof, threshold=0.95, budget=8)
    acc = float(np.mean(r.prediction == gold))
    print("psc@8", psc_acc, "gp", acc, "queries", r.queries.mean())
    assert acc >= psc_acc - 0.02 and r.queries.mean() < 0.6 * 8, (acc, psc_acc, r.queries.mean())
    single = gp.single_pass(gp.simulated_query(prof, gold, seed=5), n, b)
    assert np.mean(single == gold) < acc - 0.3  # position bias hurts one pass


def test_update_is_exact_bayes_for_a_one_answer_model():
    """The posterior from one answer equals Bayes' rule with P(answer | doc i gold) counted
    from 200,000 answers of :func:`simulated_query` (the one-answer model) per hypothesis,
    to 0.01, for every answer (a followed slot or none). The rates leave every hypothesis a
    chance of no answer above the floor :func:`update` puts on it."""
    n, draws = 5, 200_000
    rng = np.random.default_rng(0)
    tpr, fpr = rng.uniform(0.3, 0.85, n), rng.uniform(0.01, 0.02, n)
    prof = gp.make_profile(tpr, fpr)
    prior = rng.dirichlet(np.ones(n))
    order = rng.permutation(n)
    orders = np.tile(order, (draws, 1))
    lik = np.zeros((n, n + 1))  # [gold doc, answer + 1]
    for i in range(n):
        answers = gp.simulated_query(prof, np.full(draws, i), seed=i)(np.arange(draws), orders)
        lik[i] = np.bincount(answers + 1, minlength=n + 1) / draws
    for obs in range(-1, n):
        want = prior * lik[:, obs + 1] / np.sum(prior * lik[:, obs + 1])
        got = np.exp(gp.update(np.log(prior)[None], order[None], np.array([obs]), tpr, fpr))[0]
        np.testing.assert_allclose(got, want, atol=0.01)


def test_anchoring_puts_high_belief_at_diagnostic_positions():
    belief = np.log(np.array([[0.05, 0.6, 0.05, 0.2, 0.1]]))
    diag = np.array([0.1, 0.5, 0.9, 0.3, 0.2])
    order = gp.assign(belief, diag, np.random.default_rng(0), "anchor")[0]
    # positions by diagnosticity: 2, 1, 3, 4, 0; documents by belief: 1, 3, 4, then 0/2
    assert order[2] == 1 and order[1] == 3 and order[3] == 4
    assert sorted(order.tolist()) == list(range(5))


def _brute_force_information_gain(belief, order, prof):
    """I(G; Y) from the likelihood table P(Y = y | G = i) read off :func:`gp.update` (the
    posterior after each answer y from a uniform prior is proportional to that column)."""
    n = len(belief)
    pos = np.argsort(order)
    t, s, none = gp._likelihood_parts(pos[None], prof.tpr, prof.fpr)
    lik = np.array([[t[0, i] if pos[i] == q else s[0, i] * prof.fpr[q] for q in range(n)]
                    + [none[0, i]] for i in range(n)])
    for y in range(-1, n):  # the table is update()'s likelihood, column by column
        post = np.exp(gp.update(np.zeros((1, n)), order[None], np.array([y]), prof.tpr,
                                prof.fpr))[0]
        np.testing.assert_allclose(post, lik[:, y] / lik[:, y].sum(), rtol=1e-9)

    def h(p):
        return -float(np.sum(p * np.log(p)))

    return h(belief @ lik) - sum(belief[i] * h(lik[i]) for i in range(n))


def test_expected_information_gain_matches_the_likelihood_table():
    rng = np.random.default_rng(0)
    n = 6
    prof = gp.make_profile(rng.uniform(0.3, 0.9, n), rng.uniform(0.01, 0.1, n))
    belief = rng.dirichlet(np.ones(n), size=4)
    orders = np.array([rng.permutation(n) for _ in range(4)])
    got = gp.expected_information_gain(belief, np.argsort(orders, 1), prof.tpr, prof.fpr)
    want = [_brute_force_information_gain(b, o, prof) for b, o in zip(belief, orders,
                                                                      strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # a uniform belief over documents and a flat profile: the order changes nothing
    flat = gp.make_profile(np.full(n, 0.6), np.full(n, 0.05))
    ig = gp.expected_information_gain(np.full((4, n), 1 / n), np.argsort(orders, 1),
                                      flat.tpr, flat.fpr)
    np.testing.assert_allclose(ig, ig[0], rtol=1e-12)


def test_info_gain_orders_reach_the_best_order_of_a_small_problem():
    """N = 4 (24 orders): hill climbing over swaps from the anchoring order reaches the
    information-gain maximum found by enumeration, and never falls below its start."""
    import itertools

    rng = np.random.default_rng(1)
    n = 4
    prof = gp.make_profile([0.9, 0.2, 0.5, 0.7], [0.05, 0.02, 0.03, 0.04])
    belief = rng.dirichlet(np.full(n, 0.5), size=8)
    start = gp.assign(np.log(belief), gp.diagnosticity(prof), rng, "anchor")
    got = gp.info_gain_orders(np.log(belief), start, prof.tpr, prof.fpr, rng, swaps=64)
    ig = gp.expected_information_gain(belief, np.argsort(got, 1), prof.tpr, prof.fpr)
    ig0 = gp.expected_information_gain(belief, np.argsort(start, 1), prof.tpr, prof.fpr)
    perms = np.array(list(itertools.permutations(range(n))))
    best = [max(gp.expected_information_gain(np.tile(b, (len(perms), 1)), np.argsort(perms, 1),
                                             prof.tpr, prof.fpr)) for b in belief]
    assert (ig >= ig0 - 1e-12).all()
    np.testing.assert_allclose(ig, best, rtol=1e-9)
    assert (np.sort(got, 1) == np.arange(n)).all()  # still permutations


def test_info_gain_search_finds_the_target():
    """The information-gain ordering is a working search on the lost-in-the-middle model:
    stopping at belief 0.9 names the target >= 0.9 of the time (minus 3 standard errors)."""
    n, b, thr = 16, 300, 0.9
    prof = lost_in_the_middle(n)
    gold = np.random.default_rng(5).integers(0, n, b)
    r = gp.search(gp.simulated_query(prof, gold, seed=6), n, b, prof, threshold=thr,
                  budget=60, rule="info_gain")
    assert np.mean(r.prediction == gold) >= thr - 3 * np.sqrt(thr * (1 - thr) / b)
    assert r.queries.max() < 60


def test_answer_f1_is_squad_f1_over_characters():
    # "481" vs "481": 1; "418" vs "481": same characters, 1; "482" vs "481": 2/3; None: 0
    assert gp.answer_f1(["481", "418", "482", None], ["481"] * 4) == pytest.approx(
        (1 + 1 + 2 / 3 + 0) / 4)
    assert gp.answer_f1(["12"], ["123"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    with pytest.raises(ValueError, match="predicted has 1 answers and gold 2"):
        gp.answer_f1(["1"], ["1", "2"])


def test_measure_profile_recovers_simulated_rates():
    n, k = 6, 600
    prof = gp.make_profile(np.linspace(0.9, 0.4, n), np.linspace(0.02, 0.08, n))
    gold_pos = np.repeat(np.arange(n), k)
    gold_doc = gold_pos.copy()  # identity order: document i sits at position i
    query = gp.simulated_query(prof, gold_doc, seed=0)
    obs = query(np.arange(n * k), np.tile(np.arange(n), (n * k, 1)))
    got = gp.measure_profile(gold_pos, obs, n)
    np.testing.assert_allclose(got.tpr, prof.tpr, atol=4 * np.sqrt(0.25 / k))
    np.testing.assert_allclose(got.fpr, prof.fpr, atol=4 * np.sqrt(0.1 / (k * (n - 1))))


def test_psc_majority_vote_and_f1():
    n, b = 4, 3
    gold = np.array([0, 1, 2])
    always = gp.make_profile(np.full(n, 1.0), np.zeros(n))
    out = gp.psc(gp.simulated_query(always, gold), n, b, 3)
    assert (out == gold[:, None]).all()
    assert gp.f1(np.array([0, -1, 2]), gold) == pytest.approx(2 * 1.0 * (2 / 3) / (1 + 2 / 3))
    assert gp.f1(np.array([-1, -1, -1]), gold) == 0.0


def test_resize_keeps_relative_shape_and_false_follow_mass():
    prof = gp.make_profile([0.9, 0.5, 0.7], [0.03, 0.06, 0.03])
    big = gp.resize_profile(prof, 9)
    assert big.tpr[0] == pytest.approx(0.9) and big.tpr[4] == pytest.approx(0.5)
    assert big.tpr[-1] == pytest.approx(0.7)
    assert big.fpr[4] == pytest.approx(0.06 * 3 / 9)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_docs=1), "n_docs=1"),
    (dict(n_docs="8"), "n_docs='8'"),
    (dict(threshold=1.5), "threshold=1.5"),
    (dict(threshold=0.0), "threshold=0.0"),
    (dict(budget=0), "budget=0"),
    (dict(rule="greedy"), "rule='greedy'"),
    (dict(n_problems=0), "n_problems=0"),
    (dict(rule="info_gain", swaps=-1), "swaps=-1"),
])
def test_search_bad_input_names_the_field(kwargs, match):
    prof = gp.clip_profile(lost_in_the_middle(8), 0.01)
    args = dict(n_docs=8, n_problems=4, threshold=0.9, budget=4, rule="anchor")
    args.update(kwargs)
    query = gp.simulated_query(prof, np.zeros(4, int))
    with pytest.raises(ValueError, match=match):
        gp.search(query, args.pop("n_docs"), args.pop("n_problems"), prof, **args)


def test_profile_bad_input_names_the_field():
    with pytest.raises(ValueError, match=r"profile.tpr\[1\]=1.2"):
        gp.make_profile([0.5, 1.2], [0.1, 0.1])
    with pytest.raises(ValueError, match=r"profile.fpr\[0\]=-0.1"):
        gp.make_profile([0.5, 0.2], [-0.1, 0.1])
    with pytest.raises(ValueError, match="same N"):
        gp.make_profile([0.5, 0.2, 0.3], [0.1, 0.1])
    with pytest.raises(ValueError, match="profile has 8 positions; expected n_docs=4"):
        gp.search(lambda r, o: np.zeros(len(r), int), 4, 2, lost_in_the_middle(8))
    with pytest.raises(ValueError, match="strictly inside"):
        gp.search(lambda r, o: np.zeros(len(r), int), 2, 2, gp.make_profile([1.0, 0.5],
                                                                          [0.0, 0.1]))
    with pytest.raises(ValueError, match="floor=0.7"):
        gp.clip_profile(lost_in_the_middle(4), 0.7)
    with pytest.raises(ValueError, match=r"positions \[2\]"):
        gp.measure_profile([0, 1, 0], [0, -1, 1], 3)
    with pytest.raises(ValueError, match="query returned"):
        gp.search(lambda r, o: np.full(len(r), 9), 4, 2, gp.clip_profile(lost_in_the_middle(4),
                                                                         0.01))
