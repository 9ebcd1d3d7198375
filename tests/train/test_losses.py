"""sft_loss, policy_gradient_loss and group_advantages against numpy hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lab.train import (
    dense_label_loss,
    group_advantages,
    policy_gradient_loss,
    sft_loss,
    token_logprobs,
)


class TableModel:
    """A 'model' whose logits at each position are a fixed row of a table, chosen by the token."""

    def __init__(self, table):
        self.table = jnp.asarray(table)

    def __call__(self, inputs, mask=None, positions=None):
        return self.table[inputs]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_sft_loss_matches_hand_computation_with_weights_and_mask():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(5, 5)).astype(np.float32)
    inputs = np.array([[0, 1, 2, 3], [4, 3, 2, 1]])
    targets = np.array([[1, 2, 3, 4], [0, 0, 1, 1]])
    mask = np.array([[1, 1, 0, 1], [0, 1, 1, 1]], np.float32)
    weights = np.array([[2.0, 1.0, 5.0, 0.5], [3.0, 1.0, 1.0, 4.0]], np.float32)
    model = TableModel(table)
    loss, m = sft_loss(model, {"inputs": inputs, "targets": targets, "mask": mask,
                               "weights": weights})
    logp = _log_softmax(table[inputs])
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    want = (mask * weights * nll).sum() / mask.sum()
    assert abs(float(loss) - want) < 1e-5
    acc = ((table[inputs].argmax(-1) == targets) * mask).sum() / mask.sum()
    assert abs(float(m["accuracy"]) - acc) < 1e-6 and float(m["tokens"]) == 6.0
    # Without weights: the plain masked token mean, equal to -mean(token_logprobs).
    loss1, _ = sft_loss(model, {"inputs": inputs, "targets": targets, "mask": mask})
    assert abs(float(loss1) - (mask * nll).sum() / mask.sum()) < 1e-5
    tl = np.asarray(token_logprobs(model, inputs, targets))
    np.testing.assert_allclose(tl, -nll, atol=1e-5)


def test_sft_loss_rejects_missing_keys_and_shapes():
    model = TableModel(np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="mask"):
        sft_loss(model, {"inputs": np.zeros((1, 2), int), "targets": np.zeros((1, 2), int)})
    with pytest.raises(ValueError, match="same"):
        sft_loss(model, {"inputs": np.zeros((1, 2), int), "targets": np.zeros((1, 3), int),
                         "mask": np.ones((1, 3))})


def _pg_reference(logp, old, ref, adv, mask, clip_eps, kl_coef, est, agg):
    ratio = np.exp(logp - old)
    a = adv[:, None] if adv.ndim == 1 else adv
    surr = np.minimum(ratio * a, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = ref - logp
    kl = -d if est == "k1" else np.exp(d) - d - 1
    per = -(surr - kl_coef * kl)
    if agg == "token":
        return (per * mask).sum() / mask.sum()
    return np.mean((per * mask).sum(1) / mask.sum(1))


@pytest.mark.parametrize("est", ["k1", "k3"])
@pytest.mark.parametrize("agg", ["sequence", "token"])
def test_policy_gradient_loss_matches_numpy_grpo(est, agg):
    rng = np.random.default_rng(1)
    b, t = 4, 6
    logp = rng.normal(-1.5, 0.5, (b, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)  # ratios in and out of the clip
    ref = (logp + rng.normal(0, 0.4, (b, t))).astype(np.float32)
    adv = rng.normal(size=(b,)).astype(np.float32)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[:, 0] = 1
    loss, m = policy_gradient_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.1,
                                   kl_estimator=est, aggregation=agg)
    want = _pg_reference(logp, old, ref, adv, mask, 0.2, 0.1, est, agg)
    assert abs(float(loss) - want) < 1e-5, (float(loss), want)
    ratio = np.exp(logp - old)
    frac = ((np.abs(ratio - 1) > 0.2) * mask).sum() / mask.sum()
    assert 0 < frac < 1 and abs(float(m["clip_frac"]) - frac) < 1e-6


def test_policy_gradient_loss_gradient_signs():
    logp = jnp.array([[-1.0, -1.0, -1.0]])
    mask = jnp.ones((1, 3))
    old = jnp.array([[-1.0, -1.0 - 0.5, -1.0]])  # token 1: ratio e^0.5 > 1.2, clipped for A > 0

    def grad(adv, kl_coef=0.0, ref=None, est="k3"):
        f = lambda lp: policy_gradient_loss(lp, old, ref, jnp.array([adv]), mask,  # noqa: E731
                                            clip_eps=0.2, kl_coef=kl_coef,
                                            kl_estimator=est)[0]
        return np.asarray(jax.grad(f)(logp))[0]

    g = grad(1.0)
    assert g[0] < 0 and g[2] < 0 and g[1] == 0.0  # raise the good tokens; the clipped one is flat
    g = grad(-1.0)
    assert g[0] > 0 and g[1] > 0  # lower the bad tokens (ratio > 1 + eps is not clipped for A<0)
    # KL only: logp above the reference is pulled down, below it pushed up (k1 and k3).
    ref = jnp.array([[-2.0, -1.0, 0.0]])
    for est in ("k1", "k3"):
        g = grad(0.0, kl_coef=1.0, ref=ref, est=est)
        assert g[0] > 0
        if est == "k3":
            assert g[2] < 0 and abs(g[1]) < 1e-7


def test_policy_gradient_loss_rejects_bad_estimator():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="kl_estimator='k2'"):
        policy_gradient_loss(x, x, x, jnp.zeros(1), x, clip_eps=0.2, kl_coef=0.1,
                             kl_estimator="k2")


def test_group_advantages_normalise_per_group():
    rng = np.random.default_rng(2)
    ids = np.array([3, 7, 3, 9, 7, 3, 9, 7, 5, 5, 5, 3])  # non-contiguous groups
    rewards = rng.normal(size=ids.shape).astype(np.float32) * 3 + 1
    rewards[ids == 5] = 0.7  # a constant group: no signal
    adv = np.asarray(jax.jit(group_advantages)(rewards, ids))
    for g in (3, 7, 9):
        a = adv[ids == g]
        assert abs(a.mean()) < 1e-6 and abs(a.std() - 1) < 1e-5
        r = rewards[ids == g]
        np.testing.assert_allclose(a, (r - r.mean()) / r.std(), atol=1e-5)
    assert np.all(adv[ids == 5] == 0.0)


@pytest.mark.parametrize("agg", ["sequence", "token"])
def test_loss_weight_makes_micro_batch_averages_exact(agg):
    """Weighting micro-batch losses by loss_weight reproduces the full-batch loss."""
    rng = np.random.default_rng(3)
    b, t = 6, 5
    logp = rng.normal(-1, 0.3, (b, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    mask = np.ones((b, t), np.float32)
    mask[:3, 2:] = 0  # unequal token counts per half
    kw = dict(clip_eps=0.2, kl_coef=0.05, kl_estimator="k3", aggregation=agg)
    full, _ = policy_gradient_loss(logp, old, ref, adv, mask, **kw)
    parts = [policy_gradient_loss(logp[s], old[s], ref[s], adv[s], mask[s], **kw)
             for s in (slice(0, 3), slice(3, 6))]
    w = np.array([float(m["loss_weight"]) for _, m in parts])
    combined = sum(wi * float(loss) for wi, (loss, _) in zip(w, parts, strict=True)) / w.sum()
    assert abs(combined - float(full)) < 1e-6


def _ce(row, target):
    row = np.asarray(row, np.float64)
    return np.log(np.exp(row - row.max()).sum()) + row.max() - row[target]


def test_dense_label_loss_averages_rare_classes_apart():
    """Labels 0 (empty), 3 and 5 on a vocabulary of 6 and -1 off target: pooled, the nine
    tokens of class 3 outweigh the one of class 5; per class, each counts once; restricted
    to ``classes`` the softmax ignores the other ids."""
    rng = np.random.default_rng(0)
    labels = np.array([[0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 5, -1, 0]])
    logits = rng.standard_normal((1, 14, 6)).astype(np.float32)
    logits[0, -2] = 1e4                              # off target: would dominate if read
    rows = logits[0]
    empty = [_ce(rows[i], 0) for i in (0, 1, 13)]
    c3 = [_ce(rows[i], 3) for i in range(2, 11)]
    c5 = [_ce(rows[11], 5)]
    loss, recall = dense_label_loss(jnp.asarray(logits), jnp.asarray(labels), empty_id=0)
    np.testing.assert_allclose(loss, np.mean(c3 + c5) + 0.2 * np.mean(empty), rtol=1e-5)
    hits = [rows[i].argmax() == labels[0, i] for i in range(2, 12)]
    np.testing.assert_allclose(recall, np.mean(hits), rtol=1e-6)

    sub = rows[:, [0, 3, 5]]                         # empty first, then the classes
    loss, recall = dense_label_loss(jnp.asarray(logits), jnp.asarray(labels), empty_id=0,
                                    classes=(3, 5), per_class=True, empty_weight=0.5)
    per3 = np.mean([_ce(sub[i], 1) for i in range(2, 11)])
    per5 = _ce(sub[11], 2)
    empty = np.mean([_ce(sub[i], 0) for i in (0, 1, 13)])
    np.testing.assert_allclose(loss, (per3 + per5) / 2 + 0.5 * empty, rtol=1e-5)
    r3 = np.mean([sub[i].argmax() == 1 for i in range(2, 11)])
    np.testing.assert_allclose(recall, (r3 + (sub[11].argmax() == 2)) / 2, rtol=1e-6)

    # A perfect score: recall 1, loss near 0; no labelled tokens: recall 0.
    perfect = np.full((1, 14, 6), -20.0, np.float32)
    perfect[0, np.arange(14), np.maximum(labels[0], 0)] = 20.0
    loss, recall = dense_label_loss(jnp.asarray(perfect), jnp.asarray(labels), empty_id=0,
                                    classes=(3, 5), per_class=True)
    assert float(recall) == 1.0 and float(loss) < 1e-6
    _, recall = dense_label_loss(jnp.asarray(perfect), jnp.full((1, 14), 0), empty_id=0)
    assert float(recall) == 0.0
    with pytest.raises(ValueError, match="per_class=True needs classes"):
        dense_label_loss(jnp.asarray(logits), jnp.asarray(labels), empty_id=0, per_class=True)
