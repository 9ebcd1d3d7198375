"""GeLVR's geometry-consistent SFT loss and GePO's objective.

The GeLVR / GePO abstract (NeurIPS 2026): supervising latent slots in isolation leaves
a fragmented latent space, so GeLVR aligns the slots' *relational structure* with the
target visual features during SFT, and GePO keeps that structure during RL by adding the
same geometry-preserving term to the policy-gradient objective. Our reading (the paper's
equations are not public to us):

* the relational structure of ``S`` vectors is their cosine Gram matrix
  ``G_ij = <x_i, x_j> / (|x_i| |x_j|)``, which is invariant to rotations of the feature
  space and to the scale of each vector (so slots of width ``d`` compare with visual
  features of another width ``d'``);
* the target features ``[B, S', d']`` are average-pooled over contiguous chunks to the
  ``S`` slots (torch's ``adaptive_avg_pool1d`` boundaries) when ``S' != S``;
* the loss is the mean squared difference of the off-diagonal Gram entries
  (:func:`gram_alignment_loss`), zero exactly when the two structures agree;
* GePO's loss is :func:`lab.train.policy_gradient_loss` (the shared GRPO objective:
  clipped ratio, KL to the reference) on the hybrid per-step log-probabilities of
  :mod:`lab.methods.gelvr.policy`, plus ``geometry_coef`` times the Gram loss of the
  policy's latent mean directions against the scaffold (the visual features, or the
  SFT model's slots) (:func:`gepo_loss`, :class:`GePOLoss`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lab.methods.gelvr.policy import FAMILIES, HybridPolicyOutput, hybrid_log_prob
from lab.train.losses import policy_gradient_loss


def pooling_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]`` weights of adaptive average pooling: row ``i`` averages inputs
    ``floor(i n_in / n_out) .. ceil((i + 1) n_in / n_out) - 1`` (torch's
    ``adaptive_avg_pool1d``)."""
    if n_in < 1 or n_out < 1:
        raise ValueError(f"pooling_matrix: n_in={n_in}, n_out={n_out}; expected both >= 1")
    w = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
        lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        w[i, lo:hi] = 1.0 / (hi - lo)
    return w


def pool_slots(features: jax.Array, num_slots: int) -> jax.Array:
    """``[B, S', d'] -> [B, num_slots, d']`` by adaptive average pooling over the slot axis
    (the identity when ``S' == num_slots``)."""
    if features.shape[1] == num_slots:
        return features
    w = jnp.asarray(pooling_matrix(features.shape[1], num_slots))
    return jnp.einsum("os,bsd->bod", w, features.astype(jnp.float32))


