"""Synthetic tasks for S²-Net, deterministic in ``(seed, index)`` so that
``batch_fn(step)`` is a pure function of the step (lab.train.Trainer's contract).

* :func:`binding_batch`: temporal binding of overlapping shapes: a horizontal
  and a vertical bar that cross on a ``size x size`` grid; the network must put
  the pixels of each bar in one phase cluster.
* :func:`flicker_batch`: temporal binding without a local cue: every pixel of the
  grid has the same mean firing rate; objects (interleaved sets of rows) differ only
  in WHEN their pixels fire (phase-locked to the rhythm at an object-specific phase).
  A single sparse frame or the time-averaged image carries little group information.
* :func:`bound_query_batch`: semantic reasoning over bound features: objects, each
  a colour and a shape channel firing at the object's phase; the question "is colour
  0 bound to shape 0?" has the same channel rates for either answer.
* :func:`spike_train_batch`: neural activity decoding: Bernoulli spike trains of
  direction-tuned input neurons (von Mises tuning curves, trial-to-trial gain
  noise), class = stimulus direction.
* :func:`signal_batch`: time-series classification: noisy sine, square,
  sawtooth and chirp waveforms with random frequency, phase and amplitude.
"""

from __future__ import annotations

import numpy as np

BACKGROUND, OVERLAP = 0, 3


def _rng(seed: int, index: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, index, salt])


def binding_batch(seed: int, index: int, batch: int, size: int = 8, steps: int = 96,
                  min_len: int = 4) -> dict:
    """Crossing bars.

    Returns:
      ``{"inputs": [B, T, size*size] float32`` (the image repeated over ``steps``),
      ``"labels": [B, size*size] int32`` with 0 background, 1 horizontal bar,
      2 vertical bar, 3 the crossing pixel (in both shapes; left out of the ARI)}.
    """
    if not 2 <= min_len <= size:
        raise ValueError(f"min_len={min_len} must lie in [2, size={size}]")
    rng = _rng(seed, index, 1)
    labels = np.zeros((batch, size, size), np.int32)
    for b in range(batch):
        lh, lv = rng.integers(min_len, size + 1, 2)
        r = rng.integers(0, size)
        c0 = rng.integers(0, size - lh + 1)
        c = rng.integers(c0, c0 + lh)
        r0 = rng.integers(max(0, r - lv + 1), min(r, size - lv) + 1)
        labels[b, r, c0:c0 + lh] = 1
        labels[b, r0:r0 + lv, c] += 2
    labels = labels.reshape(batch, size * size)
    image = (labels > 0).astype(np.float32)
    return {"inputs": np.repeat(image[:, None, :], steps, axis=1), "labels": labels}


def flicker_batch(seed: int, index: int, batch: int, size: int = 8, steps: int = 64,
                  n_objects: int = 2, period: int = 8, rate: float = 0.2, depth: float = 1.0,
                  jitter: float = 0.5) -> dict:
    """Temporal binding by phase-locked firing (objects = random sets of rows of the grid).

    Every row of the ``size x size`` grid is assigned to one of ``n_objects`` objects at
    random (each object gets at least one row), so objects interleave and their pixel
    positions do not cluster. Object ``k`` has phase
    ``phi_k = phi_0 + 2*pi*k/n_objects + jitter * U(-pi/n, pi/n)`` (``phi_0`` uniform),
    i.e. objects are spread over the cycle. Each pixel of object ``k`` fires
    independently at frame ``t`` with probability
    ``rate * (1 + depth * cos(2*pi*t/period - phi_k))`` (phase-locked Bernoulli spikes).
    Difficulty knobs: ``n_objects``; ``rate`` and ``depth`` (less of either, less
    evidence per frame); ``jitter`` (0 evenly spread phases, 1 neighbouring objects may
    coincide); ``steps``. Every pixel fires at the same mean rate whatever its object and
    a frame lights only a sparse, noisy subset of pixels, so appearance (one frame, the
    time average, a neighbourhood) carries little group information; the phase of a
    pixel's firing relative to the other pixels does.

    Returns ``{"inputs": [B, T, size*size] float32 (0/1), "labels": [B, size*size] int32``
    (object ``1..n_objects``), ``"phases": [B, n_objects]`` (each object's phase)}.
    """
    if not 2 <= n_objects <= size:
        raise ValueError(f"n_objects={n_objects} must lie in [2, size={size}]")
    _check_rhythm(rate, depth, period, jitter)
    rng = _rng(seed, index, 4)
    rows = np.empty((batch, size), np.int64)
    for b in range(batch):
        rows[b] = np.concatenate([np.arange(n_objects),
                                  rng.integers(0, n_objects, size - n_objects)])
        rng.shuffle(rows[b])
    spread = 2 * np.pi * np.arange(n_objects) / n_objects
    phases = (rng.uniform(0, 2 * np.pi, (batch, 1)) + spread[None]
              + jitter * rng.uniform(-np.pi / n_objects, np.pi / n_objects, (batch, n_objects)))
    phases = np.mod(phases, 2 * np.pi)
    obj = np.repeat(rows, size, axis=1)  # [B, N] object of each pixel (row-major)
    pix_phase = np.take_along_axis(phases, obj, axis=1)  # [B, N]
    inputs = _phase_locked(rng, pix_phase, steps, period, rate, depth).transpose(0, 2, 1)
    return {"inputs": np.ascontiguousarray(inputs), "labels": (obj + 1).astype(np.int32),
            "phases": phases.astype(np.float32)}


