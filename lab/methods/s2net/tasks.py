"""Synthetic tasks for S²-Net, deterministic in ``(seed, index)`` so that
``batch_fn(step)`` is a pure function of the step (lab.train.Trainer's contract).

* :func:`binding_batch`: temporal binding of overlapping shapes: a horizontal
  and a vertical bar that cross on a ``size x size`` grid; the network must put
  the pixels of each bar in one phase cluster.
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
