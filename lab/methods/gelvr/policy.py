"""GePO's hybrid policy: categorical over tokens, von Mises-Fisher (or Gaussian) over latent slots.

A trajectory of latent visual reasoning interleaves token steps (a categorical action
over the vocabulary) and latent steps (a continuous action: the slot the model writes
back into its input). GePO (the GeLVR / GePO abstract, NeurIPS 2026) samples the latent
action from a vMF on the unit sphere around the policy head's direction, "to respect the
decoder's inherent geometry"; the baseline samples it from an isotropic Gaussian in R^d.
Per step ``t``::

    log pi(a_t) = log softmax(logits_t / T)[a_t]               (token step)
                = log vMF(z_t; h_t / |h_t|, kappa_t)           (latent step, "vmf")
                = log N(z_t; h_t, sigma_t^2 I)                 (latent step, "gaussian")

so the per-step log-probabilities drop into :func:`lab.train.policy_gradient_loss` (a
ratio of densities on latent steps, of probabilities on token steps) and the
trajectory's log-probability is their masked sum (:func:`trajectory_log_prob`).

Our reading of the abstract (its equations are not public to us): the vMF mean is the
normalised head output ``h_t / |h_t|`` (the head's norm carries no direction), and the
concentration ``kappa_t`` (or ``sigma_t``) is whatever the model outputs there (a
learned or fixed number > 0).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lab.methods.gelvr.vmf import vmf_log_prob, vmf_sample

FAMILIES = ("vmf", "gaussian")


class HybridPolicyOutput(NamedTuple):
    """What a hybrid policy's forward pass returns, per step of ``[B, T]``.

    logits:       ``[B, T, V]`` token logits.
    latent_mean:  ``[B, T, d]`` the latent head's output ``h`` (the vMF direction after
                  normalisation, or the Gaussian mean).
    latent_param: ``[B, T]`` (or broadcastable) vMF ``kappa`` or Gaussian ``sigma``, > 0.
    """

    logits: jax.Array
    latent_mean: jax.Array
    latent_param: jax.Array


def _check_family(family: str):
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}; expected one of {FAMILIES}")


def categorical_log_prob(logits: jax.Array, tokens: jax.Array,
                         temperature: float = 1.0) -> jax.Array:
    """``log softmax(logits / temperature)[tokens]`` in float32 (shape of ``tokens``)."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}; expected a number > 0")
    logits = logits.astype(jnp.float32) / temperature
    picked = jnp.take_along_axis(logits, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def gaussian_log_prob(x: jax.Array, mean: jax.Array, scale: jax.Array) -> jax.Array:
    """``log N(x; mean, scale^2 I)`` over the last axis: ``-|x - mean|^2 / (2 scale^2) -
    (d / 2) log(2 pi scale^2)``."""
    d = x.shape[-1]
    scale = jnp.asarray(scale, jnp.float32)
    sq = jnp.sum((x.astype(jnp.float32) - mean.astype(jnp.float32)) ** 2, axis=-1)
    return -sq / (2.0 * scale**2) - 0.5 * d * (math.log(2.0 * math.pi) + 2.0 * jnp.log(scale))


def mean_direction(h: jax.Array) -> jax.Array:
    """``h / |h|`` along the last axis (a zero vector maps to ``e_1``, so padded steps stay
    finite)."""
    h = h.astype(jnp.float32)
    norm = jnp.linalg.norm(h, axis=-1, keepdims=True)
    e1 = jnp.eye(1, h.shape[-1], dtype=h.dtype)[0]
    return jnp.where(norm > 0, h / jnp.where(norm > 0, norm, 1.0), e1)


def latent_log_prob(latents: jax.Array, latent_mean: jax.Array, latent_param: jax.Array,
                    family: str = "vmf") -> jax.Array:
    """Per-step log-density ``[B, T]`` of the latent actions ``latents [B, T, d]`` (see the
    module docstring); ``vmf`` latents must be unit vectors."""
    _check_family(family)
    if family == "vmf":
        return vmf_log_prob(latents, mean_direction(latent_mean), latent_param)
    return gaussian_log_prob(latents, latent_mean, latent_param)


def hybrid_log_prob(out: HybridPolicyOutput, tokens: jax.Array, latents: jax.Array,
                    is_latent: jax.Array, *, family: str = "vmf",
                    temperature: float = 1.0) -> jax.Array:
    """Per-step log-probabilities ``[B, T]`` of a hybrid trajectory.

    Args:
      out: the policy's :class:`HybridPolicyOutput`.
      tokens: ``[B, T]`` the sampled token ids (any value on latent steps).
      latents: ``[B, T, d]`` the sampled latent actions (any value on token steps).
      is_latent: ``[B, T]`` True on latent steps.
      family: ``"vmf"`` (GePO) or ``"gaussian"`` (the baseline).
      temperature: the token sampling temperature.

    Returns the categorical log-probability on token steps and the latent density's log on
    latent steps; the unused branch of each step is fed safe values, so the gradients
    stay finite.
    """
    _check_family(family)
    is_latent = jnp.asarray(is_latent, bool)
    if is_latent.shape != tokens.shape or latents.shape[:-1] != tokens.shape:
        raise ValueError(f"hybrid_log_prob: tokens {tokens.shape}, is_latent "
                         f"{is_latent.shape} and latents {latents.shape} must share [B, T]")
    tok = categorical_log_prob(out.logits, jnp.where(is_latent, 0, tokens), temperature)
    param = jnp.broadcast_to(jnp.asarray(out.latent_param, jnp.float32), tokens.shape)
    param = jnp.where(is_latent, param, 1.0)
    e1 = jnp.eye(1, latents.shape[-1], dtype=jnp.float32)[0]
    mean = jnp.where(is_latent[..., None], out.latent_mean.astype(jnp.float32), e1)
    z = jnp.where(is_latent[..., None], latents.astype(jnp.float32), e1)
    lat = latent_log_prob(z, mean, param, family)
    return jnp.where(is_latent, lat, tok)


def trajectory_log_prob(step_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """``sum_t mask_t log pi(a_t)`` ``[B]``: a trajectory's log-probability."""
    return jnp.sum(step_logp * mask.astype(step_logp.dtype), axis=-1)


def hybrid_sample(key: jax.Array, out: HybridPolicyOutput, is_latent: jax.Array, *,
                  family: str = "vmf", temperature: float = 1.0
                  ) -> tuple[jax.Array, jax.Array]:
    """Samples one action per step: ``(tokens [B, T] int32, latents [B, T, d])`` (tokens on
    latent steps are 0 and latents on token steps are ``e_1``, so they pass straight back
    into :func:`hybrid_log_prob`)."""
    _check_family(family)
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}; expected a number > 0")
    is_latent = jnp.asarray(is_latent, bool)
    k_tok, k_lat = jax.random.split(key)
    tokens = jax.random.categorical(k_tok, out.logits.astype(jnp.float32) / temperature)
    param = jnp.broadcast_to(jnp.asarray(out.latent_param, jnp.float32), is_latent.shape)
    param = jnp.where(is_latent, param, 1.0)
    d = out.latent_mean.shape[-1]
    e1 = jnp.eye(1, d, dtype=jnp.float32)[0]
    mean = jax.lax.stop_gradient(out.latent_mean.astype(jnp.float32))
    if family == "vmf":
        z = vmf_sample(k_lat, mean_direction(mean), param)
    else:
        z = mean + param[..., None] * jax.random.normal(k_lat, mean.shape, jnp.float32)
    latents = jnp.where(is_latent[..., None], z, e1)
    return jnp.where(is_latent, 0, tokens).astype(jnp.int32), latents
