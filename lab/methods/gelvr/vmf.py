"""The von Mises-Fisher distribution on the unit sphere S^{d-1}: log-density and sampling.

``vMF(x; mu, kappa) = C_d(kappa) exp(kappa mu^T x)`` with
``C_d(kappa) = kappa^{d/2-1} / ((2 pi)^{d/2} I_{d/2-1}(kappa))`` (Mardia & Jupp 2000,
"Directional Statistics", eq. 9.3.4). The log-normaliser goes through the exponentially
scaled Bessel function ``log ive_v(k) = log I_v(k) - k`` (as ``scipy.stats.vonmises_fisher``
does), computed here for any order ``v >= 0`` without overflow (:func:`log_ive`):

* ``k <= 10``: the power series ``I_v(k) = (k/2)^v sum_j (k^2/4)^j / (j! Gamma(v+j+1))``
  (Abramowitz & Stegun 9.6.10), 40 terms, summed in log space of its first term;
* ``k > 10``: Olver's uniform asymptotic (Debye) expansion (A&S 9.7.7, coefficients
  ``u_1..u_5`` of A&S 9.3.9-10) at order ``v + n >= 15``, carried down to ``v`` by the
  backward recurrence of the ratios ``I_{m+1}/I_m = 1 / (2(m+1)/k + I_{m+2}/I_{m+1})``
  (A&S 9.6.26; stable downwards, Miller's direction).

Sampling follows Wood (1994), "Simulation of the von Mises Fisher distribution",
Communications in Statistics - Simulation and Computation 23(1): the cosine
``w = mu^T x`` by rejection from a Beta((d-1)/2, (d-1)/2) envelope, written in terms of
``1 - w`` and ``1 - x0`` so that large ``kappa`` keeps its precision in float32; a
uniform direction in the tangent space; a Householder reflection taking ``e_1`` to ``mu``
(as ``scipy.stats.vonmises_fisher`` and TFP's ``VonMisesFisher``). The rejection runs in
one ``lax.while_loop`` over the whole batch: every sample keeps drawing until accepted.

Bad input, as scipy (which raises for ``kappa <= 0`` and a non-unit ``mu``): with concrete
(non-traced) arguments a ``ValueError`` names the value; under ``jit`` / ``vmap`` the check
cannot raise, so the affected outputs are NaN instead. ``mu`` is never renormalised.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

_SERIES_MAX_K = 10.0  # the series below this kappa, the Debye recurrence above
_SERIES_TERMS = 40
_DEBYE_MIN_ORDER = 15.0
_MAX_REJECTION_ROUNDS = 10_000  # a round accepts with probability > 0.4: never reached

# Debye polynomials u_k(p) of A&S 9.3.9-10 as (coefficients, lowest power, denominator).
_DEBYE_U = (
    ((3.0, -5.0), 1, 24.0),
    ((81.0, -462.0, 385.0), 2, 1152.0),
    ((30375.0, -369603.0, 765765.0, -425425.0), 3, 414720.0),
    ((4465125.0, -94121676.0, 349922430.0, -446185740.0, 185910725.0), 4, 39813120.0),
    ((1519035525.0, -49286948607.0, 284499769554.0, -614135872350.0, 566098157625.0,
      -188699385875.0), 5, 6688604160.0),
)


def _dtype(*xs):
    return jnp.result_type(jnp.float32, *xs)


def _log_ive_series(v: jax.Array, k: jax.Array) -> jax.Array:
    """``log I_v(k) - k - v log k`` from the power series (accurate for ``k <= 10``; the
    ``v log k`` is left out so that small ``k`` loses nothing to cancellation). The terms
    ``log[(k^2/4)^j / (j! Gamma(v+j+1))]`` are summed by one logsumexp over ``j``."""
    j = jnp.arange(_SERIES_TERMS, dtype=k.dtype)
    gammaln = jax.scipy.special.gammaln
    log_terms = (j * jnp.log(k[..., None] * k[..., None] / 4.0) - gammaln(j + 1.0)
                 - gammaln(v + j + 1.0))
    return -v * math.log(2.0) + jax.nn.logsumexp(log_terms, axis=-1) - k


def _log_ive_debye(v: float, k: jax.Array) -> jax.Array:
    """``log I_v(k) - k`` from Olver's uniform expansion (accurate for ``v >= 15``)."""
    z = k / v
    s = jnp.sqrt(1.0 + z * z)
    # v * eta - k with eta = s + log(z / (1 + s)), written without cancellation:
    # s - z = 1 / (s + z) and log(z / (1 + s)) = -log1p((1 + 1 / (s + z)) / z).
    inv = 1.0 / (s + z)
    exponent = v * inv - v * jnp.log1p((1.0 + inv) / z)
    p = 1.0 / s
    series = jnp.ones_like(k)
    for order, (coeffs, low, denom) in enumerate(_DEBYE_U, start=1):
        poly = sum(c * p ** (low + 2 * i) for i, c in enumerate(coeffs)) / denom
        series = series + poly / v**order
    return exponent - 0.5 * jnp.log(2.0 * math.pi * v) - 0.5 * jnp.log(s) + jnp.log(series)


