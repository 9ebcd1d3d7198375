"""Losses shared by every method that trains: SFT with token weights, GRPO-style policy gradient.

* :func:`sft_loss` is the token-level cross-entropy of supervised fine-tuning,
  with a loss mask and optional per-token weights (GUI-Libra's action-token
  reweighting is a weight > 1 on the action tokens).
* :func:`policy_gradient_loss` is the clipped-ratio objective of PPO
  (Schulman et al., 2017) as used by GRPO (Shao et al., 2024, DeepSeekMath,
  eq. 3) with a KL penalty to a reference policy, estimated per token by
  ``k1 = logp - ref_logp`` or ``k3 = exp(ref - logp) - (ref - logp) - 1``
  (Schulman, "Approximating KL divergence", 2020).
* :func:`group_advantages` normalises rewards within each group of samples that
  share a prompt (GRPO's group-relative advantage).
* :func:`dense_label_loss` is a cross-entropy on dense per-token targets read at the LM
  head (a VLM's perception targets at its visual tokens), with the rare labelled tokens
  and the many empty ones averaged apart.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k3")
AGGREGATIONS = ("sequence", "token")


def token_logprobs(model, inputs: jax.Array, targets: jax.Array, *,
                   attention_mask: jax.Array | None = None,
                   positions: jax.Array | None = None) -> jax.Array:
    """Returns ``log p(targets[b, t] | inputs[b, :t+1])`` as float32 ``[B, T]``.

    ``model(inputs, mask=attention_mask, positions=positions)`` must return
    logits ``[B, T, V]`` (as :class:`lab.nn.Transformer` does).
    """
    logits = model(inputs, mask=attention_mask, positions=positions)
    return logprobs_from_logits(logits, targets)


def logprobs_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Returns ``log_softmax(logits)[..., targets]`` in float32 (shape of ``targets``)."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def sft_loss(model, batch: dict) -> tuple[jax.Array, dict]:
    """Token-level cross-entropy with a loss mask and optional per-token weights.

    Args:
      model: called as ``model(inputs, mask=batch.get("attention_mask"),
        positions=batch.get("positions"))`` -> logits ``[B, T, V]``.
      batch: ``"inputs" [B, T]`` int, ``"targets" [B, T]`` int (the next tokens),
        ``"mask" [B, T]`` (1 where the token counts), optional ``"weights" [B, T]``.

    Returns:
      ``(loss, {"loss", "accuracy", "tokens"})`` with
      ``loss = sum(mask * weights * nll) / sum(mask)``: the mean over the masked
      tokens of the weighted negative log-likelihood (weights of 1 give the plain
      token mean; a weight of 2 counts a token twice). ``accuracy`` is the
      fraction of masked tokens whose argmax is the target, ``tokens`` the
      number of masked tokens.
    """
    for key in ("inputs", "targets", "mask"):
        if key not in batch:
            raise ValueError(f"sft_loss: batch has no {key!r}; keys are {sorted(batch)}")
    inputs, targets = batch["inputs"], batch["targets"]
    if inputs.shape != targets.shape or batch["mask"].shape != targets.shape:
        raise ValueError(f"sft_loss: inputs {inputs.shape}, targets {targets.shape} and mask "
                         f"{batch['mask'].shape} must have the same [B, T] shape")
    logits = model(inputs, mask=batch.get("attention_mask"), positions=batch.get("positions"))
    logp = logprobs_from_logits(logits, targets)
    mask = batch["mask"].astype(jnp.float32)
    weights = mask if batch.get("weights") is None else mask * batch["weights"].astype(jnp.float32)
    tokens = jnp.sum(mask)
    denom = jnp.maximum(tokens, 1.0)
    loss = -jnp.sum(weights * logp) / denom
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return loss, {"loss": loss, "accuracy": jnp.sum(correct * mask) / denom, "tokens": tokens}


def dense_label_loss(logits: jax.Array, labels: jax.Array, *, empty_id: int,
                     classes=None, per_class: bool = False, empty_weight: float = 0.2
                     ) -> tuple[jax.Array, jax.Array]:
    """``(loss, recall)`` of dense targets ``labels [...]`` (a class's token id, ``empty_id``
    for a token with nothing to label, -1 where there is no target) scored by ``logits
    [..., V]`` at the same tokens.

    The softmax is over the whole vocabulary, or with ``classes`` (token ids) over
    ``empty_id`` and ``classes`` only, so that the targets do not compete with the rest of
    the vocabulary at a shared LM head. ``loss = on_class + empty_weight * on_empty``:
    ``on_empty`` is the mean cross-entropy of the empty tokens (most of an image) and
    ``on_class`` that of the labelled tokens, pooled, or with ``per_class`` (needs
    ``classes``) each class's mean averaged over the classes present, for classes a few
    tokens in a thousand. ``recall`` is the fraction of labelled tokens predicted right
    (per class and averaged alike). Without labelled tokens ``on_class`` and ``recall``
    are 0."""
    if per_class and classes is None:
        raise ValueError("per_class=True needs classes (the token ids to average over)")
    logits = logits.astype(jnp.float32)
    valid = labels >= 0
    if classes is None:
        sub, target = logits, jnp.where(valid, labels, empty_id)
        labelled = valid & (labels != empty_id)
        empty = valid & (labels == empty_id)
    else:
        classes = jnp.asarray(classes, jnp.int32)
        sub = jnp.concatenate([logits[..., empty_id, None], logits[..., classes]], -1)
        member = labels[..., None] == classes
        labelled = valid & member.any(-1)
        target = jnp.where(labelled, jnp.argmax(member, -1) + 1, 0)      # 0: empty
        empty = valid & ~labelled
    ce = -jnp.take_along_axis(jax.nn.log_softmax(sub), target[..., None], -1)[..., 0]
    right = jnp.argmax(sub, -1) == target
    on_empty = jnp.sum(jnp.where(empty, ce, 0.0)) / jnp.maximum(empty.sum(), 1)
    if per_class:
        onehot = (target[..., None] == jnp.arange(1, len(classes) + 1)) & labelled[..., None]
        axes = tuple(range(onehot.ndim - 1))
        count = onehot.sum(axes)
        present = jnp.maximum(jnp.sum(count > 0), 1)
        on_class = jnp.sum(jnp.sum(jnp.where(onehot, ce[..., None], 0.0), axes)
                           / jnp.maximum(count, 1)) / present
        recall = jnp.sum(jnp.sum(onehot & right[..., None], axes)
                         / jnp.maximum(count, 1)) / present
    else:
        n = jnp.maximum(labelled.sum(), 1)
        on_class = jnp.sum(jnp.where(labelled, ce, 0.0)) / n
        recall = jnp.sum(labelled & right) / n
    return on_class + empty_weight * on_empty, recall


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of ``KL(pi || pi_ref)`` from samples of ``pi``.

    ``k1 = logp - ref_logp`` (unbiased, can be negative);
    ``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1`` (unbiased, >= 0).
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = ref_logp - logp
        return jnp.exp(d) - d - 1.0
    raise ValueError(f"kl_estimator={estimator!r}; expected one of {KL_ESTIMATORS}")


def policy_gradient_loss(logp: jax.Array, old_logp: jax.Array | None,
                         ref_logp: jax.Array | None, advantages: jax.Array, mask: jax.Array, *,
                         clip_eps: float = 0.2, kl_coef: float | jax.Array = 0.0,
                         kl_estimator: str = "k3", aggregation: str = "sequence",
                         clip_eps_high: float | None = None) -> tuple[jax.Array, dict]:
    """GRPO's clipped policy-gradient objective with a KL penalty, as a loss to minimise.

    Per token ``t`` of sequence ``b``, with ``r = exp(logp - old_logp)``::

        J = min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A) - kl_coef * KL

    and ``loss = -mean(J)`` over the masked tokens: with ``aggregation="sequence"``
    (GRPO, Shao et al. 2024, eq. 3) the mean over each sequence's tokens, then over
    sequences; with ``"token"`` (DAPO's token-level mean) one mean over every
    masked token of the batch. ``clip_eps_high`` (default ``clip_eps``) is DAPO's
    clip-higher (Yu et al. 2025, ``J_DAPO``'s ``clip(r, 1 - eps_low, 1 + eps_high)``;
    the paper uses 0.2 and 0.28).

    Args:
      logp: ``[B, T]`` log-probs of the sampled tokens under the policy being trained.
      old_logp: ``[B, T]`` log-probs under the sampling policy (treated as constants);
        None means on-policy (``old_logp = stop_gradient(logp)``, ratio 1).
      ref_logp: ``[B, T]`` log-probs under the reference policy, or None (no KL term).
      advantages: ``[B]`` (one per sequence) or ``[B, T]``.
      mask: ``[B, T]``, 1 on the completion tokens that count.
      clip_eps: the ratio clip (below 1); clip_eps_high: above 1 (None = ``clip_eps``).
      kl_coef: the KL weight, a number or an array (traced values allowed) of shape
        ``[]`` or ``[B]`` (one weight per sequence); kl_estimator: ``"k1"`` or ``"k3"``.

    Returns:
      ``(loss, {"loss", "pg_loss", "kl", "clip_frac", "clip_low", "clip_high", "ratio",
      "tokens", "loss_weight"})``; the metrics are masked token means (``clip_frac``:
      ratio outside ``[1 - clip_eps, 1 + clip_eps_high]``; ``clip_low`` / ``clip_high``:
      trl's ``clip_ratio/low_mean`` / ``high_mean``, the tokens where the clip binds,
      ``r < 1 - clip_eps`` with ``A < 0`` / ``r > 1 + clip_eps_high`` with ``A > 0``),
      ``loss_weight`` is
      what the loss averages over (non-empty sequences, or tokens), which the
      Trainer uses to weight micro-batches under gradient accumulation.
    """
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={kl_estimator!r}; expected one of {KL_ESTIMATORS}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r}; expected one of {AGGREGATIONS}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    number = isinstance(kl_coef, (int, float))
    if clip_eps < 0 or high < 0 or (number and kl_coef < 0):
        raise ValueError(f"clip_eps={clip_eps}, clip_eps_high={clip_eps_high} and "
                         f"kl_coef={kl_coef} must be >= 0")
    if logp.ndim != 2 or mask.shape != logp.shape:
        raise ValueError(f"logp {logp.shape} and mask {mask.shape} must both be [B, T]")
    if ref_logp is None and (not number or kl_coef):
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp (got None)")
    beta = jnp.asarray(kl_coef, jnp.float32)
    if beta.ndim == 1:
        beta = beta[:, None]
    if beta.shape not in ((), (logp.shape[0], 1)):
        raise ValueError(f"kl_coef has shape {jnp.shape(kl_coef)}; expected [] or "
                         f"[{logp.shape[0]}]")
    adv = jnp.asarray(advantages, jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    if adv.shape not in ((logp.shape[0], 1), logp.shape):
        raise ValueError(f"advantages {jnp.shape(advantages)} must be [B] or [B, T] for logp "
                         f"{logp.shape}")
    logp = logp.astype(jnp.float32)
    old = jax.lax.stop_gradient(logp if old_logp is None else old_logp.astype(jnp.float32))
    mask = mask.astype(jnp.float32)
    ratio = jnp.exp(logp - old)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high)
    surrogate = jnp.minimum(ratio * adv, clipped * adv)
    kl = (jnp.zeros_like(logp) if ref_logp is None
          else kl_penalty(logp, jax.lax.stop_gradient(ref_logp.astype(jnp.float32)), kl_estimator))
    per_token = -(surrogate - beta * kl)

    tokens = jnp.sum(mask)

    def token_mean(x):
        return jnp.sum(x * mask) / jnp.maximum(tokens, 1.0)

    if aggregation == "sequence":
        lengths = jnp.sum(mask, axis=1)
        per_seq = jnp.sum(per_token * mask, axis=1) / jnp.maximum(lengths, 1.0)
        n_seq = jnp.sum(lengths > 0)
        loss = jnp.sum(per_seq) / jnp.maximum(n_seq, 1.0)
        weight = n_seq.astype(jnp.float32)
    else:
        loss = token_mean(per_token)
        weight = tokens
    is_clipped = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).astype(jnp.float32)
    low = ((ratio < 1.0 - clip_eps) & (adv < 0)).astype(jnp.float32)
    up = ((ratio > 1.0 + high) & (adv > 0)).astype(jnp.float32)
    return loss, {"loss": loss, "pg_loss": token_mean(-surrogate), "kl": token_mean(kl),
                  "clip_frac": token_mean(is_clipped), "clip_low": token_mean(low),
                  "clip_high": token_mean(up), "ratio": token_mean(ratio),
                  "tokens": tokens, "loss_weight": weight}


@dataclasses.dataclass(frozen=True)
class PolicyGradientLoss:
    """A Trainer ``loss_fn`` for :func:`policy_gradient_loss` on a rollout batch.

    ``PolicyGradientLoss(clip_eps=0.2, kl_coef=0.04)(model, batch)`` with batch
    ``"inputs" [B, T]``, ``"targets" [B, T]`` (the sampled tokens), ``"mask"
    [B, T]`` (1 on completion tokens), ``"advantages" [B]`` or ``[B, T]``, and
    optional ``"old_logp"``, ``"ref_logp"`` ``[B, T]`` and ``"attention_mask"``.
    Being a frozen dataclass it hashes by value, so trainers built with equal
    losses share one compiled step.

    Returns ``policy_gradient_loss``'s ``(loss, metrics)``.
    """

    clip_eps: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str = "sequence"

    def __call__(self, model, batch: dict) -> tuple[jax.Array, dict]:
        for key in ("inputs", "targets", "mask", "advantages"):
            if key not in batch:
                raise ValueError(f"PolicyGradientLoss: batch has no {key!r}; keys are "
                                 f"{sorted(batch)}")
        logp = token_logprobs(model, batch["inputs"], batch["targets"],
                              attention_mask=batch.get("attention_mask"),
                              positions=batch.get("positions"))
        return policy_gradient_loss(
            logp, batch.get("old_logp"), batch.get("ref_logp"), batch["advantages"],
            batch["mask"], clip_eps=self.clip_eps, kl_coef=self.kl_coef,
            kl_estimator=self.kl_estimator, aggregation=self.aggregation)


def group_advantages(rewards: jax.Array, group_ids: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """GRPO's group-relative advantages: ``(r - mean_g) / std_g`` within each group.

    Args:
      rewards: ``[N]`` scalar rewards.
      group_ids: ``[N]`` ints; samples with the same id (the same prompt) form a group.
      eps: a group whose reward std is at most ``eps * (1 + |mean|)`` (all equal)
        gets advantages 0 (it carries no learning signal).

    Returns:
      ``[N]`` float32 advantages with mean 0 and (population, ddof=0) std 1 in
      every group of non-constant rewards. Works under jit (no static group count;
      cost O(N^2), fine for rollout batches).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    group_ids = jnp.asarray(group_ids)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {rewards.shape} and group_ids {group_ids.shape} must both "
                         "be [N]")
    same = (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)
    count = jnp.sum(same, axis=1)
    mean = same @ rewards / count
    centred = rewards - mean
    # Row i: the squared deviations of i's group members from i's group mean, averaged.
    var = jnp.sum(same * (rewards[None, :] - mean[:, None]) ** 2, axis=1) / count
    std = jnp.sqrt(var)
    flat = std <= eps * (1.0 + jnp.abs(mean))
    return jnp.where(flat, 0.0, centred / jnp.where(flat, 1.0, std))
