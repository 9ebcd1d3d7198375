"""Geometric functionals of a chain of thought's hidden-state trajectory.

A chain's hidden states at one layer, ``X [T, d]`` (one row per generated token), are a
discrete curve in R^d (the geometry of CoT trajectories of the paper this package follows:
spectral, positional and kinematic functionals of that curve). Every function here takes
one trajectory ``[T, d]`` or a batch ``[B, T, d]`` with a validity ``mask [B, T]`` (True =
a real step; trajectories of different lengths are right-padded), and is jitted.

- spectral: the eigenvalues of the centred trajectory's covariance
  ``C = (1/n) sum_t (x_t - mu)(x_t - mu)^T`` (:func:`spectrum`, descending), the effective
  dimension ``d_rho`` = the smallest ``k`` with ``sum_{i<=k} lambda_i >= rho sum_i lambda_i``
  (:func:`effective_dimension`), the participation ratio
  ``(sum lambda)^2 / sum lambda^2`` (:func:`participation_ratio`);
- positional: the mean position ``mu``, the dispersion ``(1/n) sum_t ||x_t - mu||^2``
  (= trace C) and the initial state ``x_0``;
- kinematic: the velocities ``v_t = x_{t+1} - x_t``, the mean velocity (mean of ``v_t``),
  the mean speed (mean of ``||v_t||``) and the speed dispersion (standard deviation of
  ``||v_t||``).

The covariance's non-zero eigenvalues are those of the Gram matrix of the centred
points, so the smaller of the two (``T x T`` or ``d x d``) is decomposed.

Bad input (checked on concrete arrays): a trajectory with fewer than 2 valid steps, a
``rho`` outside ``(0, 1]``, a mask of the wrong shape: ValueError naming it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# d_rho's cumulative-variance test is ``>= rho - RHO_TOL``: a spectrum whose first k
# eigenvalues hold exactly rho of the variance gives k despite float rounding, and rho = 1
# gives the numerical rank (eigenvalues below ~1e-6 of the variance are not counted).
RHO_TOL = 1e-6

SCALAR_FEATURES = ("d_rho", "participation_ratio", "dispersion", "mean_speed",
                   "speed_dispersion", "mean_velocity_norm", "mean_position_norm",
                   "initial_norm")
VECTOR_FEATURES = ("mean_position", "initial_state", "mean_velocity")


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def as_batch(X, mask=None, *, min_steps: int = 2, name: str = "X"):
    """``(X [B, T, d] float32, mask [B, T] bool, single)`` from a ``[T, d]`` or
    ``[B, T, d]`` trajectory and an optional mask (default: every step valid);
    ``single`` says the input was one trajectory. Raises ValueError for another rank, a
    mask of another shape, or (concrete inputs) a trajectory with fewer than
    ``min_steps`` valid steps."""
    X = jnp.asarray(X)
    single = X.ndim == 2
    if X.ndim not in (2, 3):
        raise ValueError(f"{name} has shape {X.shape}; expected a trajectory [T, d] or a batch "
                         "[B, T, d]")
    if single:
        X = X[None]
    b, t, _ = X.shape
    if mask is None:
        mask = jnp.ones((b, t), bool)
    else:
        mask = jnp.asarray(mask)
        if single and mask.ndim == 1:
            mask = mask[None]
        if mask.shape != (b, t):
            want = (t,) if single else (b, t)
            raise ValueError(f"mask has shape {mask.shape}; expected {want} for {name} of "
                             f"shape {X.shape[1:] if single else X.shape}")
        mask = mask.astype(bool)
    if _is_concrete(mask):
        steps = np.asarray(mask).sum(1)
        short = np.flatnonzero(steps < min_steps)
        if short.size:
            rows, have = short[:5].tolist(), steps[short[:5]].tolist()
            raise ValueError(f"{name}: trajectories {rows} (of {b}) have {have} valid steps;"
                             f" a trajectory needs at least {min_steps} (a curve "
                             "of one point has no spread and no velocity)")
    return X.astype(jnp.float32), mask, single


def check_rho(rho) -> float:
    """``rho`` as a float; ValueError unless ``0 < rho <= 1``."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float, np.floating, np.integer)):
        raise ValueError(f"rho={rho!r}; expected a number in (0, 1]")
    if not 0.0 < float(rho) <= 1.0:
        raise ValueError(f"rho={rho!r}; expected a fraction of variance in (0, 1]")
    return float(rho)