def _phase_locked(rng: np.random.Generator, phases: np.ndarray, steps: int, period: int,
                  rate: float, depth: float) -> np.ndarray:
    """``[..., T]`` 0/1 Bernoulli spikes with probability
    ``rate * (1 + depth * cos(2*pi*t/period - phase))`` for each entry of ``phases``."""
    t = 2 * np.pi * np.arange(steps) / period
    prob = rate * (1 + depth * np.cos(t - phases[..., None]))
    return (rng.random(prob.shape) < prob).astype(np.float32)


def _check_rhythm(rate: float, depth: float, period: int, jitter: float) -> None:
    if not 0.0 < rate <= 0.5:
        raise ValueError(f"rate={rate} must lie in (0, 0.5] (a firing probability per frame "
                         "that stays <= 1 at the peak)")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must lie in [0, 1]")
    if period < 2:
        raise ValueError(f"period={period} must be >= 2 steps")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter={jitter} must lie in [0, 1]")


def bound_query_batch(seed: int, index: int, batch: int, n_objects: int = 3,
                      n_features: int = 4, steps: int = 32, period: int = 8,
                      rate: float = 0.2, depth: float = 1.0, jitter: float = 0.5) -> dict:
    """Semantic reasoning over bound features: "is the red object a square?".

    A scene has ``n_objects`` objects, each with a distinct colour and a distinct shape out
    of ``n_features`` of each. Object 0 has colour 0; shape 0 is on object 0 (label 1) or
    on another object (label 0), balanced; the other colours and shapes are drawn at
    random. Every object has a phase (spread over the cycle with ``jitter`` as in
    :func:`flicker_batch`) and its colour and shape channels fire as independent phase-locked
    Bernoulli spikes at that phase (``rate``, ``depth``, ``period`` as there). Both labels
    light ``n_objects`` colour and ``n_objects`` shape channels, colour 0 and shape 0
    among them, at the same mean rate, so the channel rates alone (a no-context readout)
    are at chance; the answer is whether colour 0 and shape 0 fire in phase.

    Returns ``{"inputs": [B, T, 2*n_features] float32 (0/1)`` (colours then shapes),
    ``"labels": [B] int32}``.
    """
    if not 2 <= n_objects <= n_features:
        raise ValueError(f"n_objects={n_objects} must lie in [2, n_features={n_features}]")
    _check_rhythm(rate, depth, period, jitter)
    rng = _rng(seed, index, 5)
    labels = rng.integers(0, 2, batch).astype(np.int32)
    spread = 2 * np.pi * np.arange(n_objects) / n_objects
    phases = (rng.uniform(0, 2 * np.pi, (batch, 1)) + spread[None]
              + jitter * rng.uniform(-np.pi / n_objects, np.pi / n_objects, (batch, n_objects)))
    colour_phase = np.zeros((batch, n_features))
    shape_phase = np.zeros((batch, n_features))
    colour_on = np.zeros((batch, n_features), bool)
    shape_on = np.zeros((batch, n_features), bool)
    for b in range(batch):
        colours = np.concatenate([[0], 1 + rng.permutation(n_features - 1)[:n_objects - 1]])
        shapes = 1 + rng.permutation(n_features - 1)[:n_objects]
        shapes[0 if labels[b] else rng.integers(1, n_objects)] = 0
        colour_phase[b, colours], shape_phase[b, shapes] = phases[b], phases[b]
        colour_on[b, colours], shape_on[b, shapes] = True, True
    on = np.concatenate([colour_on, shape_on], 1)
    spikes = _phase_locked(rng, np.concatenate([colour_phase, shape_phase], 1), steps, period,
                           rate, depth) * on[..., None]
    return {"inputs": np.ascontiguousarray(spikes.transpose(0, 2, 1)), "labels": labels}


