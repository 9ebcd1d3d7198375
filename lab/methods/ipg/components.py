"""The component types IPG and its baselines attribute to, each a grid of scales
``[rows, units]`` on one hook of :mod:`lab.nn`:

- :class:`Neurons`: every MLP neuron, ``[n_layers, d_ff]`` (``neuron_scale`` in the
  forward; :func:`lab.nn.scale_neurons` folded into the weights for :mod:`lab.infer`);
- :class:`SAEFeatures`: the features of one sparse autoencoder per chosen layer on the
  residual stream after that block, ``[len(layers), n_features]``
  (:class:`lab.nn.FeatureScale` attached by :func:`lab.nn.edit_residual`, which every
  path of the model runs).

Both are NNX modules so that a jitted function can take ``nnx.split((model, space))``
and merge them back: the SAEs' weights travel as state, the choice of type as the graph.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.nn import (
    FeatureScale,
    SparseAutoencoder,
    Transformer,
    edit_residual,
    scale_neurons,
)


class Neurons(nnx.Module):
    """Every MLP neuron of the model; component ``(layer, neuron)``."""

    kind = "neuron"
    additive = False   # no shift hook: attribution patching reads dM/ds / a

    def shape(self, model: Transformer) -> tuple[int, int]:
        return model.config.n_layers, model.config.d_ff

    def scaled(self, model: Transformer, scale) -> Transformer:
        """A copy of ``model`` under the scale ``[L, F]`` (for :mod:`lab.infer`)."""
        return scale_neurons(model, scale)

    def forward(self, model: Transformer, tokens, scale, shift=None) -> jax.Array:
        """Logits ``[B, T, V]`` under ``scale`` ``[L, F]`` or per position ``[L, B, T, F]``
        (differentiable in it)."""
        if shift is not None:
            raise ValueError("Neurons take no shift; only a scale")
        s = jnp.asarray(scale)
        return model(tokens, neuron_scale=s[:, None, None, :] if s.ndim == 2 else s)

    def activations(self, model: Transformer, tokens) -> jax.Array:
        """``[L, B, T, F]``: the neurons' activations on ``tokens``."""
        _, inter = model(tokens, capture=("mlp",))
        return inter.mlp


class SAEFeatures(nnx.Module):
    """The features of ``saes[layer]`` on the residual stream after block ``layer``;
    component ``(r, j)``: feature ``j`` of the ``r``-th layer in ascending order
    (:attr:`layers`). Every SAE has the same number of features."""

    kind = "sae_feature"
    additive = True    # FeatureScale takes a shift: attribution patching reads dM/df

    def __init__(self, saes: Mapping[int, SparseAutoencoder]):
        if not saes:
            raise ValueError("saes is empty; expected {layer: SparseAutoencoder}")
        widths = {int(s.n_features) for s in saes.values()}
        if len(widths) != 1:
            raise ValueError(f"saes have n_features {sorted(widths)}; expected one width")
        self.layers = tuple(sorted(int(i) for i in saes))
        self.saes = nnx.List([saes[i] for i in self.layers])

    def shape(self, model: Transformer) -> tuple[int, int]:
        n = model.config.n_layers
        bad = [i for i in self.layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"SAEFeatures name layers {bad}; the model has {n} blocks")
        if self.saes[0].d_model != model.config.d_model:
            raise ValueError(f"the SAEs read d_model={self.saes[0].d_model}; the model has "
                             f"{model.config.d_model}")
        return len(self.layers), int(self.saes[0].n_features)

    def scaled(self, model: Transformer, scale, shift=None) -> Transformer:
        """A copy of ``model`` with each SAE's features scaled by ``scale[r]`` (``[R, F]``
        or ``[R, B, T, F]``) and moved by ``shift[r]``."""
        return edit_residual(model, {
            layer: FeatureScale(sae, scale[r], None if shift is None else shift[r])
            for r, (layer, sae) in enumerate(zip(self.layers, self.saes, strict=True))})

    def forward(self, model: Transformer, tokens, scale, shift=None) -> jax.Array:
        """Logits ``[B, T, V]`` under ``scale`` (``[R, F]`` or ``[R, B, T, F]``) and
        ``shift`` (differentiable in both)."""
        return self.scaled(model, jnp.asarray(scale), shift)(tokens)

    def activations(self, model: Transformer, tokens) -> jax.Array:
        """``[R, B, T, F]``: each SAE's features on the model's residual stream."""
        _, inter = model(tokens, capture=("hidden",))
        return jnp.stack([sae.encode(inter.hidden[layer + 1])
                          for layer, sae in zip(self.layers, self.saes, strict=True)])


NEURONS = Neurons()


def split(model: Transformer, space: nnx.Module | None):
    """``nnx.split((model, space))`` (``space`` None: :class:`Neurons`), for the jitted
    functions of this package, which merge them back."""
    return nnx.split((model, NEURONS if space is None else space))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _residual_jit(graphdef, state, tokens, layer):
    _, inter = nnx.merge(graphdef, state)(tokens, capture=("hidden",))
    return inter.hidden[layer + 1]


def residual_stream(model: Transformer, tokens, layer: int) -> np.ndarray:
    """``[B, T, D]``: the residual stream after block ``layer`` on ``tokens [B, T]`` (what
    an SAE of :class:`SAEFeatures` at that layer reads)."""
    if not 0 <= layer < model.config.n_layers:
        raise ValueError(f"layer={layer!r}; expected a block index in "
                         f"[0, {model.config.n_layers})")
    return np.asarray(_residual_jit(*nnx.split(model), jnp.asarray(tokens, jnp.int32),
                                    int(layer)))
