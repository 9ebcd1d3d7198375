"""HUMOR's meme data, hidden preference and shortcuts; the BT loss and pair accuracy on hand
cases; the reward heads; the generation grammar, CoT tracing, path diversity and the
reward-model reward's bad-input errors."""

import math

import numpy as np
import pytest

from lab.methods import humor as H
from lab.train import rewards
from lab.train.rl import group_ids


def test_hidden_score_on_hand_cases():
    # red (scene 0) square (intent 0): scene + intent even -> the incongruity tone is dry
    assert H.hidden_score(0, 0, "fire box dry") == pytest.approx(H.MAX_SCORE)
    assert H.hidden_score(0, 0, "fire box loud") == pytest.approx(1.7)
    assert H.hidden_score(0, 0, "leaf box dry lol") == pytest.approx(1.1)
    assert H.hidden_score(0, 1, "fire ball loud") == pytest.approx(H.MAX_SCORE)  # odd: loud
    assert H.hidden_score(2, 3, "sun slice dry lol lol") == 0.0
    assert H.best_caption(1, 2) == "leaf slice loud"   # 1 + 2 odd
    with pytest.raises(ValueError, match="caption='fire box'"):
        H.hidden_score(0, 0, "fire box")


def test_caption_grammar():
    assert H.parse_caption("wave oops loud lol") == {"subject": 2, "twist": 3, "tone": 1,
                                                     "filler": 1}
    for bad in ("fire box", "fire box dry lol lol lol", "box fire dry", "fire box dry haha",
                "", None):
        assert H.parse_caption(bad) is None


def test_groups_labels_are_in_group_and_flipped_at_the_noise_rate():
    clean = H.meme_groups(40, seed=3, n_captions=6)
    assert clean["clean"].all() and clean["images"].shape == (40, 16, 16, 3)
    g, w, lo = clean["pairs"].T
    assert (clean["scores"][g, w] > clean["scores"][g, lo]).all()   # winner scores higher
    assert all(len(set(cs)) == 6 for cs in clean["captions"])
    noisy = H.meme_groups(400, seed=3, n_captions=6, noise=0.3)
    assert abs((~noisy["clean"]).mean() - 0.3) < 0.03
    # every template appears equally often (templates cycled)
    _, counts = np.unique(clean["template"][:32], return_counts=True)
    assert (counts == 2).all()


def test_bad_data_arguments_name_the_field():
    with pytest.raises(ValueError, match="noise=0.5"):
        H.meme_groups(4, noise=0.5)
    with pytest.raises(ValueError, match="n_captions=1"):
        H.meme_groups(4, n_captions=1)


def test_win_rates_and_noisy_best():
    g = {"scores": np.zeros((1, 3)), "captions": [["fire box dry", "leaf box dry",
                                                   "sun ball loud"]],
         "pairs": np.array([[0, 0, 1], [0, 0, 2], [0, 2, 1]])}
    np.testing.assert_allclose(H.win_rates(g), [[1.0, 0.0, 0.5]])
    assert H.noisy_best(g) == ["fire box dry"]


def test_bt_loss_and_pair_accuracy_on_hand_cases():
    assert float(H.bt_loss([0.0], [0.0])) == pytest.approx(math.log(2))
    assert float(H.bt_loss([2.0, 0.0], [0.0, 1.0])) == pytest.approx(
        (math.log1p(math.exp(-2)) + math.log1p(math.exp(1))) / 2, rel=1e-5)
    assert H.pair_accuracy([1, 2, 0], [0, 3, 0]) == pytest.approx(0.5)  # right, wrong, tie
    with pytest.raises(ValueError, match="no pairs"):
        H.pair_accuracy([], [])


def _oracle(g):
    f = np.zeros((len(g["scene"]), 8), np.float32)
    f[np.arange(len(f)), g["scene"]] = 1
    f[np.arange(len(f)), 4 + g["intent"]] = 1
    return f


def test_reward_heads_learn_the_hidden_preference_from_true_attributes():
    tr, te = H.meme_groups(160, seed=0), H.meme_groups(64, seed=1)
    for kind in H.KINDS:
        rm = H.train_reward_model(tr, _oracle(tr), kind, steps=250, seed=0)
        assert H.held_out_pair_accuracy(rm, te, _oracle(te)) > 0.85, kind
    with pytest.raises(ValueError, match="kind='listwise'"):
        H.train_reward_model(tr, _oracle(tr), "listwise")