def _log_ive_large(v: jax.Array, k: jax.Array) -> jax.Array:
    """``log I_v(k) - k`` for ``k > 10`` and any ``v >= 0``: Debye at ``v + n >= 15``, then
    ``n`` steps of the backward ratio recurrence down to ``v`` (a fixed-length masked loop,
    so ``v`` may be traced and one program serves every dimension)."""
    n = jnp.where(v >= _DEBYE_MIN_ORDER, 0.0, jnp.ceil(_DEBYE_MIN_ORDER - v))
    top = v + n
    log_top = _log_ive_debye(top, k)
    ratio = jnp.exp(_log_ive_debye(top + 1.0, k) - log_top)  # I_{top+1} / I_top

    def step(j, carry):  # m = top - j = top, ..., v + 1
        ratio, log_ratios = carry
        m = top - j
        active = m > v + 0.5
        new = 1.0 / (2.0 * m / k + ratio)  # I_m / I_{m-1}
        return (jnp.where(active, new, ratio),
                log_ratios + jnp.where(active, jnp.log(new), 0.0))

    _, log_ratios = jax.lax.fori_loop(0, math.ceil(_DEBYE_MIN_ORDER), step,
                                      (ratio, jnp.zeros_like(k)))
    return log_top - log_ratios


def _log_ive_branches(v: jax.Array, k: jax.Array, minus_vlogk: bool) -> jax.Array:
    """``log ive_v(k)`` (or ``log ive_v(k) - v log k``) for ``k > 0`` (NaN otherwise), by
    the series or the Debye recurrence (module docstring)."""
    small = k <= _SERIES_MAX_K
    ks = jnp.where(small & (k > 0), k, 1.0)
    kl = jnp.where(small, 2.0 * _SERIES_MAX_K, k)
    series = _log_ive_series(v, ks)
    large = _log_ive_large(v, kl)
    if minus_vlogk:
        large = large - v * jnp.log(kl)
    else:
        series = series + v * jnp.log(ks)
    return jnp.where(k > 0, jnp.where(small, series, large), jnp.nan)


def _log_ive_minus_vlogk(v: jax.Array, k: jax.Array) -> jax.Array:
    return _log_ive_branches(v, k, True)


@jax.jit
def _log_ive_jit(v, k):
    return _log_ive_branches(v, k, False)


def log_ive(v: float, k: jax.Array) -> jax.Array:
    """``log(I_v(k) e^{-k})``, the log of the exponentially scaled modified Bessel
    function of the first kind (scipy's ``log(ive(v, k))``), for a static order
    ``v >= 0`` and ``k > 0`` (elementwise; jittable and differentiable in ``k``).

    Finite where scipy's ``ive`` under- or overflows (large ``v`` with small ``k``,
    ``k`` up to 1e30). Non-positive ``k`` gives NaN.
    """
    v = float(v)
    if not v >= 0:
        raise ValueError(f"log_ive: order v={v!r}; expected a number >= 0")
    k = jnp.asarray(k, _dtype(k))
    return _log_ive_jit(jnp.asarray(v, k.dtype), k)


def _check_dim(dim):
    if not isinstance(dim, (int, np.integer)) or dim < 2:
        raise ValueError(f"vMF dimension {dim!r}; expected an int >= 2 (the sphere S^(d-1) "
                         "in R^d)")


