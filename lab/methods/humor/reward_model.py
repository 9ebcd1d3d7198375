"""HUMOR's reward models: NNX heads on the VLM's image features and the caption's features,
trained pairwise within template groups (Bradley-Terry) or pointwise (regression on the
same noisy labels turned into per-caption win rates), for comparison.

Bradley-Terry (Bradley and Terry 1952; the pairwise RM of HUMOR and of InstructGPT,
Ouyang et al. 2022): ``P(a > b) = sigmoid(r(a) - r(b))``, loss ``-mean log sigmoid(r_w -
r_l)`` over the labelled pairs, each pair inside one group (one image and its candidate
captions). Pointwise: mean squared error between ``r(caption)`` and the caption's win rate
in its group (:func:`lab.methods.humor.data.win_rates`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

KINDS = ("pairwise", "pointwise")


class RewardHead(nnx.Module):
    """``r(image_features, caption_features) -> [N]``: a 2-hidden-layer GELU MLP on the
    concatenation (``blind=True`` zeroes the image features: the caption-only baseline)."""

    def __init__(self, image_dim: int, caption_dim: int, hidden: int = 64, *,
                 blind: bool = False, rngs: nnx.Rngs):
        self.blind = blind
        self.l1 = nnx.Linear(image_dim + caption_dim, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 1, rngs=rngs)

    def __call__(self, image, caption):
        if self.blind:
            image = jnp.zeros_like(image)
        x = jnp.concatenate([image, caption], -1)
        x = jax.nn.gelu(self.l1(x))
        x = jax.nn.gelu(self.l2(x))
        return self.out(x)[..., 0]


def bt_loss(r_winner, r_loser) -> jax.Array:
    """Bradley-Terry negative log-likelihood ``-mean log sigmoid(r_w - r_l)``."""
    return -jnp.mean(jax.nn.log_sigmoid(jnp.asarray(r_winner) - jnp.asarray(r_loser)))


def pair_accuracy(r_winner, r_loser) -> float:
    """Fraction of pairs the scores order as labelled (a tie counts one half)."""
    d = np.asarray(r_winner, np.float64) - np.asarray(r_loser, np.float64)
    if d.size == 0:
        raise ValueError("no pairs; expected at least one (winner, loser) pair")
    return float(np.mean((d > 0) + 0.5 * (d == 0)))


def _features(groups: dict, image_features: np.ndarray):
    from lab.methods.humor.data import caption_words

    n, k = groups["scores"].shape
    if image_features.shape[0] != n:
        raise ValueError(f"image_features has {image_features.shape[0]} rows for {n} groups")
    caps = caption_words([c for cs in groups["captions"] for c in cs]).reshape(n, k, -1)
    img = np.repeat(image_features[:, None, :], k, 1)
    return img.astype(np.float32), caps


def train_reward_model(groups: dict, image_features: np.ndarray, kind: str, *,
                       steps: int = 400, learning_rate: float = 3e-3, hidden: int = 64,
                       blind: bool = False, seed: int = 0, val: tuple | None = None,
                       eval_every: int = 25) -> RewardHead:
    """Trains a :class:`RewardHead` on ``groups`` (:func:`meme_groups`; its noisy
    ``pairs``) with the groups' ``image_features [n, d]``: ``kind="pairwise"`` (BT over the
    in-group pairs) or ``"pointwise"`` (MSE to the win rates); full-batch Adam.

    ``val=(val_groups, val_features)``: early stopping, the same rule for both kinds: every
    ``eval_every`` steps the head's accuracy on the validation groups' *noisy* labels
    (:func:`labelled_pair_accuracy`; the hidden preference is never used) is measured and
    the best head is returned."""
    from lab.methods.humor.data import win_rates

    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {KINDS}")
    if len(groups["pairs"]) == 0:
        raise ValueError("groups has no labelled pairs; expected at least one")
    img, caps = _features(groups, np.asarray(image_features, np.float32))
    model = RewardHead(img.shape[-1], caps.shape[-1], hidden, blind=blind,
                       rngs=nnx.Rngs(seed))
    pairs = jnp.asarray(groups["pairs"])
    target = jnp.asarray(win_rates(groups), jnp.float32)
    img_j, caps_j = jnp.asarray(img), jnp.asarray(caps)
    opt = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)

    def loss_fn(m):
        r = m(img_j, caps_j)                                    # [n, k]
        if kind == "pairwise":
            return bt_loss(r[pairs[:, 0], pairs[:, 1]], r[pairs[:, 0], pairs[:, 2]])
        return jnp.mean((r - target) ** 2)

    @nnx.jit
    def step(m, o):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        o.update(m, grads)
        return loss

    best, best_state = -1.0, None
    for t in range(int(steps)):
        step(model, opt)
        if val is not None and ((t + 1) % eval_every == 0 or t + 1 == steps):
            acc = labelled_pair_accuracy(model, *val)
            if acc > best:
                best, best_state = acc, jax.tree.map(lambda x: x, nnx.state(model))
    if best_state is not None:
        nnx.update(model, best_state)
    return model


def labelled_pair_accuracy(model: RewardHead, groups: dict, image_features: np.ndarray
                           ) -> float:
    """Pair accuracy of ``model`` against ``groups``' own (possibly noisy) labels."""
    img, caps = _features(groups, np.asarray(image_features, np.float32))
    r = np.asarray(model(jnp.asarray(img), jnp.asarray(caps)))
    p = groups["pairs"]
    return pair_accuracy(r[p[:, 0], p[:, 1]], r[p[:, 0], p[:, 2]])


def score_captions(model: RewardHead, image_features: np.ndarray, captions) -> np.ndarray:
    """``[N]`` rewards of ``captions[j]`` on ``image_features[j]``."""
    from lab.methods.humor.data import caption_words

    return np.asarray(model(jnp.asarray(image_features, jnp.float32),
                            jnp.asarray(caption_words(captions))))


def held_out_pair_accuracy(model: RewardHead, groups: dict, image_features: np.ndarray
                           ) -> float:
    """Pair accuracy of ``model`` against the hidden preference on every pair of distinct
    hidden scores in ``groups`` (the labels' noise is ignored: the clean order)."""
    img, caps = _features(groups, np.asarray(image_features, np.float32))
    r = np.asarray(model(jnp.asarray(img), jnp.asarray(caps)))
    s = groups["scores"]
    w, lo = [], []
    for g in range(len(s)):
        for a in range(s.shape[1]):
            for b in range(s.shape[1]):
                if s[g, a] > s[g, b] + 1e-9:
                    w.append(r[g, a])
                    lo.append(r[g, b])
    return pair_accuracy(w, lo)
