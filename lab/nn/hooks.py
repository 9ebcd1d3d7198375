"""Component hooks of a :class:`~lab.nn.Transformer` for attribution methods (integrated
gradients over components, integrated policy gradients): scaling MLP neurons, and editing
the residual stream after a block (e.g. scaling a sparse autoencoder's features,
:class:`lab.nn.FeatureScale`).

Two equivalent ways: ``Transformer.__call__(..., neuron_scale=s)`` multiplies each
layer's neuron activations by ``s[i]`` in the forward (any broadcast to ``[B, T, F]``,
differentiable); :func:`scale_neurons` folds a fixed per-neuron scale ``[L, F]`` into the
down projection's rows (``down(h * s) = h @ (diag(s) W)``), which returns an ordinary
model, so every :mod:`lab.infer` entry point (``generate``, ``prefill``, ``score``) runs
under the scaled components unchanged.

:func:`edit_residual` attaches a module ``x -> x`` after chosen blocks of a copy of the
model (:attr:`lab.nn.Block.edit`); the block applies it in every path, so the forward,
its captures, its gradients and every :mod:`lab.infer` entry point run the edited model.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def edit_residual(model: Transformer, edits: Mapping[int, nnx.Module]) -> Transformer:
    """A copy of ``model`` in which block ``i``'s output residual stream ``x [B, T, D]``
    is replaced by ``edits[i](x)``, for each ``i`` in ``edits`` (the other blocks keep
    theirs); the original is untouched. An edit that returns ``x`` leaves every number
    as it was. The edits' own state (e.g. a scale held in an ``nnx.Variable``) travels
    with the copy through ``nnx.split``, so a jitted entry point compiles once for
    every value of it."""
    n = model.config.n_layers
    bad = [i for i in edits if not (isinstance(i, (int, np.integer)) and 0 <= i < n)]
    if bad:
        raise ValueError(f"edits name unknown layers {bad}; expected block indices in "
                         f"[0, {n})")
    for i, e in edits.items():
        if not callable(e):
            raise ValueError(f"edits[{i}] is {type(e).__name__}; expected a module x -> x")
    graphdef, state = nnx.split(model)
    new = nnx.merge(graphdef, state)
    for i, e in edits.items():
        new.layers[int(i)].edit = nnx.data(e)  # a module where the block held None
    return new