def _log_c_plus_kappa(dim: int, kappa: jax.Array) -> jax.Array:
    """``log C_d(kappa) + kappa = -(d/2) log(2 pi) - (log ive_v(kappa) - v log kappa)``: of
    order ``log kappa`` however large ``kappa`` is."""
    v = jnp.asarray(dim / 2.0 - 1.0, kappa.dtype)
    return -(v + 1.0) * math.log(2.0 * math.pi) - _log_ive_minus_vlogk(v, kappa)


_log_c_plus_kappa_jit = jax.jit(_log_c_plus_kappa)


@jax.jit
def _log_normalizer_jit(dim, kappa):
    return _log_c_plus_kappa(dim, kappa) - kappa


def log_normalizer(dim: int, kappa: jax.Array) -> jax.Array:
    """``log C_d(kappa)`` of the vMF density on S^{dim-1} (``dim >= 2``), written with the
    scaled Bessel function: ``(d/2-1) log k - (d/2) log(2 pi) - log ive_{d/2-1}(k) - k``."""
    _check_dim(dim)
    kappa = jnp.asarray(kappa, _dtype(kappa))
    return _log_normalizer_jit(jnp.asarray(dim, kappa.dtype), kappa)


def mean_resultant_length(dim: int, kappa: jax.Array) -> jax.Array:
    """``E[mu^T x] = A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa)`` (Mardia & Jupp 9.3.9)."""
    _check_dim(dim)
    kappa = jnp.asarray(kappa, _dtype(kappa))
    return jnp.exp(log_ive(dim / 2.0, kappa) - log_ive(dim / 2.0 - 1.0, kappa))


def _tolerance(dtype) -> float:
    return max(1e-5, 10.0 * float(jnp.finfo(dtype).eps))


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check(mu: jax.Array, kappa: jax.Array, name: str):
    """Raises ValueError for ``kappa <= 0`` or a non-unit ``mu`` when they are concrete;
    returns the mask of valid entries (for NaN-ing outputs under tracing)."""
    if mu.ndim < 1 or mu.shape[-1] < 2:
        raise ValueError(f"{name}: mu has shape {mu.shape}; expected [..., d] with d >= 2")
    tol = _tolerance(mu.dtype)
    if _concrete(mu, kappa):
        k = np.asarray(kappa, np.float64)
        if not np.all(k > 0):
            bad = k[~(k > 0)].ravel()[0]
            raise ValueError(f"{name}: kappa={float(bad)!r}; expected kappa > 0 (kappa = 0 "
                             "is the uniform distribution on the sphere)")
        n = np.linalg.norm(np.asarray(mu, np.float64), axis=-1)
        if not np.all(np.abs(n - 1.0) <= tol):
            bad = n[~(np.abs(n - 1.0) <= tol)].ravel()[0]
            raise ValueError(f"{name}: mu has norm {float(bad)!r}; expected a unit vector "
                             f"(|norm - 1| <= {tol:g}); mu is not renormalised, normalise "
                             "it first")
    norm = jnp.linalg.norm(mu.astype(_dtype(mu)), axis=-1)
    unit = jnp.abs(norm - 1.0) <= tol
    positive = kappa > 0
    return unit & positive


def vmf_log_prob(x: jax.Array, mu: jax.Array, kappa: jax.Array) -> jax.Array:
    """Log-density of ``vMF(mu, kappa)`` at unit vectors ``x`` (w.r.t. the surface measure
    of S^{d-1}, as ``scipy.stats.vonmises_fisher.logpdf``).

    Args:
      x: ``[..., d]`` unit vectors; mu: ``[..., d]`` unit mean directions; kappa: ``[...]``
        concentrations > 0. The leading shapes broadcast; ``d >= 2`` is static.

    Returns ``log C_d(kappa) + kappa mu^T x``, shape the broadcast of the leading shapes.
    Bad ``kappa`` / ``mu``: ValueError eagerly, NaN under tracing (module docstring).
    """
    x, mu = jnp.asarray(x), jnp.asarray(mu)
    dtype = _dtype(x, mu, kappa)
    kappa = jnp.asarray(kappa, dtype)
    valid = _check(mu, kappa, "vmf_log_prob")
    if x.shape[-1] != mu.shape[-1]:
        raise ValueError(f"vmf_log_prob: x has dimension {x.shape[-1]} but mu has "
                         f"{mu.shape[-1]}")
    safe = jnp.where(valid, kappa, 1.0)
    # One program per kappa shape for every dimension (d is an argument, not a constant).
    log_c = _log_c_plus_kappa_jit(jnp.asarray(mu.shape[-1], dtype), safe)
    return _log_prob_jit(x.astype(dtype), mu.astype(dtype), safe, valid, log_c)