def spike_train_batch(seed: int, index: int, batch: int, *, n_in: int = 32, steps: int = 64,
                      n_classes: int = 4, base_rate: float = 0.02, peak_rate: float = 0.2,
                      kappa: float = 2.0, gain_noise: float = 0.3) -> dict:
    """Direction-tuned Poisson-like population.

    Input neuron ``d`` has preferred direction ``2*pi*d/n_in`` and fires per step
    with probability ``g * (base + (peak - base) * exp(kappa * (cos(stim - pref) - 1)))``
    where ``stim = 2*pi*c/n_classes`` plus jitter of a quarter class width and
    ``g ~ 1 + gain_noise * N(0, 1)`` (clipped at 0.2) per trial.

    Returns ``{"inputs": [B, T, n_in] float32 (0/1), "labels": [B] int32}``.
    """
    rng = _rng(seed, index, 2)
    labels = rng.integers(0, n_classes, batch).astype(np.int32)
    width = 2 * np.pi / n_classes
    stim = labels * width + rng.uniform(-width / 4, width / 4, batch)
    pref = 2 * np.pi * np.arange(n_in) / n_in
    tuning = np.exp(kappa * (np.cos(stim[:, None] - pref[None]) - 1.0))
    gain = np.clip(1.0 + gain_noise * rng.standard_normal((batch, 1)), 0.2, None)
    rate = np.clip(gain * (base_rate + (peak_rate - base_rate) * tuning), 0.0, 1.0)
    spikes = rng.random((batch, steps, n_in)) < rate[:, None, :]
    return {"inputs": spikes.astype(np.float32), "labels": labels}


SIGNAL_CLASSES = ("sine", "square", "sawtooth", "chirp")


def signal_batch(seed: int, index: int, batch: int, steps: int = 64, noise: float = 0.3) -> dict:
    """Four waveform classes (``SIGNAL_CLASSES``) with period 8-24 steps, random phase,
    amplitude 0.5-1.5 and Gaussian noise of std ``noise``.

    Returns ``{"inputs": [B, T, 2] float32`` (the signal's positive and negative parts,
    a two-channel rectified encoding), ``"labels": [B] int32}``.
    """
    rng = _rng(seed, index, 3)
    labels = rng.integers(0, len(SIGNAL_CLASSES), batch).astype(np.int32)
    t = np.arange(steps)[None, :]
    period = rng.uniform(8, 24, (batch, 1))
    phase = rng.uniform(0, 2 * np.pi, (batch, 1))
    amp = rng.uniform(0.5, 1.5, (batch, 1))
    arg = 2 * np.pi * t / period + phase
    chirp_arg = 2 * np.pi * (t / (2 * period) + t ** 2 / (2 * period * steps)) + phase
    waves = np.stack([np.sin(arg), np.sign(np.sin(arg)),
                      2 * ((arg / (2 * np.pi)) % 1.0) - 1, np.sin(chirp_arg)], 0)
    x = amp * waves[labels, np.arange(batch)] + noise * rng.standard_normal((batch, steps))
    inputs = np.stack([np.maximum(x, 0), np.maximum(-x, 0)], -1).astype(np.float32)
    return {"inputs": inputs, "labels": labels}
