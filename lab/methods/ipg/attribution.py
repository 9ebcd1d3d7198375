"""Integrated Policy Gradient (IPG): attribution of an outcome-level reward of sampled
trajectories to components (MLP neurons, or sparse-autoencoder features on the residual
stream: :mod:`lab.methods.ipg.components`), and ablation / amplification of the top ones.

A component's scale ``s`` multiplies its activation (``neuron_scale`` of
:class:`lab.nn.Transformer`, or a :class:`lab.nn.FeatureScale` edit). The expected
outcome reward of trajectories sampled under ``s``,
``J(s) = E_{x, y ~ pi_s(.|x)}[R(x, y)]``, is not differentiable through the samples, but
its gradient is (REINFORCE, Williams 1992, the score-function estimator)::

    dJ/ds = E[(R(x, y) - b) * d/ds sum_t log pi_s(y_t | x, y_<t)]

with a leave-one-out baseline ``b`` (the mean reward of the other samples: unbiased,
lower variance; Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free").
IPG integrates it along the straight path from a baseline scale ``s0`` (0: the
components off) to 1, as Integrated Gradients does for inputs (Sundararajan et al. 2017,
"Axiomatic Attribution for Deep Networks", eq. 1)::

    IPG_i = (1 - s0) * integral_0^1 dJ/ds_i (s0 + a (1 - s0)) da

by a Riemann or Gauss-Legendre rule (captum's ``IntegratedGradients`` approximation
methods). Summed over the scaled components it approximates ``J(1) - J(s0)``
(completeness), a linear approximation of the mediation of the outcome by those
components over the whole trajectory (IPG: "Integrated Policy Gradient", NeurIPS 2026).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import infer
from lab.methods.ipg.components import NEURONS, split
from lab.nn import Transformer

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
           "gausslegendre")


def integration_points(method: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(alphas [n], weights [n])`` on ``[0, 1]`` of captum's approximation methods:
    Riemann left / right / middle / trapezoid sums and the ``steps``-point
    Gauss-Legendre rule (exact for polynomials of degree ``2 * steps - 1``)."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r}; expected an int >= 1")
    if method not in METHODS:
        raise ValueError(f"method={method!r}; expected one of {METHODS}")
    n = int(steps)
    if method == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return 0.5 * (x + 1.0), 0.5 * w
    if method == "riemann_trapezoid":
        if n < 2:
            raise ValueError(f"steps={steps!r}; the trapezoid rule needs steps >= 2")
        w = np.full(n, 1.0 / (n - 1))
        w[[0, -1]] *= 0.5
        return np.linspace(0.0, 1.0, n), w
    offset = {"riemann_left": 0.0, "riemann_right": 1.0, "riemann_middle": 0.5}[method]
    return (np.arange(n) + offset) / n, np.full(n, 1.0 / n)


def component_mask(shape: tuple[int, int], components=None, layers=None) -> np.ndarray:
    """``[L, F]`` float mask of the components that are scaled along the path (the rest
    stay at 1): ``components [K, 2]`` (layer, neuron) pairs, or whole ``layers``, or
    every neuron when both are None. Unknown indices raise ValueError naming them."""
    n_layers, d_ff = shape
    mask = np.zeros(shape, np.float32)
    if components is None and layers is None:
        return mask + 1.0
    if layers is not None:
        bad = [int(i) for i in layers if not 0 <= int(i) < n_layers]
        if bad:
            raise ValueError(f"layers={list(layers)} has unknown layers {bad}; expected "
                             f"indices in [0, {n_layers})")
        mask[list(layers)] = 1.0
    if components is not None:
        c = check_components(components, shape)
        mask[c[:, 0], c[:, 1]] = 1.0
    return mask


def check_components(components, shape: tuple[int, int]) -> np.ndarray:
    """``components`` as an int ``[K, 2]`` array of (layer, neuron) pairs; ValueError for
    another shape or an index outside the model."""
    c = np.asarray(components)
    if c.ndim != 2 or c.shape[1] != 2 or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"components has shape {c.shape} dtype {c.dtype}; expected int "
                         "[K, 2] (layer, neuron) pairs")
    n_layers, d_ff = shape
    bad_l = c[(c[:, 0] < 0) | (c[:, 0] >= n_layers), 0]
    if bad_l.size:
        raise ValueError(f"components name unknown layer {int(bad_l[0])}; expected layers "
                         f"in [0, {n_layers})")
    bad_n = c[(c[:, 1] < 0) | (c[:, 1] >= d_ff), 1]
    if bad_n.size:
        raise ValueError(f"components name unknown neuron {int(bad_n[0])}; expected neurons "
                         f"in [0, {d_ff})")
    return c.astype(np.int64)


def set_scale(shape: tuple[int, int], components, factor: float) -> np.ndarray:
    """``[L, F]`` ones with ``components`` set to ``factor`` (0 ablates, > 1 amplifies)."""
    s = np.ones(shape, np.float32)
    c = check_components(components, shape)
    s[c[:, 0], c[:, 1]] = factor
    return s


def top_components(scores, k: int) -> np.ndarray:
    """The ``k`` components of largest ``|scores|`` (``[L, F]``) as ``[k, 2]`` pairs."""
    s = np.abs(np.asarray(scores, np.float64))
    if not 1 <= k <= s.size:
        raise ValueError(f"k={k!r}; expected an int in [1, {s.size}]")
    flat = np.argsort(-s.ravel(), kind="stable")[:k]
    return np.stack(np.unravel_index(flat, s.shape), axis=1)


def precision_at_k(scores, truth, k: int) -> float:
    """Share of the top-``k`` components (by ``|scores|``) that are in ``truth [K, 2]``."""
    top = {tuple(map(int, r)) for r in top_components(scores, k)}
    true = {tuple(map(int, r)) for r in np.asarray(truth)}
    return len(top & true) / k


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, ties sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(1, x.size + 1)
    _, inv = np.unique(x, return_inverse=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / np.bincount(inv))[inv]


def rank_correlation(scores, truth) -> float:
    """Spearman's rank correlation between ``|scores|`` and the sizes ``|truth|`` of the
    measured effects (same shape; ties share their mean rank), as :func:`top_components`
    ranks by size; 0 when either is constant."""
    a = np.abs(np.asarray(scores, np.float64)).ravel()
    b = np.abs(np.asarray(truth, np.float64)).ravel()
    if a.shape != b.shape:
        raise ValueError(f"truth has {b.size} entries; expected one per component, {a.size}")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else 0.0


def sample(model: Transformer, prompts, scale, *, max_new_tokens: int, temperature: float,
           seed: int, stop_tokens=(), space=None) -> tuple[np.ndarray, np.ndarray]:
    """Trajectories sampled under the component scale ``[L, F]`` of ``space`` (default
    :class:`~lab.methods.ipg.components.Neurons`; a scaled copy of the model, so
    :func:`lab.infer.generate` runs unchanged; ``scale`` None: the model as it is):
    ``(completions [N, max_new_tokens], lengths [N])``."""
    scaled = model if scale is None else (space or NEURONS).scaled(model, scale)
    gen = infer.generate(scaled, np.asarray(prompts, np.int32),
                         max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         stop_tokens=tuple(stop_tokens))
    return np.asarray(gen.tokens), np.asarray(gen.lengths)


def check_rewards(rewards, n: int) -> np.ndarray:
    """``rewards`` as float32 ``[n]``; ValueError for another length or NaN/inf."""
    r = np.asarray(rewards, np.float32)
    if r.shape != (n,):
        raise ValueError(f"reward has shape {r.shape}; expected one per trajectory, [{n}]")
    if not np.all(np.isfinite(r)):
        raise ValueError("reward contains NaN or inf; expected finite values")
    return r


@functools.partial(jax.jit, static_argnums=(0,))
def _pg_jit(graphdef, state, scale, prompts, completions, valid, advantages, temperature):
    model, space = nnx.merge(graphdef, state)
    seq = jnp.concatenate([prompts, completions], axis=1)
    p = prompts.shape[1]

    def objective(s):
        logits = space.forward(model, seq[:, :-1], s)[:, p - 1:]
        logp = jax.nn.log_softmax(logits / temperature, axis=-1)
        tok = jnp.take_along_axis(logp, completions[..., None], axis=-1)[..., 0]
        return jnp.mean(advantages * jnp.sum(jnp.where(valid, tok, 0.0), axis=1))

    return jax.grad(objective)(scale)


def policy_gradient(model: Transformer, prompts, completions, lengths, rewards, scale, *,
                    temperature: float, space=None) -> np.ndarray:
    """The score-function estimate ``[L, F]`` of ``dJ/ds`` at ``scale`` (of ``space``'s
    components, default neurons) from trajectories sampled under it at ``temperature``:
    ``mean_i (R_i - b_i) d/ds log pi_s(y_i | x_i)``, ``b_i`` the mean reward of the other
    trajectories (leave-one-out baseline)."""
    prompts, completions = np.asarray(prompts, np.int32), np.asarray(completions, np.int32)
    n = prompts.shape[0]
    if n < 2:
        raise ValueError(f"{n} trajectories; the leave-one-out baseline needs at least 2")
    r = check_rewards(rewards, n)
    adv = r - (r.sum() - r) / (n - 1)
    valid = np.arange(completions.shape[1])[None, :] < np.asarray(lengths)[:, None]
    graphdef, state = split(model, space)
    return np.asarray(_pg_jit(graphdef, state, jnp.asarray(scale, jnp.float32), prompts,
                              completions, valid, jnp.asarray(adv), jnp.float32(temperature)))


class Attribution(NamedTuple):
    """What :func:`integrated_policy_gradient` returns.

    scores:   ``[L, F]`` IPG attribution of each component (0 outside the scaled set).
    alphas:   ``[n]`` the integration points; weights ``[n]`` their weights.
    rewards:  ``[n]`` mean reward of the trajectories sampled at each point.
    grads:    ``[n, L, F]`` the policy-gradient estimate at each point.
    """

    scores: np.ndarray
    alphas: np.ndarray
    weights: np.ndarray
    rewards: np.ndarray
    grads: np.ndarray


def integrated_policy_gradient(model: Transformer, prompts, reward_fn: Callable, *,
                               max_new_tokens: int, steps: int = 8,
                               method: str = "gausslegendre", baseline: float = 0.0,
                               components=None, layers=None, temperature: float = 1.0,
                               samples: int = 1, seed: int = 0,
                               stop_tokens=(), space=None) -> Attribution:
    """IPG attributions of the outcome reward to ``space``'s components (default every
    MLP neuron, :class:`~lab.methods.ipg.components.Neurons`; or
    :class:`~lab.methods.ipg.components.SAEFeatures`).

    Args:
      prompts: ``[N, T]`` token ids (equal lengths).
      reward_fn: ``(prompt_rows [M], completions [M, max_new_tokens]) -> rewards [M]``
        (any outcome signal; ``prompt_rows`` index ``prompts``).
      steps, method: the integration rule (:func:`integration_points`).
      baseline: the scale the path starts from (0 = components off).
      components / layers: the scaled set (:func:`component_mask`); default every neuron.
      samples: trajectories sampled per prompt at each point (at ``temperature``).
      space: the component type; ``components`` / ``layers`` index its grid.

    Returns an :class:`Attribution`; ``scores.sum()`` approximates ``J(1) - J(baseline)``.
    """
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r}; expected an int >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}; expected > 0 (sampled trajectories)")
    alphas, weights = integration_points(method, steps)
    shape = (space or NEURONS).shape(model)
    mask = component_mask(shape, components, layers)
    prompts = np.asarray(prompts, np.int32)
    rows = np.repeat(np.arange(prompts.shape[0]), samples)
    grads, mean_r = [], []
    for k, a in enumerate(alphas):
        s = 1.0 + (baseline + a * (1.0 - baseline) - 1.0) * mask
        comp, lens = sample(model, prompts[rows], s, max_new_tokens=max_new_tokens,
                            temperature=temperature, seed=seed * 1000 + k,
                            stop_tokens=stop_tokens, space=space)
        r = check_rewards(reward_fn(rows, comp), rows.size)
        grads.append(policy_gradient(model, prompts[rows], comp, lens, r, s,
                                     temperature=temperature, space=space) * mask)
        mean_r.append(float(r.mean()))
    grads = np.stack(grads)
    scores = (1.0 - baseline) * np.tensordot(weights, grads, axes=1)
    return Attribution(scores, alphas, weights, np.array(mean_r), grads)


def outcome(model: Transformer, prompts, reward_fn: Callable, scale=None, *,
            max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
            stop_tokens=(), space=None) -> float:
    """Mean reward of trajectories (greedy at temperature 0) under ``scale [L, F]`` of
    ``space``'s components (default: the model as it is): the accuracy after an ablation
    or amplification."""
    comp, _ = sample(model, prompts, scale, max_new_tokens=max_new_tokens,
                     temperature=temperature, seed=seed, stop_tokens=stop_tokens, space=space)
    prompts = np.asarray(prompts, np.int32)
    rows = np.arange(prompts.shape[0])
    return float(check_rewards(reward_fn(rows, comp), rows.size).mean())