def cosine_gram(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``[B, S, d] -> [B, S, S]`` cosine similarities (a zero vector has similarity 0)."""
    x = x.astype(jnp.float32)
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    u = x / jnp.maximum(norm, eps)
    return jnp.einsum("bsd,btd->bst", u, u)


def gram_alignment_loss(slots: jax.Array, targets: jax.Array,
                        slot_mask: jax.Array | None = None) -> jax.Array:
    """GeLVR's geometry-consistent SFT loss: the mean over pairs ``i != j`` of valid slots
    of ``(G^slots_ij - G^targets_ij)^2`` with ``G`` the cosine Gram matrix, averaged over
    the batch.

    Args:
      slots: ``[B, S, d]`` latent slots (S >= 2).
      targets: ``[B, S', d']`` target visual features, pooled to ``S`` slots.
      slot_mask: None or ``[B, S]`` (1 on real slots); pairs with a padded slot do not count.

    Returns a float32 scalar in ``[0, 4]``: zero when the slots' relational structure is
    the targets' (invariant to rotations and to the scale of either side's features).
    """
    if slots.ndim != 3 or targets.ndim != 3 or slots.shape[0] != targets.shape[0]:
        raise ValueError(f"gram_alignment_loss: slots {slots.shape} and targets "
                         f"{targets.shape} must be [B, S, d] and [B, S', d'] with equal B")
    b, s, _ = slots.shape
    if s < 2:
        raise ValueError(f"gram_alignment_loss: slots have S={s}; a relational structure "
                         "needs S >= 2")
    gs = cosine_gram(slots)
    gt = cosine_gram(pool_slots(targets, s))
    off = 1.0 - jnp.eye(s, dtype=jnp.float32)
    if slot_mask is None:
        pair = jnp.broadcast_to(off, (b, s, s))
    else:
        if slot_mask.shape != (b, s):
            raise ValueError(f"gram_alignment_loss: slot_mask {slot_mask.shape}; expected "
                             f"{(b, s)}")
        m = slot_mask.astype(jnp.float32)
        pair = off * m[:, :, None] * m[:, None, :]
    per_example = jnp.sum(pair * (gs - gt) ** 2, axis=(1, 2)) / jnp.maximum(
        jnp.sum(pair, axis=(1, 2)), 1.0)
    return jnp.mean(per_example)


def slot_alignment_loss(slots: jax.Array, targets: jax.Array) -> jax.Array:
    """Latent slots supervised in isolation: the mean over slots and the batch of
    ``1 - cos(slot_j, target_j)``, the targets pooled to the slots
    (:func:`pool_slots`). Each slot is pulled towards its own target feature (latent
    visual reasoning's reconstruction of the region's features, Li et al. 2025, "Latent
    Visual Reasoning"); nothing constrains the slots' relations, which
    :func:`gram_alignment_loss` adds. Slots and targets must have the same width.

    Returns a float32 scalar in ``[0, 2]``, zero when every slot points along its target.
    """
    if slots.ndim != 3 or targets.ndim != 3 or slots.shape[0] != targets.shape[0] or \
            slots.shape[-1] != targets.shape[-1]:
        raise ValueError(f"slot_alignment_loss: slots {slots.shape} and targets "
                         f"{targets.shape} must be [B, S, d] and [B, S', d] with equal B, d")
    t = pool_slots(targets, slots.shape[1]).astype(jnp.float32)
    x = slots.astype(jnp.float32)
    cos = jnp.sum(x * t, -1) / jnp.maximum(
        jnp.linalg.norm(x, axis=-1) * jnp.linalg.norm(t, axis=-1), 1e-8)
    return jnp.mean(1.0 - cos)


def gather_slots(latent_mean: jax.Array, slot_positions: jax.Array) -> jax.Array:
    """``[B, T, d]`` per-step head outputs -> ``[B, S, d]`` at the latent steps
    ``slot_positions [B, S]`` (step indices)."""
    idx = jnp.asarray(slot_positions, jnp.int32)[..., None]
    return jnp.take_along_axis(latent_mean, idx, axis=1)


def gepo_loss(step_logp: jax.Array, batch: dict, slots: jax.Array, *,
              geometry_coef: float = 0.1, clip_eps: float = 0.2,
              clip_eps_high: float | None = None, kl_estimator: str = "k3",
              aggregation: str = "sequence") -> tuple[jax.Array, dict]:
    """GePO's objective as a loss: ``policy_gradient_loss(step_logp, ...) + geometry_coef *
    gram_alignment_loss(slots, batch["geometry_target"], batch.get("slot_mask"))``.

    ``step_logp`` ``[B, T]`` are the hybrid per-step log-probabilities; ``batch`` holds
    ``mask``, ``advantages`` and optionally ``old_logp``, ``ref_logp``, ``kl_coef``
    (as :class:`lab.train.rl.GRPOLoss` reads them) and ``geometry_target``. With
    ``geometry_coef = 0`` (the "no regulariser" ablation) no target is needed.

    Returns ``(loss, metrics)``: the policy-gradient metrics plus ``geometry`` (the Gram
    loss, also reported at coefficient 0 when a target is given) and ``loss``.
    """
    if not geometry_coef >= 0:
        raise ValueError(f"geometry_coef={geometry_coef!r}; expected a number >= 0")
    pg, metrics = policy_gradient_loss(
        step_logp, batch.get("old_logp"), batch.get("ref_logp"), batch["advantages"],
        batch["mask"], clip_eps=clip_eps, clip_eps_high=clip_eps_high,
        kl_coef=batch.get("kl_coef", 0.0) if "ref_logp" in batch else 0.0,
        kl_estimator=kl_estimator, aggregation=aggregation)
    if "geometry_target" in batch:
        geo = gram_alignment_loss(slots, batch["geometry_target"], batch.get("slot_mask"))
    elif geometry_coef > 0:
        raise ValueError(f"gepo_loss: geometry_coef={geometry_coef} needs "
                         f"batch['geometry_target']; batch keys are {sorted(batch)}")
    else:
        geo = jnp.zeros((), jnp.float32)
    loss = pg + geometry_coef * geo
    return loss, dict(metrics, loss=loss, pg_objective=pg, geometry=geo)


@dataclasses.dataclass(frozen=True)
class GePOLoss:
    """A ``loss_fn(model, batch) -> (loss, metrics)`` for Lab's jitted train step
    (:func:`lab.train.compiled_step`, as :class:`lab.train.rl.GRPOLoss`), for a hybrid
    policy.

    ``forward(model, batch) -> HybridPolicyOutput`` runs the policy (a module-level
    function, so equal losses hash equal and share a compiled step). Batch: ``targets``
    ``[B, T]`` (sampled tokens), ``latents`` ``[B, T, d]``, ``is_latent`` ``[B, T]``,
    ``slot_positions`` ``[B, S]`` (the latent steps the regulariser reads), ``mask``,
    ``advantages``, and optionally ``old_logp``, ``ref_logp``, ``kl_coef``,
    ``geometry_target`` ``[B, S', d']``, ``slot_mask`` ``[B, S]``.

    ``family="gaussian"`` with ``geometry_coef=0`` is the Gaussian-policy RL baseline;
    ``family="vmf"`` with ``geometry_coef=0`` is GePO without its regulariser.
    """

    forward: Callable[..., HybridPolicyOutput]
    family: str = "vmf"
    geometry_coef: float = 0.1
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_estimator: str = "k3"
    aggregation: str = "sequence"
    temperature: float = 1.0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"GePOLoss.family={self.family!r}; expected one of {FAMILIES}")
        if not callable(self.forward):
            raise ValueError(f"GePOLoss.forward={self.forward!r}; expected a callable "
                             "(model, batch) -> HybridPolicyOutput")
        if not (isinstance(self.geometry_coef, (int, float)) and self.geometry_coef >= 0):
            raise ValueError(f"GePOLoss.geometry_coef={self.geometry_coef!r}; expected a "
                             "number >= 0")

    def __call__(self, model, batch: dict) -> tuple[jax.Array, dict]:
        for key in ("targets", "latents", "is_latent", "slot_positions", "mask", "advantages"):
            if key not in batch:
                raise ValueError(f"GePOLoss: batch has no {key!r}; keys are {sorted(batch)}")
        if self.geometry_coef > 0 and "geometry_target" not in batch:
            raise ValueError(f"GePOLoss: geometry_coef={self.geometry_coef} needs "
                             f"batch['geometry_target']; batch keys are {sorted(batch)}")
        out = self.forward(model, batch)
        step_logp = hybrid_log_prob(out, batch["targets"], batch["latents"],
                                    batch["is_latent"], family=self.family,
                                    temperature=self.temperature)
        slots = gather_slots(out.latent_mean, batch["slot_positions"])
        return gepo_loss(step_logp, batch, slots, geometry_coef=self.geometry_coef,
                         clip_eps=self.clip_eps, clip_eps_high=self.clip_eps_high,
                         kl_estimator=self.kl_estimator, aggregation=self.aggregation)
