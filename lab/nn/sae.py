"""A sparse autoencoder (SAE) on a Transformer's residual stream, and the residual-stream
edit that scales its features.

The SAE follows Bricken et al. 2023 ("Towards Monosemanticity", Anthropic): one ReLU
layer with a pre-encoder bias shared with the decoder,

    f(x) = relu((x - b_dec) W_enc + b_enc),    x_hat = f(x) W_dec + b_dec,

trained with Adam on ``mean ||x - x_hat||^2 / D + l1 * mean sum_j f_j`` on activations
normalised to mean squared norm ``D`` (``scale`` below), the decoder's rows renormalised
to unit norm after each step so the L1 penalty cannot be dodged by shrinking ``f``.

:class:`FeatureScale` multiplies feature ``j``'s contribution by ``s_j`` and keeps the
SAE's reconstruction error, ``x + sum_j (s_j - 1) f_j(x) d_j`` (the error term left in
place, as Marks et al. 2024, "Sparse Feature Circuits", keep their SAE error nodes): at
``s = 1`` it returns ``x`` exactly, at ``s_j = 0`` it removes feature ``j``. Attached
after a block by :func:`lab.nn.edit_residual`, it runs in every path of the model
(forward, prefill, the decode loop of :mod:`lab.infer`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class SparseAutoencoder(nnx.Module):
    """``d_model -> n_features -> d_model``; see the module docstring. ``scale``: the
    factor the inputs are multiplied by before encoding (and the output divided by), so
    that ``l1`` means the same for any activation norm (set by :func:`fit_sae`)."""

    def __init__(self, d_model: int, n_features: int, *, rngs: nnx.Rngs):
        if not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"d_model={d_model!r}; expected an int >= 1")
        if not isinstance(n_features, int) or n_features < 1:
            raise ValueError(f"n_features={n_features!r}; expected an int >= 1")
        w = jax.random.normal(rngs.params(), (n_features, d_model), jnp.float32)
        w = w / jnp.linalg.norm(w, axis=1, keepdims=True)
        self.w_dec = nnx.Param(w)                       # [F, D], unit rows
        self.w_enc = nnx.Param(w.T)                     # [D, F], tied at init
        self.b_enc = nnx.Param(jnp.zeros((n_features,), jnp.float32))
        self.b_dec = nnx.Param(jnp.zeros((d_model,), jnp.float32))
        self.scale = nnx.Variable(jnp.ones((), jnp.float32))
        self.d_model, self.n_features = d_model, n_features

    def encode(self, x: jax.Array) -> jax.Array:
        """Feature activations ``[..., F]`` (float32) of residual vectors ``x [..., D]``."""
        x = x.astype(jnp.float32) * self.scale[...]
        return jax.nn.relu((x - self.b_dec[...]) @ self.w_enc[...] + self.b_enc[...])

    def decode(self, f: jax.Array) -> jax.Array:
        """The reconstruction ``[..., D]`` (in the input's units) of features ``f``."""
        return (f @ self.w_dec[...] + self.b_dec[...]) / self.scale[...]

    def directions(self) -> jax.Array:
        """``[F, D]``: what one unit of each feature adds to the residual stream."""
        return self.w_dec[...] / self.scale[...]

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(reconstruction [..., D], features [..., F])``."""
        f = self.encode(x)
        return self.decode(f), f


class FeatureScale(nnx.Module):
    """The residual-stream edit ``x -> x + ((s - 1) * f(x) + shift) @ directions``:
    feature ``j`` scaled by ``s_j`` (and moved by ``shift_j``), the reconstruction error
    kept. ``scale`` and ``shift``: ``[F]``, or anything that broadcasts to the features
    ``[B, T, F]``: a per-position scale's gradient is ``f * d metric / d f``, a
    per-position shift's (at 0) is ``d metric / d f`` itself, also where ``f = 0``.
    ``shift=None``: no shift."""

    def __init__(self, sae: SparseAutoencoder, scale, shift=None):
        self.sae = sae
        self.scale = nnx.Variable(jnp.asarray(scale, jnp.float32))
        self.shift = None if shift is None else nnx.Variable(jnp.asarray(shift, jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        f = self.sae.encode(x)
        change = (self.scale[...] - 1.0) * f
        if self.shift is not None:
            change = change + self.shift[...]
        return x + (change @ self.sae.directions()).astype(x.dtype)


def sae_stats(sae: SparseAutoencoder, acts) -> dict:
    """On held-out activations ``acts [N, D]``: ``fve`` (fraction of variance explained
    by the reconstruction), ``l0`` (mean number of active features per vector) and
    ``dead`` (share of features active on none of them)."""
    x = jnp.asarray(acts, jnp.float32)
    rec, f = sae(x)
    resid = jnp.sum((x - rec) ** 2)
    total = jnp.sum((x - x.mean(axis=0)) ** 2)
    active = f > 0
    return {"fve": float(1.0 - resid / total), "l0": float(active.sum(axis=1).mean()),
            "dead": float(1.0 - active.any(axis=0).mean())}


def fit_sae(acts, n_features: int, *, l1: float = 3e-2, steps: int = 2000,
            batch: int = 256, learning_rate: float = 1e-3, seed: int = 0
            ) -> SparseAutoencoder:
    """Trains a :class:`SparseAutoencoder` on residual vectors ``acts [N, D]`` (Adam,
    minibatches drawn with replacement; see the module docstring); returns it."""
    acts = np.asarray(acts, np.float32)
    if acts.ndim != 2 or acts.shape[0] < 2:
        raise ValueError(f"acts has shape {acts.shape}; expected [N >= 2, d_model] residual "
                         "vectors")
    if not np.all(np.isfinite(acts)):
        raise ValueError("acts contains NaN or inf; expected finite activations")
    if not l1 >= 0:
        raise ValueError(f"l1={l1!r}; expected >= 0")
    for name, v in (("steps", steps), ("batch", batch)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}; expected an int >= 1")
    d = acts.shape[1]
    sae = SparseAutoencoder(d, n_features, rngs=nnx.Rngs(seed))
    scale = float(np.sqrt(d / np.mean(np.sum(acts ** 2, axis=1))))
    sae.scale[...] = jnp.float32(scale)
    sae.b_dec[...] = jnp.asarray(acts.mean(axis=0) * scale)
    opt = nnx.Optimizer(sae, optax.adam(learning_rate), wrt=nnx.Param)

    @nnx.jit
    def step(sae, opt, x):
        def loss_fn(m):
            f = m.encode(x)
            rec = f @ m.w_dec[...] + m.b_dec[...]
            return jnp.mean(jnp.sum((x * m.scale[...] - rec) ** 2, axis=1)) / d \
                + l1 * jnp.mean(jnp.sum(f, axis=1))
        loss, grads = nnx.value_and_grad(loss_fn)(sae)
        opt.update(sae, grads)
        w = sae.w_dec[...]
        sae.w_dec[...] = w / jnp.maximum(jnp.linalg.norm(w, axis=1, keepdims=True), 1e-8)
        return loss

    rng = np.random.default_rng([seed, 31])
    data = jnp.asarray(acts)
    for _ in range(steps):
        step(sae, opt, data[rng.integers(0, acts.shape[0], batch)])
    return sae
