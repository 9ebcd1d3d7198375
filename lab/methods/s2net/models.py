"""S²-Net and its three baselines as Flax NNX modules.

* :class:`S2Net`: LIF neurons on a scaffold with surrogate gradients; phases
  estimated from spikes in a finite window (bottom-up); time-delayed Kuramoto
  synchronisation of oscillator phases that modulates the input current
  (top-down). The dynamics run in :func:`kernels_pallas.spiking.spiking_scan`.
  ``sync=False`` is the first baseline, the same SNN without synchronisation
  (no modulation, no Kuramoto coupling).
* :class:`KuramotoNet`: oscillators without spikes, time-delayed Kuramoto on the
  same scaffold; neurons exchange their phases (real numbers) every step.
* :class:`RateRNN`: the equal-size ANN for sequences, a tanh RNN with the same
  neurons, scaffold, encoder and readout.
* :class:`ConvRNN`: the equal-size ANN for temporal binding, a recurrent grid
  convolution with a 2-d state per pixel (56 parameters at radius 2, against
  S²-Net's 50).
* :class:`ConvEmbed`: the feed-forward conv baseline for binding, a one-layer grid
  convolution to a 2-d embedding per pixel and frame, pooled over time (52
  parameters).

Every model returns a dict with ``"emb"`` (``[B, N, 2]`` phase embedding for
binding, unit-ish vectors) or ``"logits"`` (``[B, C]``), and ``"spikes"``
(``[B]`` spike count per sample, zero for non-spiking models). Inputs are
``[B, T, D]``; ``key`` draws the initial membranes and phases.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from kernels_pallas.spiking import ScanConfig, spiking_scan
from lab.methods.s2net import scaffold as sc


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """Time constants shared by the models: LIF leak and threshold, the rhythm's period
    (steps), the phase-estimation window and the Kuramoto delay (steps)."""

    beta: float = 0.9
    threshold: float = 1.0
    period: int = 8
    window: int = 16
    delay: int = 2
    slope: float = 5.0

    @property
    def omega0(self) -> float:
        return 2 * math.pi / self.period

    def scan(self) -> ScanConfig:
        return ScanConfig(beta=self.beta, threshold=self.threshold, omega0=self.omega0,
                          window=self.window, delay=self.delay, slope=self.slope)


class Scaffold(nnx.Variable):
    """A fixed (non-trained) array: an adjacency mask or a grid offset index."""


class GridCoupling(nnx.Module):
    """Couplings on a ``height x width`` grid shared across positions: one weight per
    offset of the ``(2r+1)^2`` neighbourhood; ``__call__`` returns the ``[N, N]`` matrix."""

    def __init__(self, height: int, width: int, radius: int, *, scale: float, rngs: nnx.Rngs):
        n_off = len(sc.grid_offsets(radius))
        self.index = Scaffold(jnp.asarray(sc.grid_offset_index(height, width, radius)))
        self.kernel = nnx.Param(scale * jax.random.normal(rngs.params(), (n_off,)))

    def __call__(self) -> jax.Array:
        idx = self.index[...]
        return jnp.where(idx >= 0, self.kernel[...][jnp.maximum(idx, 0)], 0.0)


class MaskedCoupling(nnx.Module):
    """A trainable ``[N, N]`` matrix restricted to the edges of an adjacency."""

    def __init__(self, adjacency, *, scale: float, rngs: nnx.Rngs):
        adj = jnp.asarray(adjacency, jnp.float32)
        self.mask = Scaffold(adj)
        fan_in = jnp.maximum(adj.sum(0), 1.0)
        self.weight = nnx.Param(scale * jax.random.normal(rngs.params(), adj.shape)
                                / jnp.sqrt(fan_in)[None, :])

    def __call__(self) -> jax.Array:
        return self.weight[...] * self.mask[...]


class ScalarCoupling(nnx.Module):
    """``k * A / in_degree``: one trainable strength on a fixed adjacency."""

    def __init__(self, adjacency, *, init: float):
        adj = jnp.asarray(adjacency, jnp.float32)
        self.mask = Scaffold(adj / jnp.maximum(adj.sum(0), 1.0)[None, :])
        self.strength = nnx.Param(jnp.asarray(init, jnp.float32))

    def __call__(self) -> jax.Array:
        return self.strength[...] * self.mask[...]


def _coupling(scaffold: dict, n: int, *, kind: str, scale: float, rngs: nnx.Rngs):
    """Builds a coupling module from a scaffold spec: ``{"grid": (h, w, r)}`` or
    ``{"adjacency": A}``; ``kind`` in ``"dense"`` (per edge) or ``"scalar"``."""
    if "grid" in scaffold:
        h, w, r = scaffold["grid"]
        if h * w != n:
            raise ValueError(f"grid {h}x{w} has {h * w} cells; expected n_neurons={n}")
        return GridCoupling(h, w, r, scale=scale, rngs=rngs)
    adj = sc.check_adjacency(scaffold["adjacency"], n)
    if kind == "scalar":
        return ScalarCoupling(adj, init=scale)
    return MaskedCoupling(adj, scale=scale, rngs=rngs)


def _initial_state(key, b: int, n: int, threshold: float):
    kv, kp = jax.random.split(key)
    return (jax.random.uniform(kv, (b, n), maxval=threshold),
            jax.random.uniform(kp, (b, n), maxval=2 * math.pi))


class _Encoded(nnx.Module):
    """Inputs ``[B, T, D]`` -> currents ``[T, B, N]``: ``drive`` times a linear encoder,
    or for a grid (``n_in=None``) times the pixel of neuron ``i``. ``drive`` is a fixed
    input scale, not trained: a trainable one lets a spiking network trained on the
    binding loss switch its input off."""

    def _init_io(self, n_in, n, n_out, drive, rngs, readout_in=None):
        self.n = n
        self.encoder = None if n_in is None else nnx.Linear(n_in, n, rngs=rngs)
        self.drive = float(drive)
        self.readout = None if n_out is None else nnx.Linear(readout_in or n, n_out, rngs=rngs)

    def currents(self, inputs: jax.Array) -> jax.Array:
        if inputs.ndim != 3:
            raise ValueError(f"inputs has shape {inputs.shape}; expected [B, T, D]")
        x = jnp.swapaxes(inputs.astype(jnp.float32), 0, 1)
        if self.encoder is None:
            if x.shape[-1] != self.n:
                raise ValueError(f"inputs has {x.shape[-1]} channels; expected one per neuron "
                                 f"({self.n}) for a grid model")
            return self.drive * x
        return self.drive * self.encoder(x)


class S2Net(_Encoded):
    """Spiking-by-synchronisation network (S²-Net) or, with ``sync=False``, the SNN alone.

    Args:
      n_neurons: number of parcels / neurons ``N``.
      scaffold: ``{"grid": (height, width, radius)}`` (pixels, couplings shared per
        offset) or ``{"adjacency": [N, N] array}``.
      n_in: input channels (``None`` on a grid: pixel ``i`` drives neuron ``i``).
      n_out: classes of the rate readout (``None``: phases only, for binding).
      sync: enable the Kuramoto synchronisation and the top-down modulation.
      coupling: ``"dense"`` (a trainable Kuramoto weight per edge or grid offset)
        or ``"scalar"`` (one trainable strength on the scaffold).
    """

    def __init__(self, n_neurons: int, scaffold: dict, *, n_in: int | None = None,
                 n_out: int | None = None, sync: bool = True, coupling: str = "dense",
                 dynamics: Dynamics = Dynamics(), drive: float = 0.2, w_scale: float = 0.05,
                 k_scale: float = 0.05, impl: str | None = None, rngs: nnx.Rngs):
        self._init_io(n_in, n_neurons, n_out, drive, rngs)
        self.dynamics, self.sync, self.impl = dynamics, sync, impl
        self.w = _coupling(scaffold, n_neurons, kind="dense", scale=w_scale, rngs=rngs)
        if sync:
            self.k = _coupling(scaffold, n_neurons, kind=coupling, scale=k_scale, rngs=rngs)
            self.gain_logit = nnx.Param(jnp.asarray(2.0, jnp.float32))  # gain = sigmoid(.) ~ 0.88
            self.omega = nnx.Param(jnp.zeros((), jnp.float32))

    def __call__(self, inputs: jax.Array, *, key: jax.Array) -> dict:
        """Returns ``emb`` [B, N, 2] (softly normalised windowed spike phasor), ``phase``
        [B, N], ``rates`` [B, N], ``spikes`` [B] (count), ``logits`` [B, C] if a readout,
        ``osc_emb`` [B, N, 2] (cos, sin of the final oscillator phases) with ``sync``,
        and ``raw`` (the scan's :class:`ScanOut`)."""
        x = self.currents(inputs)
        t_len, b, n = x.shape
        v0, psi0 = _initial_state(key, b, n, self.dynamics.threshold)
        if self.sync:
            coupling, gain = self.k(), jax.nn.sigmoid(self.gain_logit[...])
            omega = jnp.broadcast_to(self.omega[...], (n,))
        else:
            coupling, gain, omega = jnp.zeros((n, n)), jnp.zeros(()), jnp.zeros((n,))
        out = spiking_scan(x, self.w(), coupling, omega, gain, v0, psi0,
                           config=self.dynamics.scan(), impl=self.impl)
        z = jnp.stack([out.zre[-1], out.zim[-1]], -1)
        rates = out.spikes.mean(0)
        result = {"emb": z * lax.rsqrt((z * z).sum(-1, keepdims=True) + 1.0),
                  "phase": jnp.arctan2(z[..., 1], z[..., 0]), "rates": rates,
                  "spikes": out.spikes.sum((0, 2)), "raw": out}
        if self.sync:  # the top-down oscillators' phases (a training signal, not the readout)
            result["osc_emb"] = jnp.stack([jnp.cos(out.psi[-1]), jnp.sin(out.psi[-1])], -1)
        if self.readout is not None:
            result["logits"] = self.readout(rates)
        return result


def kuramoto_reference(drive, amplitude, coupling, omega, psi0, delay: int):
    """Time-delayed Kuramoto oscillators without spikes (the second baseline).

    ``psi_i <- psi_i + omega + drive_i(t) + sum_j C_ji a_j(t) sin(psi_j(t - delay) - psi_i)``
    with amplitudes ``a`` (zero for an oscillator that is off). ``drive, amplitude``:
    ``[T, B, N]``; returns the phases ``[T, B, N]``. Yeung & Strogatz 1999 (delayed
    Kuramoto); the delayed phases of a silent start are taken as zero amplitude.
    """
    t_len, b, n = drive.shape
    ring0 = jnp.zeros((delay, b, n))

    def body(carry, inp):
        psi, ring_c, ring_s = carry
        t, d_t, a_t = inp
        i = t % delay
        pull_s = jnp.dot(ring_s[i], coupling)
        pull_c = jnp.dot(ring_c[i], coupling)
        psi = psi + omega + d_t + jnp.cos(psi) * pull_s - jnp.sin(psi) * pull_c
        ring_c = ring_c.at[i].set(a_t * jnp.cos(psi))
        ring_s = ring_s.at[i].set(a_t * jnp.sin(psi))
        return (psi, ring_c, ring_s), psi

    _, psis = lax.scan(body, (psi0, ring0, ring0), (jnp.arange(t_len), drive, amplitude))
    return psis


class KuramotoNet(_Encoded):
    """Oscillators without spikes on the same scaffold. On a grid the pixels set the
    amplitudes (an off pixel's oscillator pulls on nobody) and the initial phases are
    random; with an encoder the inputs drive the phase velocities from ``psi = 0`` and
    the readout sees ``mean_t [cos psi, sin psi]``."""

    def __init__(self, n_neurons: int, scaffold: dict, *, n_in: int | None = None,
                 n_out: int | None = None, dynamics: Dynamics = Dynamics(), drive: float = 0.2,
                 k_scale: float = 0.05, rngs: nnx.Rngs):
        self._init_io(n_in, n_neurons, n_out, drive, rngs, readout_in=2 * n_neurons)
        self.dynamics = dynamics
        self.k = _coupling(scaffold, n_neurons, kind="dense", scale=k_scale, rngs=rngs)
        self.omega = nnx.Param(jnp.zeros((), jnp.float32))

    def __call__(self, inputs: jax.Array, *, key: jax.Array) -> dict:
        x = self.currents(inputs)
        t_len, b, n = x.shape
        if self.encoder is None:  # grid: pixels are amplitudes, random initial phases
            _, psi0 = _initial_state(key, b, n, 1.0)
            amp, drive = x, jnp.zeros_like(x)
        else:  # inputs drive the phase velocities from a common start, so that the
            # readout features are a function of the input, not of a random rotation
            psi0 = jnp.zeros((b, n))
            amp, drive = jnp.ones_like(x), x
        psi = kuramoto_reference(drive, amp, self.k(), self.omega[...], psi0,
                                 self.dynamics.delay)
        last = psi[-1]
        result = {"emb": jnp.stack([jnp.cos(last), jnp.sin(last)], -1), "phase": last,
                  "spikes": jnp.zeros((b,))}
        if self.readout is not None:
            feats = jnp.concatenate([jnp.cos(psi).mean(0), jnp.sin(psi).mean(0)], -1)
            result["logits"] = self.readout(feats)
        return result


class RateRNN(_Encoded):
    """The equal-size ANN for sequences: ``h_t = tanh(enc(x_t) + h_{t-1} W)`` with the
    same neurons, scaffold (W masked by it), encoder and readout (of ``mean_t h``)."""

    def __init__(self, n_neurons: int, scaffold: dict, *, n_in: int, n_out: int,
                 w_scale: float = 0.5, rngs: nnx.Rngs):
        self._init_io(n_in, n_neurons, n_out, 1.0, rngs)
        self.w = _coupling(scaffold, n_neurons, kind="dense", scale=w_scale, rngs=rngs)

    def __call__(self, inputs: jax.Array, *, key: jax.Array) -> dict:
        del key
        x = self.currents(inputs)
        w = self.w()

        def body(h, x_t):
            h = jnp.tanh(x_t + h @ w)
            return h, h

        _, hs = lax.scan(body, jnp.zeros(x.shape[1:]), x)
        return {"logits": self.readout(hs.mean(0)), "spikes": jnp.zeros((x.shape[1],))}


class ConvEmbed(nnx.Module):
    """The feed-forward conv baseline for binding: per frame ``x_t``,
    ``e_c(i, t) = tanh(sum_o k_co x_t(i+o) + b_c)``, c in {0, 1}, over the ``(2r+1)^2``
    neighbourhood with its centre, averaged over frames (a per-frame CNN pooled over
    time; on a static image it is the one-frame conv); ``emb`` is the mean normalised
    (its angle plays the phase). 52 parameters at radius 2."""

    def __init__(self, height: int, width: int, radius: int, *, rngs: nnx.Rngs):
        idx = sc.grid_offset_index(height, width, radius)
        n_off = int(idx.max()) + 1
        np.fill_diagonal(idx, n_off)  # the centre gets its own weight
        self.index = Scaffold(jnp.asarray(idx))
        self.kernel = nnx.Param(0.5 * jax.random.normal(rngs.params(), (2, n_off + 1)))
        self.bias = nnx.Param(jnp.zeros((2,)))

    def __call__(self, inputs: jax.Array, *, key: jax.Array) -> dict:
        del key
        x = inputs.astype(jnp.float32)  # [B, T, N]
        idx = self.index[...]
        mats = jnp.where(idx[None] >= 0, self.kernel[...][:, jnp.maximum(idx, 0)], 0.0)
        e = jnp.tanh(jnp.einsum("btj,cji->btic", x, mats) + self.bias[...]).mean(1)
        emb = e * lax.rsqrt((e * e).sum(-1, keepdims=True) + 1e-6)
        return {"emb": emb, "phase": jnp.arctan2(e[..., 1], e[..., 0]),
                "spikes": jnp.zeros((x.shape[0],))}


class ConvRNN(nnx.Module):
    """The equal-size ANN for temporal binding: a recurrent conv net on the grid with a
    two-channel state per pixel (a conventional, non-spiking counterpart of S²-Net)::

        h_i(t) = tanh(u x_i(t) + A h_i(t-1) + sum_o k_o (.) h_{i+o}(t-1) + b)

    ``A`` a 2x2 self-recurrence, ``k_o`` a per-channel weight per offset of the
    ``(2r+1)^2 - 1`` neighbours (shared across positions, as S²-Net's couplings), ``emb``
    the final state normalised. 56 parameters at radius 2 against S²-Net's 50. A rotation
    ``A`` makes ``h`` a leaky resonator whose angle is the input's phase, so the
    architecture can represent the binding solution."""

    def __init__(self, height: int, width: int, radius: int, *, rngs: nnx.Rngs):
        n_off = len(sc.grid_offsets(radius))
        self.index = Scaffold(jnp.asarray(sc.grid_offset_index(height, width, radius)))
        self.u = nnx.Param(jax.random.normal(rngs.params(), (2,)))
        self.a = nnx.Param(0.5 * jax.random.normal(rngs.params(), (2, 2)))
        self.kernel = nnx.Param(0.1 * jax.random.normal(rngs.params(), (2, n_off)))
        self.bias = nnx.Param(jnp.zeros((2,)))

    def __call__(self, inputs: jax.Array, *, key: jax.Array) -> dict:
        del key
        x = jnp.swapaxes(inputs.astype(jnp.float32), 0, 1)  # [T, B, N]
        idx = self.index[...]
        mats = jnp.where(idx[None] >= 0, self.kernel[...][:, jnp.maximum(idx, 0)], 0.0)
        u, a, bias = self.u[...], self.a[...], self.bias[...]

        def body(h, x_t):
            nb = jnp.einsum("bjc,cji->bic", h, mats)
            h = jnp.tanh(x_t[..., None] * u + h @ a + nb + bias)
            return h, None

        h, _ = lax.scan(body, jnp.zeros((*x.shape[1:], 2)), x)
        emb = h * lax.rsqrt((h * h).sum(-1, keepdims=True) + 1e-6)
        return {"emb": emb, "phase": jnp.arctan2(h[..., 1], h[..., 0]),
                "spikes": jnp.zeros((x.shape[1],))}


def n_params(model: nnx.Module) -> int:
    """Number of trainable scalars (``nnx.Param``)."""
    return int(sum(np.size(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
