"""Sequential Monte Carlo pieces of GPA: ESS, resampling, adaptive tempering.

Resampling functions have blackjax's signature ``fn(key, weights, num_samples)
-> indices`` (``blackjax.smc.resampling``) and the same algorithms: systematic
and stratified by inverting the CDF at one shared or per-stratum uniform,
multinomial through sorted uniforms, residual as the integer part plus a
multinomial draw on the residuals (N. Chopin's ``particles``). Weights must be
normalised, finite and non-negative; :func:`normalize` turns log-weights into
such weights and raises a clear error when they are all -inf or NaN.

Adaptive tempering (:func:`next_temperature`): the next inverse temperature is the
largest ``beta' <= 1`` whose conditional ESS (Zhou, Johansen & Aston, 2016) given the
current weights stays at a target fraction of the particles, found by bisection as in
blackjax's ``adaptive_tempered_smc`` (which uses the incremental weights' ESS; the two
agree right after a resampling).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

SCHEMES = ("systematic", "stratified", "multinomial", "residual")


def check_weights(weights, name: str = "weights") -> None:
    """ValueError for concrete weights that are NaN, negative or sum to zero."""
    if isinstance(weights, jax.core.Tracer):
        return
    w = np.asarray(weights)
    if np.isnan(w).any():
        raise ValueError(f"{name} contain NaN at index {int(np.flatnonzero(np.isnan(w))[0])}")
    if (w < 0).any():
        raise ValueError(f"{name} contain a negative value at index {int(np.argmax(w < 0))}")
    if not np.isfinite(w.sum()) or w.sum() <= 0:
        raise ValueError(f"{name} sum to {float(w.sum())}; expected a positive finite total "
                         "(all-zero weights cannot be resampled)")


def normalize(log_weights: jax.Array) -> jax.Array:
    """Softmax of log-weights; ValueError when concrete log-weights are all -inf or have NaN."""
    if not isinstance(log_weights, jax.core.Tracer):
        lw = np.asarray(log_weights)
        if np.isnan(lw).any():
            raise ValueError("log_weights contain NaN at index "
                             f"{int(np.flatnonzero(np.isnan(lw))[0])}")
        if not np.isfinite(lw).any():
            raise ValueError("log_weights are all -inf: every particle has zero weight")
    return jax.nn.softmax(log_weights)


def ess(log_weights: jax.Array) -> jax.Array:
    """Effective sample size ``1 / sum(w_i^2)`` of normalised weights, from log-weights."""
    w = jax.nn.softmax(log_weights)
    return 1.0 / jnp.sum(w * w)


def _sorted_uniforms(key, n):
    # Sorted uniforms by normalised exponential spacings (Chopin & Papaspiliopoulos, 2020).
    z = jnp.cumsum(-jnp.log(jax.random.uniform(key, (n + 1,))))
    return z[:-1] / z[-1]


def _invert_cdf(weights, uniforms):
    idx = jnp.searchsorted(jnp.cumsum(weights), uniforms)
    return jnp.clip(idx, 0, weights.shape[0] - 1)


def systematic(key, weights, num_samples: int):
    """One uniform shifted over ``num_samples`` strata."""
    u = (jax.random.uniform(key, ()) + jnp.arange(num_samples)) / num_samples
    return _invert_cdf(weights, u)


def stratified(key, weights, num_samples: int):
    """One uniform per stratum."""
    u = (jax.random.uniform(key, (num_samples,)) + jnp.arange(num_samples)) / num_samples
    return _invert_cdf(weights, u)


def multinomial(key, weights, num_samples: int):
    """Independent draws (via sorted uniforms)."""
    return _invert_cdf(weights, _sorted_uniforms(key, num_samples))


def residual(key, weights, num_samples: int):
    """``floor(N w_i)`` copies of each particle, the rest multinomial on the residuals."""
    k1, k2 = jax.random.split(key)
    n = weights.shape[0]
    nw = num_samples * weights
    integer = jnp.floor(nw).astype(jnp.int32)
    n_int = jnp.sum(integer)
    res = nw - integer
    res = res / jnp.maximum(jnp.sum(res), 1e-30)
    drawn = jax.random.permutation(k2, multinomial(k1, res, num_samples))
    counts = jnp.concatenate([integer, (num_samples - n_int)[None]])
    fixed = jnp.repeat(jnp.arange(n + 1), counts, total_repeat_length=num_samples)
    return jnp.where(jnp.arange(num_samples) >= n_int, drawn, fixed)


_FNS = {"systematic": systematic, "stratified": stratified, "multinomial": multinomial,
        "residual": residual}


def resample(key, weights, num_samples: int, scheme: str = "systematic"):
    """Indices of ``num_samples`` particles drawn by ``scheme`` (one of :data:`SCHEMES`)."""
    if scheme not in _FNS:
        raise ValueError(f"scheme={scheme!r} is unknown; expected one of {SCHEMES}")
    check_weights(weights)
    return _FNS[scheme](key, weights, num_samples)


def conditional_ess(log_weights: jax.Array, log_incremental: jax.Array) -> jax.Array:
    """Conditional ESS of Zhou, Johansen & Aston (2016, eq. 3.16):
    ``CESS = N (sum_i W_i w_i)^2 / sum_i W_i w_i^2``, with ``W`` the current normalised
    weights (from ``log_weights``) and ``w`` the incremental weights (from
    ``log_incremental``; their scale cancels). It is ``N`` when the incremental weights are
    flat and the plain ESS of ``w`` when ``W`` is uniform; computed in log space."""
    n = log_weights.shape[0]
    log_w = jax.nn.log_softmax(log_weights)
    num = 2.0 * jax.nn.logsumexp(log_w + log_incremental)
    den = jax.nn.logsumexp(log_w + 2.0 * log_incremental)
    return n * jnp.exp(num - den)


def next_temperature(reward: jax.Array, beta: jax.Array, target_cess: float,
                     *, log_weights: jax.Array | None = None, iters: int = 40) -> jax.Array:
    """Largest ``beta' in (beta, 1]`` with ``CESS(log_weights, (beta' - beta) * reward) >=
    target_cess * N`` (:func:`conditional_ess`), by bisection on the increment.

    Zhou, Johansen & Aston (2016)'s adaptive rule: the conditional ESS measures how much the
    increment alone degrades the current weighted population, so the schedule does not
    depend on when the last resampling happened (``log_weights=None``: uniform current
    weights, where CESS is the incremental weights' ESS). The CESS falls monotonically in
    the increment, so bisection finds it. If ``beta' = 1`` keeps the CESS above target,
    returns 1.
    """
    lw = jnp.zeros_like(reward) if log_weights is None else log_weights
    goal = target_cess * reward.shape[0]

    def ok(b):
        return conditional_ess(lw, (b - beta) * reward) >= goal

    def body(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        return jnp.where(good, mid, lo), jnp.where(good, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iters, body, (beta, jnp.asarray(1.0, reward.dtype)))
    return jnp.where(ok(1.0), 1.0, lo)