@jax.jit
def _log_prob_jit(x, mu, kappa, valid, log_c_plus_kappa):
    # log C + kappa (mu.x) = [log C + kappa] + kappa (mu.x - 1): both terms stay O(log k).
    out = log_c_plus_kappa + kappa * (jnp.sum(x * mu, axis=-1) - 1.0)
    return jnp.where(valid, out, jnp.nan)


def _log_gamma_proposal(a: float, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One round of Marsaglia & Tsang's (2000) Gamma(a, 1) rejection sampler ("A simple
    method for generating gamma variables", ACM TOMS 26(3)), with the ``U^{1/a}`` boost
    for ``a < 1``, from three uniforms ``u[0..2]`` in (0, 1); returns ``(log g,
    accepted)``. Conditioned on ``accepted`` the draw is exactly Gamma(a), so it can share
    one rejection loop with Wood's test."""
    boost = a < 1.0
    alpha = a + 1.0 if boost else a
    dd = alpha - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * dd)
    x = math.sqrt(2.0) * jax.lax.erf_inv(2.0 * u[0] - 1.0)  # a standard normal
    v = (1.0 + c * x) ** 3
    safe_v = jnp.where(v > 0, v, 1.0)
    accept = (v > 0) & (jnp.log(u[1]) < 0.5 * x * x + dd - dd * safe_v + dd * jnp.log(safe_v))
    log_g = math.log(dd) + jnp.log(safe_v)
    if boost:
        log_g = log_g + jnp.log(u[2]) / a
    return log_g, accept


def _wood_cosines(key, dim: int, kappa: jax.Array, shape) -> tuple[jax.Array, jax.Array]:
    """Wood's (1994) rejection sampler for ``w = mu^T x``; returns ``(w, 1 - w^2)``.

    ``b = (d-1) / (2k + sqrt(4k^2 + (d-1)^2))``, ``x0 = (1-b)/(1+b)``; propose
    ``Z ~ Beta((d-1)/2, (d-1)/2)``, ``w = (1 - (1+b)Z) / (1 - (1-b)Z)``, accept when
    ``k w + (d-1) log(1 - x0 w) - c >= log U`` with ``c = k x0 + (d-1) log(1 - x0^2)``.
    ``Z = G1 / (G1 + G2)`` with ``G1, G2 ~ Gamma((d-1)/2)`` whose own rejection steps run
    in the same loop (a round is kept only when all three tests pass, which leaves the
    accepted draw's law unchanged); ``Z`` and ``1 - Z`` are logistic functions of
    ``log G1 - log G2``, so neither tail loses precision.
    """
    m = dim - 1.0
    dtype = kappa.dtype
    b = m / (2.0 * kappa + jnp.sqrt(4.0 * kappa * kappa + m * m))
    one_minus_x0 = 2.0 * b / (1.0 + b)
    x0 = (1.0 - b) / (1.0 + b)
    log_1mx0sq = jnp.log(4.0 * b) - 2.0 * jnp.log1p(b)

    def propose(k):
        # One draw of every uniform a round needs (few PRNG calls keep the program small).
        uni = jax.random.uniform(k, (7,) + tuple(shape), dtype, minval=jnp.finfo(dtype).eps)
        log_g1, ok1 = _log_gamma_proposal(m / 2.0, uni[0:3])
        log_g2, ok2 = _log_gamma_proposal(m / 2.0, uni[3:6])
        z, one_minus_z = jax.nn.sigmoid(log_g1 - log_g2), jax.nn.sigmoid(log_g2 - log_g1)
        u = uni[6]
        denom = one_minus_z + b * z  # 1 - (1 - b) z
        one_minus_w = 2.0 * b * z / denom
        w = (one_minus_z - b * z) / denom  # (1 - (1 + b) z) / denom
        sin2 = 4.0 * b * z * one_minus_z / (denom * denom)
        # k (w - x0) + (d-1) (log(1 - x0 w) - log(1 - x0^2)) >= log U
        log_accept = (kappa * (one_minus_x0 - one_minus_w)
                      + m * (jnp.log(one_minus_x0 + x0 * one_minus_w) - log_1mx0sq))
        return w, sin2, ok1 & ok2 & (log_accept >= jnp.log(u))

    def cond(state):
        i, _, _, _, done = state
        return (i < _MAX_REJECTION_ROUNDS) & ~jnp.all(done)

    def body(state):
        i, k, w, sin2, done = state
        k, sub = jax.random.split(k)
        w_new, sin2_new, accept = propose(sub)
        take = accept & ~done
        return (i + 1, k, jnp.where(take, w_new, w), jnp.where(take, sin2_new, sin2),
                done | accept)

    zeros = jnp.zeros(shape, dtype)
    init = (jnp.int32(0), key, zeros, zeros, ~jnp.isfinite(kappa) | (kappa <= 0))
    _, _, w, sin2, _ = jax.lax.while_loop(cond, body, init)
    return w, sin2


