"""Shortcut reward models that never look at the image, scored like the trained ones
(pair accuracy against the hidden preference on held-out pairs). A sound meme task keeps
each near chance (0.5): the preference depends on how a caption fits the image.

- ``length``: prefers the shorter or the longer caption, the direction that agrees with
  more training labels;
- ``most_frequent``: each caption text's pooled win rate over all training labels (the
  caption that wins most often anywhere wins);
- ``caption_only``: the Bradley-Terry head with the image features zeroed
  (:class:`lab.methods.humor.reward_model.RewardHead` ``blind=True``).
"""

from __future__ import annotations

import collections

import numpy as np

from lab.methods.humor.data import caption_length
from lab.methods.humor.reward_model import (
    held_out_pair_accuracy,
    pair_accuracy,
    train_reward_model,
)

SHORTCUTS = ("length", "most_frequent", "caption_only")


def _clean_pairs(groups: dict):
    s = groups["scores"]
    for g in range(len(s)):
        for a in range(s.shape[1]):
            for b in range(s.shape[1]):
                if s[g, a] > s[g, b] + 1e-9:
                    yield g, a, b


def caption_win_rates(groups: dict) -> dict[str, float]:
    """Pooled win rate of each caption text over the (noisy) labels of ``groups``."""
    wins, total = collections.Counter(), collections.Counter()
    for g, w, lo in groups["pairs"]:
        cw, cl = groups["captions"][g][w], groups["captions"][g][lo]
        wins[cw] += 1
        total[cw] += 1
        total[cl] += 1
    return {c: wins[c] / total[c] for c in total}


def shortcut_accuracy(name: str, train: dict, test: dict, *, steps: int = 400,
                      seed: int = 0) -> float:
    """Held-out pair accuracy of shortcut ``name`` fitted on ``train``'s labels."""
    if name not in SHORTCUTS:
        raise ValueError(f"shortcut={name!r}; expected one of {SHORTCUTS}")
    if name == "caption_only":
        feats = np.zeros((len(train["scores"]), 8), np.float32)
        rm = train_reward_model(train, feats, "pairwise", steps=steps, blind=True, seed=seed)
        return held_out_pair_accuracy(rm, test, np.zeros((len(test["scores"]), 8), np.float32))
    if name == "length":
        agree = [np.sign(caption_length(train["captions"][g][lo])
                         - caption_length(train["captions"][g][w]))
                 for g, w, lo in train["pairs"]]
        sign = 1.0 if np.sum(agree) >= 0 else -1.0        # +1: shorter wins

        def score(c):
            return -sign * caption_length(c)
    else:
        rates = caption_win_rates(train)

        def score(c):
            return rates.get(c, 0.5)
    w, lo = [], []
    for g, a, b in _clean_pairs(test):
        w.append(score(test["captions"][g][a]))
        lo.append(score(test["captions"][g][b]))
    return pair_accuracy(w, lo)
