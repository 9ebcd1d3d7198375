"""GridProbe's answer-space frame selection: grid probes, the importance map, the
Shape-Adaptive Selection of how many frames to keep, top-M selection, and the baselines.

GridProbe (answer-space frame selection for long-video QA): sample ``N = K * K`` frames,
lay them on a ``K x K`` grid in time order (frame ``n`` at row ``n // K``, column
``n % K``); row probe ``i`` is the selector VLM answering the question from row ``i``'s
``K`` consecutive frames, column probe ``j`` from column ``j``'s ``K`` strided frames; a
probe's confidence is its peak posterior over the answer options; the importance map is
the outer product ``I[i, j] = r_i * c_j``. Shape-Adaptive Selection sets the number of
frames kept per question from the map's shape: with population skewness ``s`` and excess
kurtosis ``k`` of its ``K^2`` values,

    M_eff = clip(ceil(K^2 / (1 + c * (|s| + 0.5 * max(0, k)))), M_min, M_max),  c = 3,

and a map with zero spread keeps all ``K^2`` frames. Alternatives offered as a config
choice (``rule=``): the participation ratio ``(sum v)^2 / sum v^2`` capped at the frames
that hold 90% of the map's mass, the count above the mean, and the count above Otsu's
threshold (Otsu 1979, "A threshold selection method from gray-level histograms").
A probe's confidence can also be measured against the question alone (``confidence=
"kl"``): the KL divergence of its posterior from the selector's no-frame posterior, which
is zero for frames that do not move the answer, however peaked the question alone makes
it. The paper's rule, the peak posterior, is the default.

Everything here is a pure function of arrays, jitted and batched over questions (leading
axis ``B``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

RULES = ("shape", "participation", "mean", "otsu")
CONFIDENCES = ("peak", "kl")   # a probe's confidence: peak posterior, or KL from no frames
ZERO_SPREAD = 1e-5    # a map whose std is below this times its largest |value| has no shape


def check_grid_size(k: int, frames: int) -> int:
    """``N = k * k``; raises ValueError unless ``k >= 1`` and ``N <= frames`` (GridProbe
    samples distinct frames: a video with fewer than ``K^2`` frames cannot fill the grid;
    pass a smaller ``K``)."""
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k={k!r}; expected an int >= 1 (the grid's side)")
    if not isinstance(frames, (int, np.integer)) or frames < 1:
        raise ValueError(f"frames={frames!r}; expected an int >= 1")
    if k * k > frames:
        raise ValueError(f"k={k} needs K^2={k * k} distinct frames but the video has "
                         f"{frames}; expected K^2 <= frames (pass k <= {int(np.sqrt(frames))})")
    return k * k


def grid_frames(frames: int, k: int) -> np.ndarray:
    """The ``K^2`` frame indices of a ``frames``-frame video on the grid, uniform in time
    (centres of ``K^2`` equal segments), in time order; ValueError if ``K^2 > frames``."""
    n = check_grid_size(k, frames)
    return np.floor((np.arange(n) + 0.5) * frames / n).astype(np.int64)


def probe_slots(k: int) -> np.ndarray:
    """``[2K, K]`` grid slots (0..K^2-1) each probe sees: rows ``0..K-1`` are the row
    probes (consecutive slots), rows ``K..2K-1`` the column probes (stride ``K``)."""
    slots = np.arange(k * k).reshape(k, k)
    return np.concatenate([slots, slots.T]).astype(np.int64)


@jax.jit
def confidences(posteriors: jax.Array, prior: jax.Array | None = None) -> jax.Array:
    """A probe's confidence, ``[..., n_options] -> [...]``: the peak posterior over the
    options, or with ``prior`` (the no-frame posterior, broadcast against ``posteriors``)
    ``KL(posterior || prior)`` in nats, ``0 log 0 = 0``."""
    if prior is None:
        return jnp.max(posteriors, axis=-1)
    p = jnp.asarray(posteriors, jnp.float32)
    q = jnp.maximum(jnp.asarray(prior, jnp.float32), jnp.finfo(jnp.float32).tiny)
    terms = jnp.where(p > 0, p * (jnp.log(jnp.maximum(p, jnp.finfo(jnp.float32).tiny))
                                  - jnp.log(q)), 0.0)
    return jnp.maximum(jnp.sum(terms, axis=-1), 0.0)


@jax.jit
def importance_map(row_conf: jax.Array, col_conf: jax.Array) -> jax.Array:
    """``[B, K] x [B, K] -> [B, K*K]`` flattened outer product (slot ``i*K + j``)."""
    return (row_conf[:, :, None] * col_conf[:, None, :]).reshape(row_conf.shape[0], -1)


def _spread(v, sd):
    """True where the map has a shape: std above float32 round-off of its scale."""
    return sd > ZERO_SPREAD * jnp.max(jnp.abs(v), -1)


def _moments(v):
    mu = jnp.mean(v, -1, keepdims=True)
    d = v - mu
    var = jnp.mean(d ** 2, -1)
    sd = jnp.sqrt(var)
    safe = jnp.where(_spread(v, sd), sd, 1.0)
    skew = jnp.mean(d ** 3, -1) / safe ** 3
    kurt = jnp.mean(d ** 4, -1) / safe ** 4 - 3.0
    return sd, skew, kurt


def _bounds(n: int, m_min: int, m_max: int | None) -> tuple[int, int]:
    hi = n if m_max is None else int(m_max)
    if not isinstance(m_min, (int, np.integer)) or not 1 <= m_min <= n:
        raise ValueError(f"m_min={m_min!r}; expected an int in [1, K^2={n}]")
    if not m_min <= hi <= n:
        raise ValueError(f"m_max={m_max!r}; expected an int in [m_min={m_min}, K^2={n}]")
    return int(m_min), hi


@functools.partial(jax.jit, static_argnames=("m_min", "m_max"))
def _shape_m(v, scale, *, m_min, m_max):
    n = v.shape[-1]
    sd, s, k = _moments(v)
    m = jnp.ceil(n / (1.0 + scale * (jnp.abs(s) + 0.5 * jnp.maximum(0.0, k))))
    m = jnp.where(_spread(v, sd), m, n)
    return jnp.clip(m, m_min, m_max).astype(jnp.int32)


def shape_adaptive_m(importance_map, *, scale: float = 3.0, m_min: int = 1,
                     m_max: int | None = None) -> jax.Array:
    """GridProbe's Shape-Adaptive Selection: frames to keep per question, ``[B] int32``.

    ``importance_map``: ``[B, K^2]`` (or ``[B, K, K]``, or one map ``[K^2]``). With the
    population skewness ``s`` and excess kurtosis ``k`` of each map's values,
    ``M_eff = clip(ceil(K^2 / (1 + scale * (|s| + 0.5 * max(0, k)))), m_min, m_max)``
    (``m_max`` defaults to ``K^2``); a map with zero spread (all values equal) keeps all
    ``K^2``. A flat map keeps everything; one sharp peak keeps one or two frames.
    """
    v, single = _as_maps(importance_map)
    if not np.isfinite(scale) or scale < 0:
        raise ValueError(f"scale={scale!r}; expected a finite float >= 0")
    lo, hi = _bounds(v.shape[-1], m_min, m_max)
    m = _shape_m(v, jnp.float32(scale), m_min=lo, m_max=hi)
    return m[0] if single else m


@functools.partial(jax.jit, static_argnames=("m_min", "m_max", "mass"))
def _participation_m(v, *, m_min, m_max, mass):
    n = v.shape[-1]
    p = jnp.maximum(v, 0.0)
    total = jnp.sum(p, -1)
    pr = total ** 2 / jnp.maximum(jnp.sum(p ** 2, -1), 1e-30)
    srt = -jnp.sort(-p, -1)
    cum = jnp.cumsum(srt, -1) / jnp.maximum(total, 1e-30)[:, None]
    cap = jnp.sum(cum < mass - 1e-9, -1) + 1            # fewest top frames holding `mass`
    m = jnp.minimum(jnp.ceil(pr), cap)
    sd = jnp.std(v, -1)
    m = jnp.where(_spread(v, sd) & (total > 0), m, n)
    return jnp.clip(m, m_min, m_max).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("m_min", "m_max"))
def _mean_m(v, *, m_min, m_max):
    n = v.shape[-1]
    sd = jnp.std(v, -1)
    m = jnp.sum(v > jnp.mean(v, -1, keepdims=True), -1)
    m = jnp.where(_spread(v, sd), m, n)
    return jnp.clip(m, m_min, m_max).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("m_min", "m_max"))
def _otsu_m(v, *, m_min, m_max):
    """Otsu on the sorted values: the split (top ``m`` vs the rest) that maximises the
    between-class variance ``w0 w1 (mu0 - mu1)^2``."""
    n = v.shape[-1]
    srt = -jnp.sort(-v, -1)                              # descending
    m = jnp.arange(1, n)                                 # top m in the upper class
    csum = jnp.cumsum(srt, -1)[:, :-1]
    total = jnp.sum(srt, -1, keepdims=True)
    w1 = m / n
    mu1 = csum / m
    mu0 = (total - csum) / (n - m)
    between = w1 * (1 - w1) * (mu1 - mu0) ** 2
    best = jnp.argmax(between, -1) + 1
    sd = jnp.std(v, -1)
    out = jnp.where(_spread(v, sd), best, n)
    return jnp.clip(out, m_min, m_max).astype(jnp.int32)


def _as_maps(importance_map):
    v = jnp.asarray(importance_map, jnp.float32)
    single = v.ndim == 1
    if single:
        v = v[None]
    elif v.ndim == 3:
        v = v.reshape(v.shape[0], -1)
    if v.ndim != 2 or v.shape[-1] < 1:
        raise ValueError(f"importance_map has shape {tuple(np.shape(importance_map))}; "
                         "expected [B, K^2], [B, K, K] or [K^2]")
    return v, single


def select_m(importance_map, rule: str = "shape", *, scale: float = 3.0, m_min: int = 1,
             m_max: int | None = None, mass: float = 0.9) -> jax.Array:
    """Frames to keep per question by ``rule`` (one of :data:`RULES`): ``"shape"``
    (:func:`shape_adaptive_m`), ``"participation"`` (``ceil`` of the participation ratio,
    capped at the fewest top frames holding ``mass`` of the map), ``"mean"`` (frames above
    the map's mean), ``"otsu"`` (frames above Otsu's threshold). Zero spread keeps all."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; expected one of {RULES}")
    if rule == "shape":
        return shape_adaptive_m(importance_map, scale=scale, m_min=m_min, m_max=m_max)
    v, single = _as_maps(importance_map)
    lo, hi = _bounds(v.shape[-1], m_min, m_max)
    if rule == "participation":
        if not 0 < mass <= 1:
            raise ValueError(f"mass={mass!r}; expected a float in (0, 1]")
        m = _participation_m(v, m_min=lo, m_max=hi, mass=float(mass))
    elif rule == "mean":
        m = _mean_m(v, m_min=lo, m_max=hi)
    else:
        m = _otsu_m(v, m_min=lo, m_max=hi)
    return m[0] if single else m


