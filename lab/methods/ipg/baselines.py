"""The attribution baselines IPG is compared with, on the same component hooks (MLP
neurons by default, or a :class:`~lab.methods.ipg.components.SAEFeatures`' features:
every function takes ``space=``).

All read one fixed (teacher-forced) sequence per example, so none sees how a component
changes the trajectory that is sampled; they look at the answer logit only.

- activation magnitude: mean ``|a_i|`` over the sequence's positions;
- gradient x activation on the answer logit (Shrikumar et al. 2016, "Not Just a Black
  Box"; Denil et al. 2014): ``sum_t a_{t,i} * d logit / d a_{t,i}``, which is the
  gradient of the logit with respect to the component's scale at 1;
- integrated gradients on the answer logit (Sundararajan et al. 2017): the same
  gradient integrated along the scale path from ``baseline`` to 1;
- attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At
  Industrial Scale"; Syed, Rager and Conmy 2023, "Attribution Patching Outperforms
  Automated Circuit Discovery"): ``sum_t (a_corrupt - a_clean)_{t,i} * dM / da_{t,i}``
  at the clean run, ``M`` the clean-minus-corrupt answer logit difference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.methods.ipg.attribution import component_mask, integration_points
from lab.methods.ipg.components import NEURONS, split
from lab.nn import Transformer


@functools.partial(jax.jit, static_argnums=(0,))
def _acts_jit(graphdef, state, seqs):
    model, space = nnx.merge(graphdef, state)
    return space.activations(model, seqs)                              # [L, B, T, F]


def activations(model: Transformer, seqs, space=None) -> np.ndarray:
    """The components' activations ``[L, B, T, F]`` on ``seqs [B, T]`` (MLP neurons, or
    ``space``'s)."""
    return np.asarray(_acts_jit(*split(model, space), jnp.asarray(seqs, jnp.int32)))


def activation_magnitude(model: Transformer, seqs, space=None) -> np.ndarray:
    """Mean ``|activation|`` ``[L, F]`` over the rows and positions of ``seqs``."""
    return np.abs(activations(model, seqs, space)).mean(axis=(1, 2))


def _answer_metric(logits, index, target, other):
    at = jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0]
    m = jnp.take_along_axis(at, target[:, None], axis=1)[:, 0]
    m = m - jnp.where(other >= 0, jnp.take_along_axis(at, jnp.maximum(other, 0)[:, None],
                                                      axis=1)[:, 0], 0.0)
    return jnp.sum(m)


@functools.partial(jax.jit, static_argnums=(0,))
def _logit_grad_jit(graphdef, state, scale, seqs, index, target, other):
    model, space = nnx.merge(graphdef, state)
    return jax.grad(lambda s: _answer_metric(space.forward(model, seqs, s), index, target,
                                             other))(scale)


@functools.partial(jax.jit, static_argnums=(0,))
def _shift_grad_jit(graphdef, state, shift, seqs, index, target, other):
    model, space = nnx.merge(graphdef, state)
    ones = jnp.ones_like(shift)
    return jax.grad(lambda d: _answer_metric(space.forward(model, seqs, ones, d), index,
                                             target, other))(shift)


def _answer_args(seqs, index, target, other=None):
    seqs = jnp.asarray(seqs, jnp.int32)
    b = seqs.shape[0]
    index = jnp.broadcast_to(jnp.asarray(index, jnp.int32), (b,))
    target = jnp.broadcast_to(jnp.asarray(target, jnp.int32), (b,))
    other = jnp.full((b,), -1, jnp.int32) if other is None else \
        jnp.broadcast_to(jnp.asarray(other, jnp.int32), (b,))
    return seqs, index, target, other


def answer_logit_grad(model: Transformer, seqs, index, target, scale,
                      space=None) -> np.ndarray:
    """Mean over rows of ``d logit[target] / d s`` ``[L, F]`` at the logits of position
    ``index`` (the one that predicts the answer) of ``seqs``, at scale ``[L, F]``."""
    seqs, index, target, other = _answer_args(seqs, index, target)
    g = _logit_grad_jit(*split(model, space), _per_position(scale, seqs.shape), seqs, index,
                        target, other)
    return np.asarray(g).sum(axis=(1, 2)) / seqs.shape[0]