def test_image_blind_shortcuts_stay_near_chance():
    tr, te = H.meme_groups(200, seed=0), H.meme_groups(80, seed=1)
    for s in H.SHORTCUTS:
        assert abs(H.shortcut_accuracy(s, tr, te, steps=150) - 0.5) < 0.06, s


def test_cot_is_traced_back_from_the_best_caption_and_parses():
    rng = np.random.default_rng(0)
    text = H.trace_cot("fire ball loud lol", ["leaf box dry", "fire ball dry", "sun oops loud"],
                       "multi", 3, rng)
    p = H.parse_cot(text)
    assert p["intent"] == "loud" and p["caption"] == "fire ball loud lol"
    assert len(p["paths"]) == 3 and len(set(p["paths"])) == 3
    assert p["paths"][p["anchor"] - 1] == ("fire", "ball")
    single = H.parse_cot(H.trace_cot("fire ball loud", [], "single", 3, rng))
    assert single["paths"] == [("fire", "ball")] and single["anchor"] == 1


def test_malformed_hierarchies_do_not_parse():
    good = "intent dry\npath fire box\nanchor 1\ncaption fire box dry"
    assert H.parse_cot(good)["caption"] == "fire box dry"
    for bad in ("intent dry\npath fire box\nanchor 2\ncaption fire box dry",     # anchor
                "intent meh\npath fire box\nanchor 1\ncaption fire box dry",     # tone
                "intent dry\npath fire\nanchor 1\ncaption fire box dry",         # path
                "intent dry\npath fire box\nanchor 1\ncaption fire box",          # caption
                "caption fire box dry", ""):
        assert H.parse_cot(bad) is None, bad


def test_path_diversity_on_hand_cases():
    a = H.format_cot("dry", [("fire", "box"), ("leaf", "ball")], 1, "fire box dry")
    b = H.format_cot("dry", [("fire", "box")], 1, "fire box dry")
    d = H.path_diversity({"t1": [a, a], "t2": [b, b], "t3": [b, "garbage"]})
    # t1: paths [fb, lb, fb, lb]: 8 of 12 ordered pairs differ; t2: all equal; t3: one path
    assert d["per_template"] == pytest.approx({"t1": 8 / 12, "t2": 0.0, "t3": 0.0})
    assert d["distinct"] == pytest.approx((2 + 1 + 1) / 3)
    assert d["malformed"] == pytest.approx(1 / 6)
    # anchored paths: t1 [fb, fb], t2 [fb, fb], t3 [fb]: no diversity across samples
    assert d["anchored_fraction"] == 0.0
    c = H.format_cot("dry", [("fire", "box"), ("leaf", "ball")], 2, "leaf ball dry")
    assert H.path_diversity({"t": [a, c]})["anchored_fraction"] == 1.0


def test_rm_reward_scores_captions_and_bad_outputs_are_named():
    tr = H.meme_groups(32, seed=0)
    rm = H.train_reward_model(tr, _oracle(tr), "pairwise", steps=20)
    name = H.register_rm_reward(rm, mean=0.0, std=1.0, clip=2.0, name="humor_rm_test")
    good = H.format_cot("dry", [("fire", "box")], 1, "fire box dry")
    feats = [_oracle(tr)[0].tolist()] * 2
    s = rewards.score([name], ["p", "p"], [good, "not a hierarchy"], {"features": feats})
    assert s.no_answer.tolist() == [False, True] and s.total[1] == -2.0
    assert abs(s.total[0]) <= 2.0
    nan = [[float("nan")] * 8] * 2
    with pytest.raises(ValueError, match="'humor_rm_test' returned nan at index 0"):
        rewards.score([name], ["p", "p"], [good, good], {"features": nan})
    with pytest.raises(ValueError, match="std=0"):
        H.register_rm_reward(rm, mean=0.0, std=0, clip=2.0)


def test_a_template_group_of_one_is_refused():
    rows = [{"prompt": "a", "template": "red-square"}, {"prompt": "b", "template": "red-cross"}]
    with pytest.raises(ValueError, match="group_by='template'.*at least 2"):
        group_ids(rows, 1, "template", "group")
    pairs = [r for r in rows for _ in range(2)]
    assert group_ids(pairs, 2, "template", "group").tolist() == [1, 1, 0, 0]