def _centred(x, m):
    """Masked centring of one trajectory: ``(x - mu) * m``, ``mu``, ``n``."""
    mf = m.astype(x.dtype)[:, None]
    n = jnp.maximum(mf.sum(), 1.0)
    mu = (x * mf).sum(0) / n
    return (x - mu) * mf, mu, n


def _spectrum_one(x, m):
    xc, _, n = _centred(x, m)
    t, d = x.shape
    gram = xc @ xc.T if t <= d else xc.T @ xc
    lam = jnp.linalg.eigvalsh(gram / n)[::-1]
    return jnp.maximum(lam, 0.0)


@jax.jit
def _spectra(X, mask):
    return jax.vmap(_spectrum_one)(X, mask)


def _d_rho(lam, rho):
    total = lam.sum(-1, keepdims=True)
    frac = jnp.cumsum(lam, -1) / jnp.where(total > 0, total, 1.0)
    k = 1 + jnp.sum(frac < rho - RHO_TOL, axis=-1)
    return jnp.where(total[..., 0] > 0, k, 0).astype(jnp.int32)


def _pr(lam):
    s, s2 = lam.sum(-1), (lam ** 2).sum(-1)
    return jnp.where(s2 > 0, s ** 2 / jnp.where(s2 > 0, s2, 1.0), 0.0)


def _unbatch(value, single):
    return value[0] if single else value


def spectrum(X, mask=None) -> jax.Array:
    """Eigenvalues of the centred trajectory's covariance, descending: ``[min(T, d)]`` for
    ``X [T, d]``, ``[B, min(T, d)]`` for a batch (masked steps excluded; the trailing
    eigenvalues beyond the rank are 0)."""
    X, mask, single = as_batch(X, mask)
    return _unbatch(_spectra(X, mask), single)


def effective_dimension(X, rho: float = 0.9, mask=None) -> jax.Array:
    """``d_rho``: the smallest number of principal components of the centred trajectory
    that explain a fraction ``rho`` of its variance (int32 scalar, or ``[B]``; 0 for a
    trajectory without spread). ValueError for ``rho`` outside (0, 1] or fewer than 2
    valid steps."""
    rho = check_rho(rho)
    X, mask, single = as_batch(X, mask)
    return _unbatch(_d_rho(_spectra(X, mask), rho), single)


def participation_ratio(X, mask=None) -> jax.Array:
    """``(sum_i lambda_i)^2 / sum_i lambda_i^2`` of the trajectory's covariance spectrum:
    ``k`` for ``k`` equal eigenvalues, between 1 and the rank otherwise (0 without spread)."""
    X, mask, single = as_batch(X, mask)
    return _unbatch(_pr(_spectra(X, mask)), single)


def _kinematics_one(x, m):
    xc, mu, n = _centred(x, m)
    v = x[1:] - x[:-1]
    vm = (m[1:] & m[:-1]).astype(x.dtype)                      # both ends valid
    nv = jnp.maximum(vm.sum(), 1.0)
    speed = jnp.linalg.norm(v, axis=-1)
    mean_speed = (speed * vm).sum() / nv
    speed_var = (((speed - mean_speed) ** 2) * vm).sum() / nv
    first = jnp.argmax(m)
    return {
        "mean_position": mu,
        "dispersion": (xc ** 2).sum() / n,
        "initial_state": x[first],
        "mean_velocity": (v * vm[:, None]).sum(0) / nv,
        "mean_speed": mean_speed,
        "speed_dispersion": jnp.sqrt(speed_var),
    }