def vmf_sample(key: jax.Array, mu: jax.Array, kappa: jax.Array, shape=None) -> jax.Array:
    """Draws from ``vMF(mu, kappa)`` by Wood's (1994) method (module docstring).

    Args:
      key: a PRNG key.
      mu: ``[..., d]`` unit mean directions (``d >= 2``); kappa: ``[...]`` > 0.
      shape: the leading shape of the result, broadcast-compatible with ``mu.shape[:-1]``
        and ``kappa.shape`` (as ``jax.random.beta``'s ``shape``); None = their broadcast.

    Returns ``shape + (d,)`` unit vectors (float32 or wider), without a gradient.
    Bad ``kappa`` / ``mu``: ValueError eagerly, NaN rows under tracing.
    """
    mu = jnp.asarray(mu)
    dtype = _dtype(mu, kappa)
    kappa = jnp.asarray(kappa, dtype)
    valid = _check(mu, kappa, "vmf_sample")
    batch = jnp.broadcast_shapes(mu.shape[:-1], kappa.shape)
    shape = batch if shape is None else tuple(shape)
    try:
        jnp.broadcast_shapes(shape, batch)
    except ValueError:
        raise ValueError(f"vmf_sample: shape={shape} does not broadcast with mu's leading "
                         f"shape {mu.shape[:-1]} and kappa's shape {kappa.shape}") from None
    return _sample_jit(key, mu.astype(dtype), kappa, valid, shape)


@functools.partial(jax.jit, static_argnums=4)
def _sample_jit(key, mu, kappa, valid, shape):
    dim = mu.shape[-1]
    dtype = mu.dtype
    mu = jax.lax.stop_gradient(jnp.broadcast_to(mu, shape + (dim,)))
    valid = jnp.broadcast_to(valid, shape)
    kappa = jax.lax.stop_gradient(jnp.broadcast_to(jnp.where(valid, kappa, jnp.nan), shape))
    k_w, k_v = jax.random.split(key)
    w, sin2 = _wood_cosines(k_w, dim, kappa, shape)
    # A uniform direction orthogonal to e_1, then x = (w, sqrt(1 - w^2) v) about e_1.
    v = jax.random.normal(k_v, shape + (dim - 1,), dtype)
    v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    base = jnp.concatenate([w[..., None], jnp.sqrt(sin2)[..., None] * v], axis=-1)
    # Householder reflection H = I - 2 u u^T / |u|^2 with u = e_1 - mu, so that H e_1 = mu.
    u = jnp.eye(1, dim, dtype=dtype)[0] - mu
    uu = jnp.sum(u * u, axis=-1, keepdims=True)
    coef = jnp.where(uu > 0, 2.0 * jnp.sum(u * base, axis=-1, keepdims=True)
                     / jnp.where(uu > 0, uu, 1.0), 0.0)
    out = base - coef * u
    return jnp.where(valid[..., None], out, jnp.nan)
