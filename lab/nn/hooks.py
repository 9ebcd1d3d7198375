"""Scaling MLP neurons of a :class:`~lab.nn.Transformer`: the component hooks of
attribution methods (integrated gradients over components, integrated policy gradients).

Two equivalent ways: ``Transformer.__call__(..., neuron_scale=s)`` multiplies each
layer's neuron activations by ``s[i]`` in the forward (any broadcast to ``[B, T, F]``,
differentiable); :func:`scale_neurons` folds a fixed per-neuron scale ``[L, F]`` into the
down projection's rows (``down(h * s) = h @ (diag(s) W)``), which returns an ordinary
model, so every :mod:`lab.infer` entry point (``generate``, ``prefill``, ``score``) runs
under the scaled components unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.nn.transformer import Transformer


def check_neuron_scale(model: Transformer, scale) -> None:
    """Raises ValueError unless ``scale`` has shape ``[L, F]`` of ``model`` (concrete values
    are also checked to be finite)."""
    c = model.config
    shape = tuple(np.shape(scale))
    if shape != (c.n_layers, c.d_ff):
        raise ValueError(f"neuron_scale has shape {shape}; expected [n_layers, d_ff] = "
                         f"[{c.n_layers}, {c.d_ff}]")
    try:
        arr = np.asarray(scale)
    except Exception:  # a tracer: checked by shape only
        return
    if not np.all(np.isfinite(arr)):
        raise ValueError("neuron_scale contains NaN or inf; expected finite factors")


def _out_proj(block):
    return block.mlp.down if hasattr(block.mlp, "down") else block.mlp.fc2


def scale_neurons(model: Transformer, scale) -> Transformer:
    """A copy of ``model`` whose MLP neuron ``j`` of layer ``i`` is scaled by
    ``scale[i, j]`` (``[L, F]``), folded into the down projection (``fc2`` of a GELU
    MLP); the original is untouched. Equals ``model(..., neuron_scale=scale[:, None,
    None])`` up to float rounding; all ones returns the same numbers exactly."""
    check_neuron_scale(model, scale)
    graphdef, state = nnx.split(model)
    new = nnx.merge(graphdef, state)  # a copy sharing no Variables with model
    scale = jnp.asarray(scale)
    for i, block in enumerate(new.layers):
        proj = _out_proj(block)
        k = proj.kernel[...]
        proj.kernel = nnx.Param(k * scale[i].astype(k.dtype)[:, None])
    return new