@functools.partial(jax.jit, static_argnames=("rho",))
def _features(X, mask, rho):
    lam = _spectra(X, mask)
    out = jax.vmap(_kinematics_one)(X, mask)
    out["d_rho"] = _d_rho(lam, rho).astype(jnp.float32)
    out["participation_ratio"] = _pr(lam)
    out["mean_velocity_norm"] = jnp.linalg.norm(out["mean_velocity"], axis=-1)
    out["mean_position_norm"] = jnp.linalg.norm(out["mean_position"], axis=-1)
    out["initial_norm"] = jnp.linalg.norm(out["initial_state"], axis=-1)
    return out


def kinematics(X, mask=None) -> dict[str, jax.Array]:
    """Positional and kinematic functionals: ``mean_position [.., d]``, ``dispersion``,
    ``initial_state [.., d]`` (the first valid step), ``mean_velocity [.., d]``,
    ``mean_speed``, ``speed_dispersion`` (velocities between consecutive valid steps)."""
    X, mask, single = as_batch(X, mask)
    out = jax.jit(jax.vmap(_kinematics_one))(X, mask)
    return {k: _unbatch(v, single) for k, v in out.items()}


def features(X, mask=None, rho: float = 0.9) -> dict[str, jax.Array]:
    """Every functional of each trajectory: the :data:`SCALAR_FEATURES` (``[B]`` each:
    ``d_rho``, the participation ratio, dispersion, mean speed, speed dispersion and the
    norms of the mean velocity, mean position and initial state) and the
    :data:`VECTOR_FEATURES` (``[B, d]``: mean position, initial state, mean velocity)."""
    rho = check_rho(rho)
    X, mask, single = as_batch(X, mask)
    return {k: _unbatch(v, single) for k, v in _features(X, mask, rho).items()}


def prefix_mask(mask, fraction: float, min_steps: int = 2) -> jax.Array:
    """The mask of each trajectory's first ``max(min_steps, ceil(fraction * n))`` valid steps
    (``n``: its valid steps; right-padded masks), for features of the start of a chain."""
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"fraction={fraction!r}; expected a fraction of the chain in (0, 1]")
    mask = jnp.asarray(mask, bool)
    n = mask.sum(-1, keepdims=True)
    keep = jnp.minimum(n, jnp.maximum(min_steps, jnp.ceil(fraction * n).astype(jnp.int32)))
    return mask & (jnp.arange(mask.shape[-1]) < keep)


@functools.partial(jax.jit, static_argnames=("window", "rho"))
def _windowed(X, mask, window, rho):
    b, t, d = X.shape
    nw = t // window
    xw = X[:, :nw * window].reshape(b * nw, window, d)
    mw = mask[:, :nw * window].reshape(b * nw, window)
    full = mw.all(-1)
    k = _d_rho(_spectra(xw, mw), rho).astype(jnp.float32).reshape(b, nw)
    full = full.reshape(b, nw)
    count = full.sum(-1)
    return jnp.where(count > 0, (k * full).sum(-1) / jnp.maximum(count, 1), jnp.nan), count


def windowed_effective_dimension(X, window: int, rho: float = 0.9, mask=None):
    """``(mean d_rho over windows, windows [B])``: ``d_rho`` of each non-overlapping window of
    ``window`` consecutive valid steps (``X[:, :window]``, ``X[:, window:2 window]``, ...;
    windows that reach into padding are left out), averaged per trajectory. Every window has
    the same number of points, so this ``d_rho`` does not grow with the chain's length the
    way the whole curve's does (NaN for a trajectory shorter than ``window``)."""
    rho = check_rho(rho)
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        raise ValueError(f"window={window!r}; expected an int >= 2 (steps per window)")
    X, mask, single = as_batch(X, mask)
    mean, count = _windowed(X, mask, window, rho)
    return _unbatch(mean, single), _unbatch(count, single)


def feature_matrix(feats: dict, names) -> np.ndarray:
    """``[B, F]`` float64: the named features side by side (vector features as their ``d``
    columns), in the order of ``names``."""
    cols = []
    for name in names:
        if name not in feats:
            raise ValueError(f"feature {name!r} is unknown; expected any of {sorted(feats)}")
        v = np.asarray(feats[name], np.float64)
        cols.append(v[:, None] if v.ndim == 1 else v)
    return np.concatenate(cols, axis=1)
