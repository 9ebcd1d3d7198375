"""Spiking-by-synchronisation dynamics (S²-Net) as a fused scan over time.

One step ``t`` of the network, for a batch row and neurons ``i`` (row-vector
convention: ``weights[j, i]`` and ``coupling[j, i]`` act from neuron ``j`` onto
neuron ``i``):

* top-down modulation: ``m_i = 1 + gain * cos(omega0 * t + psi_i)``;
* leaky integrate-and-fire with soft reset (subtract the threshold one step
  after a spike; the reset is detached from the gradient, Zenke & Vogels 2021)::

      v_i <- beta * v_i + (x_i(t) + sum_j s_j(t-1) W_ji) * m_i - s_i(t-1) * threshold
      s_i(t) = H(v_i - threshold)

  with the SuperSpike fast-sigmoid surrogate ``1 / (1 + slope*|v - threshold|)^2``
  for dH/dv in the backward pass (Zenke & Ganguli 2018);
* bottom-up phase estimate over a finite window of ``window`` steps: the
  spike-triggered phasor ``z_i(t) = sum_{k<window} s_i(t-k) exp(-1j*omega0*(t-k))``
  (kept as a running sum that adds the new spike and drops the one that left
  the window), whose angle is the neuron's firing phase relative to the global
  rhythm ``omega0``;
* top-down time-delayed Kuramoto synchronisation of the oscillator phases
  ``psi`` (in the frame rotating at ``omega0``), driven by the neighbours'
  spike-estimated phases ``delay`` steps ago (``zh = z / sqrt(|z|^2 + 1)``, so a
  silent neuron pulls on nobody)::

      psi_i <- psi_i + omega_i + sum_j C_ji * Im(zh_j(t - delay) * exp(-1j*psi_i))

A neuron that fires at the peak of its modulation has ``angle(z_i) = psi_i``,
which closes the loop: spikes -> phases (bottom-up) -> synchronised phases ->
spike timing (top-down). ``gain = 0`` and ``coupling = 0`` give a plain
recurrent LIF network.

Three parts, as every kernel here: :func:`reference` (``lax.scan``, ring buffers
for the window and the delay, surrogate gradients), :func:`kernel` (a Pallas
kernel with a grid over batch blocks and a ``fori_loop`` over time inside; the
window and the delay read back the kernel's own outputs ``spikes[t - window]``
and ``z[t - delay]``, so no ring buffer is needed) and :func:`spiking_scan`,
which dispatches through :func:`kernels_pallas.dispatch.select`. The Pallas path
is a ``jax.custom_vjp`` whose backward pass is the VJP of the reference
(recomputing the forward in XLA): the forward values are identical, so the
gradient is exactly the reference's surrogate gradient.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import backend, select


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    """Static hyper-parameters of the scan (hashable, so they can key a jit)."""

    beta: float = 0.9
    threshold: float = 1.0
    omega0: float = 2 * 3.141592653589793 / 8
    window: int = 16
    delay: int = 2
    slope: float = 5.0
    block_b: int = 16

    def __post_init__(self):
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta={self.beta} must lie in [0, 1]")
        if self.threshold <= 0:
            raise ValueError(f"threshold={self.threshold} must be positive")
        if self.window < 1 or self.delay < 1:
            raise ValueError(f"window={self.window} and delay={self.delay} must be >= 1 step")
        if self.block_b < 1:
            raise ValueError(f"block_b={self.block_b} must be >= 1")


class ScanOut(NamedTuple):
    """Per-step outputs, each ``[T, B, N]`` float32: spikes (0/1), membrane before the
    threshold test, the windowed spike phasor ``zre + 1j*zim`` and the oscillator phase."""

    spikes: jax.Array
    membrane: jax.Array
    zre: jax.Array
    zim: jax.Array
    psi: jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def spike_fn(x: jax.Array, slope: float) -> jax.Array:
    """Heaviside ``x >= 0`` with the SuperSpike fast-sigmoid surrogate derivative."""
    return (x >= 0).astype(x.dtype)


def _spike_fwd(x, slope):
    return spike_fn(x, slope), x


def _spike_bwd(slope, x, g):
    return (g / (1.0 + slope * jnp.abs(x)) ** 2,)


spike_fn.defvjp(_spike_fwd, _spike_bwd)


def _heaviside(x, slope):
    del slope
    return (x >= 0).astype(x.dtype)


def _step(cfg: ScanConfig, spike, t, x_t, weights, coupling, omega, gain, v, s_prev, zre, zim,
          psi, s_old, zd_re, zd_im):
    """One time step shared by the reference and the kernel; returns the new state."""
    tf = t.astype(jnp.float32)
    mod = 1.0 + gain * jnp.cos(cfg.omega0 * tf + psi)
    rec = jnp.dot(s_prev, weights, preferred_element_type=jnp.float32)
    v = cfg.beta * v + (x_t + rec) * mod - lax.stop_gradient(s_prev) * cfg.threshold
    s = spike(v - cfg.threshold, cfg.slope)
    t_old = tf - cfg.window
    zre = zre + s * jnp.cos(cfg.omega0 * tf) - s_old * jnp.cos(cfg.omega0 * t_old)
    zim = zim - s * jnp.sin(cfg.omega0 * tf) + s_old * jnp.sin(cfg.omega0 * t_old)
    inv = lax.rsqrt(zd_re * zd_re + zd_im * zd_im + 1.0)
    pull_im = jnp.dot(zd_im * inv, coupling, preferred_element_type=jnp.float32)
    pull_re = jnp.dot(zd_re * inv, coupling, preferred_element_type=jnp.float32)
    psi = psi + omega + jnp.cos(psi) * pull_im - jnp.sin(psi) * pull_re
    return v, s, zre, zim, psi


def _check(currents, weights, coupling, omega, gain, v0, psi0):
    if currents.ndim != 3:
        raise ValueError(f"currents has shape {currents.shape}; expected [T, B, N]")
    _, b, n = currents.shape
    for name, arr, shape in (("weights", weights, (n, n)), ("coupling", coupling, (n, n)),
                             ("omega", omega, (n,)), ("v0", v0, (b, n)), ("psi0", psi0, (b, n))):
        if tuple(arr.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(arr.shape)}; expected {shape} "
                             f"for currents of shape {tuple(currents.shape)}")
    if jnp.shape(gain) != ():
        raise ValueError(f"gain has shape {jnp.shape(gain)}; expected a scalar")


def reference(currents, weights, coupling, omega, gain, v0, psi0, *,
              config: ScanConfig = ScanConfig()) -> ScanOut:
    """The S²-Net dynamics with ``lax.scan`` (differentiable through the surrogate).

    Args:
      currents: feed-forward input currents ``[T, B, N]``.
      weights: recurrent synaptic weights ``[N, N]`` (``[pre, post]``).
      coupling: Kuramoto coupling ``[N, N]`` (``[pre, post]``).
      omega: oscillator frequency offsets ``[N]`` (radians per step, rotating frame).
      gain: scalar depth of the top-down modulation (``0`` = no synchronisation).
      v0, psi0: initial membrane and oscillator phase ``[B, N]``.
      config: static hyper-parameters.

    Returns:
      :class:`ScanOut` with ``[T, B, N]`` arrays.
    """
    _check(currents, weights, coupling, omega, gain, v0, psi0)
    t_len, b, n = currents.shape
    f32 = jnp.float32
    zeros = jnp.zeros((b, n), f32)
    carry0 = (v0.astype(f32), zeros, zeros, zeros, psi0.astype(f32),
              jnp.zeros((config.window, b, n), f32), jnp.zeros((config.delay, b, n), f32),
              jnp.zeros((config.delay, b, n), f32))

    def body(carry, inp):
        v, s_prev, zre, zim, psi, s_ring, zr_ring, zi_ring = carry
        t, x_t = inp
        iw, idl = t % config.window, t % config.delay
        v, s, zre, zim, psi = _step(config, spike_fn, t, x_t, weights, coupling, omega, gain, v,
                                    s_prev, zre, zim, psi, s_ring[iw], zr_ring[idl], zi_ring[idl])
        s_ring = s_ring.at[iw].set(s)
        zr_ring, zi_ring = zr_ring.at[idl].set(zre), zi_ring.at[idl].set(zim)
        return (v, s, zre, zim, psi, s_ring, zr_ring, zi_ring), ScanOut(s, v, zre, zim, psi)

    _, out = lax.scan(body, carry0, (jnp.arange(t_len), currents.astype(f32)))
    return out


def _kernel_body(cfg: ScanConfig, t_len, x_ref, w_ref, c_ref, om_ref, g_ref, v0_ref, p0_ref,
                 s_ref, v_ref, zr_ref, zi_ref, psi_ref):
    weights, coupling = w_ref[...], c_ref[...]
    omega, gain = om_ref[...], g_ref[0, 0]
    zeros = jnp.zeros(v0_ref.shape, jnp.float32)

    def body(t, carry):
        v, s_prev, zre, zim, psi = carry
        # Outputs not yet written may hold garbage (interpret mode poisons them
        # with NaN), so select rather than multiply by a 0/1 mask.
        keep_w, keep_d = t >= cfg.window, t >= cfg.delay
        s_old = jnp.where(keep_w, s_ref[jnp.maximum(t - cfg.window, 0)], 0.0)
        zd_re = jnp.where(keep_d, zr_ref[jnp.maximum(t - cfg.delay, 0)], 0.0)
        zd_im = jnp.where(keep_d, zi_ref[jnp.maximum(t - cfg.delay, 0)], 0.0)
        v, s, zre, zim, psi = _step(cfg, _heaviside, t, x_ref[t], weights, coupling, omega, gain,
                                    v, s_prev, zre, zim, psi, s_old, zd_re, zd_im)
        s_ref[t], v_ref[t], zr_ref[t], zi_ref[t], psi_ref[t] = s, v, zre, zim, psi
        return v, s, zre, zim, psi

    lax.fori_loop(0, t_len, body, (v0_ref[...], zeros, zeros, zeros, p0_ref[...]))


def kernel(currents, weights, coupling, omega, gain, v0, psi0, *,
           config: ScanConfig = ScanConfig(), interpret: bool = False) -> ScanOut:
    """The same dynamics as one Pallas kernel: grid over batch blocks, time loop inside.

    Each program holds its ``[T, block_b, N]`` slice of the currents and outputs
    and the full ``[N, N]`` weight and coupling matrices (every neuron may talk
    to every other), so the whole time loop runs without leaving the kernel. The
    batch is zero-padded to a multiple of ``block_b``. Forward only; use
    :func:`spiking_scan` for gradients.
    """
    _check(currents, weights, coupling, omega, gain, v0, psi0)
    t_len, b, n = currents.shape
    bb = min(config.block_b, b)
    pad = (-b) % bb
    f32 = jnp.float32
    x = jnp.pad(currents.astype(f32), ((0, 0), (0, pad), (0, 0)))
    v0p = jnp.pad(v0.astype(f32), ((0, pad), (0, 0)))
    p0p = jnp.pad(psi0.astype(f32), ((0, pad), (0, 0)))
    bp = b + pad
    seq = pl.BlockSpec((t_len, bb, n), lambda i: (0, i, 0))
    row = pl.BlockSpec((bb, n), lambda i: (i, 0))
    full = pl.BlockSpec((n, n), lambda i: (0, 0))
    vec = pl.BlockSpec((1, n), lambda i: (0, 0))
    one = pl.BlockSpec((1, 1), lambda i: (0, 0))
    outs = pl.pallas_call(
        functools.partial(_kernel_body, config, t_len),
        out_shape=[jax.ShapeDtypeStruct((t_len, bp, n), f32)] * 5,
        grid=(bp // bb,),
        in_specs=[seq, full, full, vec, one, row, row],
        out_specs=[seq] * 5,
        interpret=interpret,
    )(x, weights.astype(f32), coupling.astype(f32), omega.astype(f32).reshape(1, n),
      jnp.asarray(gain, f32).reshape(1, 1), v0p, p0p)
    return ScanOut(*(o[:, :b] for o in outs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _pallas_scan(currents, weights, coupling, omega, gain, v0, psi0, config, interpret):
    return kernel(currents, weights, coupling, omega, gain, v0, psi0, config=config,
                  interpret=interpret)


def _pallas_fwd(currents, weights, coupling, omega, gain, v0, psi0, config, interpret):
    out = _pallas_scan(currents, weights, coupling, omega, gain, v0, psi0, config, interpret)
    return out, (currents, weights, coupling, omega, gain, v0, psi0)


def _pallas_bwd(config, interpret, residuals, g):
    del interpret
    _, vjp = jax.vjp(functools.partial(reference, config=config), *residuals)
    return vjp(g)


_pallas_scan.defvjp(_pallas_fwd, _pallas_bwd)


def differentiable_kernel(currents, weights, coupling, omega, gain, v0, psi0, *,
                          config: ScanConfig = ScanConfig(), interpret: bool = False) -> ScanOut:
    """:func:`kernel` with gradients: the backward pass is the VJP of :func:`reference`."""
    return _pallas_scan(currents, weights, coupling, omega, jnp.asarray(gain, jnp.float32), v0,
                        psi0, config, interpret)


def compiled_shapes_ok(t_len: int, batch: int, n: int, block_b: int) -> bool:
    """Whether a compiled (GPU) kernel can take these shapes: block dims that are powers
    of two, and ``dot`` operands of at least 16 rows (Triton's minimum tile)."""
    def pow2(x):
        return x > 0 and x & (x - 1) == 0
    bb = min(block_b, batch)
    return pow2(t_len) and pow2(n) and pow2(bb) and bb >= 16 and n >= 16


def spiking_scan(currents, weights, coupling, omega, gain, v0, psi0, *,
                 config: ScanConfig = ScanConfig(), impl: str | None = None) -> ScanOut:
    """Dispatching entry point: the Pallas kernel (compiled on GPU/TPU, interpreted on
    CPU when ``impl="pallas"``) or the jnp reference; same outputs, same gradients.

    Compiled, the kernel has only been checked in interpret mode here (no accelerator
    was available): an automatic choice on an accelerator falls back to the reference
    when :func:`compiled_shapes_ok` says the shapes cannot tile; an explicit
    ``impl="pallas"`` always runs the kernel."""
    chosen = backend(impl)
    if (impl is None and chosen.is_pallas and not chosen.interpret
            and not compiled_shapes_ok(*currents.shape, config.block_b)):
        impl = "xla"
    fn, _ = select(differentiable_kernel, reference, impl)
    return fn(currents, weights, coupling, omega, jnp.asarray(gain, jnp.float32), v0, psi0,
              config=config)