@jax.jit
def top_m_mask(scores: jax.Array, m: jax.Array) -> jax.Array:
    """``[B, N]`` bool: each row's ``m[b]`` highest scores (ties to the earlier slot)."""
    order = jnp.argsort(-scores, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    return rank < jnp.asarray(m)[:, None]


def uniform_mask(n: int, m) -> np.ndarray:
    """``[B, N]`` bool: ``m[b]`` slots spread uniformly in time (segment centres)."""
    m = np.atleast_1d(np.asarray(m, np.int64))
    out = np.zeros((len(m), n), bool)
    for b, mb in enumerate(m):
        out[b, np.floor((np.arange(mb) + 0.5) * n / mb).astype(np.int64)] = True
    return out


@jax.jit
def cosine_scores(frame_emb: jax.Array, query_emb: jax.Array) -> jax.Array:
    """Encoder-space similarity: cosine of each frame's embedding ``[B, N, D]`` with the
    question's ``[B, D]`` (the CLIP-style retrieval baseline of frame selection)."""
    f = frame_emb / jnp.maximum(jnp.linalg.norm(frame_emb, axis=-1, keepdims=True), 1e-9)
    q = query_emb / jnp.maximum(jnp.linalg.norm(query_emb, axis=-1, keepdims=True), 1e-9)
    return jnp.einsum("bnd,bd->bn", f, q)