def _per_position(scale, seq_shape):
    """``[L, F]`` -> ``[L, B, T, F]`` (one compiled program for every scale hook here)."""
    s = jnp.asarray(scale, jnp.float32)
    return jnp.broadcast_to(s[:, None, None, :], (s.shape[0], *seq_shape, s.shape[1]))


def gradient_x_activation(model: Transformer, seqs, index, target,
                          space=None) -> np.ndarray:
    """Gradient x activation of the answer logit, summed over positions, mean over rows:
    ``[L, F]`` (the logit's gradient with respect to the scales at 1)."""
    shape = (space or NEURONS).shape(model)
    return answer_logit_grad(model, seqs, index, target, np.ones(shape), space)


def integrated_gradients(model: Transformer, seqs, index, target, *, steps: int = 8,
                         method: str = "gausslegendre", baseline: float = 0.0,
                         components=None, layers=None, space=None) -> np.ndarray:
    """Integrated gradients ``[L, F]`` of the answer logit along the scale path from
    ``baseline`` to 1 of the chosen components (all by default), on fixed ``seqs``."""
    alphas, weights = integration_points(method, steps)
    shape = (space or NEURONS).shape(model)
    mask = component_mask(shape, components, layers)
    total = np.zeros(shape)
    for a, w in zip(alphas, weights, strict=True):
        s = 1.0 + (baseline + a * (1.0 - baseline) - 1.0) * mask
        total += w * answer_logit_grad(model, seqs, index, target, s, space)
    return (1.0 - baseline) * total * mask


def attribution_patching(model: Transformer, clean, corrupt, index, clean_target,
                         corrupt_target, space=None) -> np.ndarray:
    """Attribution patching ``[L, F]``: the first-order estimate of the change in
    ``M = logit[clean_target] - logit[corrupt_target]`` (at position ``index``) when each
    neuron's activations at every position are patched from the ``corrupt`` run into the
    ``clean`` one, mean over rows.

    ``dM/da`` comes from a per-position shift of the activations where the component
    type has one (SAE features: exact, also where ``a_clean`` is 0, as it often is for a
    ReLU feature); for neurons from the per-position scale hook: ``dM/ds_{t,i} = a_{t,i}
    dM/da_{t,i}`` at ``s = 1``, so ``(a_corrupt - a_clean) dM/da = (a_corrupt / a_clean -
    1) dM/ds`` (0 where ``a_clean`` is 0)."""
    clean, index, target, other = _answer_args(clean, index, clean_target, corrupt_target)
    corrupt = jnp.asarray(corrupt, jnp.int32)
    if corrupt.shape != clean.shape:
        raise ValueError(f"corrupt has shape {corrupt.shape}; expected the clean "
                         f"{tuple(clean.shape)} (positions must align)")
    a_clean, a_corr = activations(model, clean, space), activations(model, corrupt, space)
    s = jnp.ones(a_clean.shape, jnp.float32)
    if (space or NEURONS).additive:
        g = np.asarray(_shift_grad_jit(*split(model, space), jnp.zeros_like(s), clean, index,
                                       target, other))
        return ((a_corr - a_clean) * g).sum(axis=2).mean(axis=1)
    g = np.asarray(_logit_grad_jit(*split(model, space), s, clean, index, target, other))
    nz = np.abs(a_clean) > 0
    ratio = np.where(nz, a_corr / np.where(nz, a_clean, 1.0) - 1.0, 0.0)
    return (ratio * g).sum(axis=2).mean(axis=1)


@functools.partial(jax.jit, static_argnums=(0,))
def _logits_at_jit(graphdef, state, scale, seqs, index):
    model, space = nnx.merge(graphdef, state)
    logits = space.forward(model, seqs, scale)
    return jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0]


def answer_logits(model: Transformer, seqs, index, scale, space=None) -> np.ndarray:
    """Logits ``[B, V]`` at position ``index`` of the fixed ``seqs`` (teacher forcing)
    under the component scale ``[L, F]``: what the answer step alone does under an
    ablation."""
    seqs, index, _, _ = _answer_args(seqs, index, 0)
    return np.asarray(_logits_at_jit(*split(model, space), _per_position(scale, seqs.shape),
                                     seqs, index))
