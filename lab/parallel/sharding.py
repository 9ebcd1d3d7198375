"""Partition rules for :class:`lab.nn.Transformer` and sharded forward / generation.

Rules are ``(regex, PartitionSpec)`` pairs matched against a parameter's path
(``"layers/3/attn/qkv/kernel"``), first match wins, unmatched parameters are
replicated: the regex-rule style of big_vision / EasyLM and maxtext's logical
axis rules, applied to NNX state with ``jax.device_put`` and
``NamedSharding`` (flax ``guides/flax_gspmd``). NNX ``Linear`` kernels are
``[in, out]``, so Megatron tensor parallelism is: q/k/v and gate/up split their
output (heads, FFN hidden) over ``"model"``, o and down split their input,
embeddings and the LM head split the vocabulary, norms are replicated.
The fused q/k/v kernel ``[D, Hkv, G + 2, hd]`` splits its KV-head axis, so each
device holds whole KV groups (their queries, key and value); gate/up
``[D, 2, F]`` splits ``F``, keeping each gate column beside its up column.

A dimension that the mesh axis does not divide is replicated instead; for the
output projection the unit is a whole head (``head_dim`` rows), so a head is
never split across devices (with 2 KV heads on a model axis of 4, q/k/v are
replicated while o is split, as maxtext replicates KV heads).
The compiler inserts the collectives (GSPMD), so sharded results equal
unsharded ones up to float reassociation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lab.nn import Transformer

RULES: tuple[tuple[str, P], ...] = (
    (r"(^|/)embed/embedding$", P("model", None)),     # [V, D]: vocabulary
    (r"attn/qkv/kernel$", P(None, "model")),          # [D, Hkv, G+2, hd]: KV heads
    (r"attn/qkv/bias$", P("model")),                  # [Hkv, G+2, hd]
    (r"attn/o/kernel$", P("model", None)),            # [H*hd, D]: heads
    (r"mlp/gate_up/kernel$", P(None, None, "model")),  # [D, 2, F]: FFN hidden
    (r"mlp/down/kernel$", P("model", None)),          # [F, D]
    (r"(^|/)lm_head/kernel$", P(None, "model")),      # [D, V]: vocabulary
    (r"norm/weight$", P()),                           # RMSNorm scales: replicated
)
_HEAD_PARAMS = re.compile(r"attn/o/kernel$")


def path_str(path: Sequence[Any]) -> str:
    """``"layers/0/attn/qkv/kernel"`` for a key path of an NNX state (the Variable's ``value`` key
    dropped)."""
    keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]
    if keys and keys[-1] == "value":
        keys = keys[:-1]
    return "/".join(str(k) for k in keys)


def spec_for(path: str, shape: Sequence[int], mesh: Mesh, rules=RULES, *,
             head_dim: int | None = None) -> P:
    """The PartitionSpec of one parameter: the first matching rule, made to fit ``shape``.

    Each mesh axis named by the rule is kept only where it divides the
    dimension (in whole heads of ``head_dim`` for attention projections) and
    has more than one device; otherwise that dimension is replicated.
    """
    spec = next((s for pattern, s in rules if re.search(pattern, path)), P())
    if len(spec) > len(shape):
        raise ValueError(f"rule {spec} for {path!r} has more entries than its shape {shape}")
    unit = head_dim if head_dim and _HEAD_PARAMS.search(path) else 1
    fitted = []
    for axis, dim in zip(spec, shape, strict=False):
        names = (axis,) if isinstance(axis, str) else tuple(axis or ())
        size = 1
        for name in names:
            size *= mesh.shape[name]
        fits = size > 1 and dim % unit == 0 and (dim // unit) % size == 0
        fitted.append(axis if fits else None)  # size-1 axes dropped: replicated either way
    return P(*fitted)


def partition_specs(model: nnx.Module, mesh: Mesh, rules=RULES) -> nnx.State:
    """An ``nnx.State`` like ``nnx.state(model)`` whose leaves are PartitionSpecs."""
    head_dim = getattr(getattr(model, "config", None), "head_dim", None)
    state = nnx.state(model)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: spec_for(path_str(p), x.shape, mesh, rules, head_dim=head_dim), state)


def shard_model(model: nnx.Module, mesh: Mesh, rules=RULES) -> nnx.Module:
    """Places ``model``'s state on ``mesh`` by ``rules`` (in place) and returns the model."""
    specs = partition_specs(model, mesh, rules)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    nnx.update(model, jax.device_put(nnx.state(model), shardings))
    return model


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Places every array of ``batch`` (a pytree) with its leading (batch) axis on ``"data"``.

    Scalars are replicated. Raises ValueError naming the leaf when its batch size
    is not a multiple of the ``data`` axis. ``batch`` is the global batch; on
    many hosts, where each process holds only its own rows, build the arrays
    with ``jax.make_array_from_process_local_data`` instead.
    """
    n = mesh.shape["data"]

    def put(path, x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            return jax.device_put(x, NamedSharding(mesh, P()))
        if x.shape[0] % n:
            name = jax.tree_util.keystr(path) or "batch"
            raise ValueError(f"{name} has batch size {x.shape[0]}, not a multiple of the mesh's "
                             f"data axis ({n})")
        return jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (x.ndim - 1)))))

    return jax.tree_util.tree_map_with_path(put, batch)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, mask):
    return nnx.merge(graphdef, state)(tokens, mask=mask)


def forward(model: Transformer, tokens, mesh: Mesh, *, mask=None) -> jax.Array:
    """Logits ``[B, T, V]`` of a (sharded) model on a batch sharded over ``"data"``.

    ``model`` should have been placed with :func:`shard_model`; ``tokens``
    (and the optional ``[B, T]`` validity ``mask``) are placed by :func:`shard_batch`.
    The logits come back sharded over ``"data"`` (batch) and, through the LM
    head, ``"model"`` (vocabulary).
    """
    tokens, mask = shard_batch((tokens, mask), mesh)
    graphdef, state = nnx.split(model)
    return _forward(graphdef, state, tokens, mask)
