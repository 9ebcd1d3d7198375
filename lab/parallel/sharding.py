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

With ``strict=True`` (what :class:`lab.train.Trainer` uses for rules the user
passes) a rule's axis that does not divide its dimension is a ValueError
instead of a replication. ``fsdp=True`` also splits each parameter's largest
remaining dimension that ``"data"`` divides over ``"data"`` (ZeRO-3 / FSDP:
Rajbhandari et al. 2020, "ZeRO", stage 3; the ``fsdp`` axis of maxtext): each
device holds ``1 / (data * model)`` of the parameters and of the optimizer state,
and GSPMD all-gathers a weight where the forward needs it whole and
reduce-scatters its gradient. :func:`tree_specs` applies the same rules to any
pytree whose leaf paths end in a parameter's path, so an optax state
(``0/mu/layers/0/attn/qkv/kernel``) is laid out like the parameters it mirrors.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
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
             head_dim: int | None = None, fsdp: bool = False, strict: bool = False) -> P:
    """The PartitionSpec of one parameter: the first matching rule, made to fit ``shape``.

    Each mesh axis named by the rule is kept only where it divides the
    dimension (in whole heads of ``head_dim`` for attention projections) and
    has more than one device; otherwise that dimension is replicated, or, with
    ``strict``, a ValueError names the axis, the dimension and both sizes.
    With ``fsdp`` the largest dimension left unsharded that the ``"data"`` axis
    divides is split over ``"data"`` as well (none: the parameter stays as it is).
    """
    spec = next((s for pattern, s in rules if re.search(pattern, path)), P())
    if len(spec) > len(shape):
        raise ValueError(f"rule {spec} for {path!r} has more entries than its shape {shape}")
    unit = head_dim if head_dim and _HEAD_PARAMS.search(path) else 1
    fitted = []
    for i, (axis, dim) in enumerate(zip(spec, shape, strict=False)):
        names = (axis,) if isinstance(axis, str) else tuple(axis or ())
        size = 1
        for name in names:
            size *= mesh.shape[name]
        fits = size > 1 and dim % unit == 0 and (dim // unit) % size == 0
        if strict and size > 1 and not fits:
            what = f"{dim} = {dim // unit} heads of {unit}" if unit > 1 else f"{dim}"
            raise ValueError(f"mesh axis {axis!r} (size {size}) does not divide dimension {i} "
                             f"of {path} (size {what}); expected a mesh whose {axis!r} axis "
                             "divides it, or a rule that does not shard it")
        fitted.append(axis if fits else None)  # size-1 axes dropped: replicated either way
    data = dict(mesh.shape).get("data", 1)
    if fsdp and data > 1:
        fitted += [None] * (len(shape) - len(fitted))
        free = [i for i, (a, d) in enumerate(zip(fitted, shape, strict=True))
                if a is None and d % data == 0]
        if free:
            fitted[max(free, key=lambda i: (shape[i], -i))] = "data"
        while fitted and fitted[-1] is None:
            fitted.pop()
    return P(*fitted)


def _shape(x) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def tree_specs(tree: Any, mesh: Mesh, rules=RULES, *, head_dim: int | None = None,
               fsdp: bool = False, strict: bool = False) -> Any:
    """A pytree like ``tree`` whose leaves are the PartitionSpecs :func:`spec_for` gives them.

    The leaf paths are matched against ``rules`` (which end in ``$``-anchored
    parameter names), so the parameters and the optimizer state that mirrors
    them get the same layout; scalars (a step count) are replicated.
    """
    return jax.tree_util.tree_map_with_path(
        lambda p, x: spec_for(path_str(p), _shape(x), mesh, rules, head_dim=head_dim,
                              fsdp=fsdp, strict=strict), tree)


def partition_specs(model: nnx.Module, mesh: Mesh, rules=RULES, *, fsdp: bool = False,
                    strict: bool = False) -> nnx.State:
    """An ``nnx.State`` like ``nnx.state(model)`` whose leaves are PartitionSpecs."""
    head_dim = getattr(getattr(model, "config", None), "head_dim", None)
    return tree_specs(nnx.state(model), mesh, rules, head_dim=head_dim, fsdp=fsdp,
                      strict=strict)


def named(specs: Any, mesh: Mesh) -> Any:
    """PartitionSpecs -> ``NamedSharding`` on ``mesh`` (same tree)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, P))


def place(tree: Any, shardings: Any) -> Any:
    """Puts every array of ``tree`` on its sharding (a tree of the same structure).

    In one process this is ``jax.device_put``. With several processes, whose
    shardings span devices of other hosts, every process must pass the same
    global values (a deterministic batch or model init): each builds its own
    shards from them (``jax.make_array_from_callback``).
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def put(x, sharding):
        if isinstance(x, jax.Array) and x.is_fully_addressable is False:
            return jax.device_put(x, sharding)
        if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(x))
            out = jax.make_array_from_callback(data.shape, sharding, lambda i: data[i])
            return jax.random.wrap_key_data(out, impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

    return jax.tree.map(put, tree, shardings)


def batch_specs(batch: Any, mesh: Mesh, *, name: str = "batch") -> Any:
    """PartitionSpecs splitting every leaf's leading (batch) axis over ``"data"``.

    Scalars are replicated. Raises ValueError naming the leaf, the axis and both
    sizes when the ``data`` axis does not divide a leaf's batch dimension.
    """
    n = mesh.shape["data"]

    def spec(path, x):
        shape = _shape(x)
        if not shape:
            return P()
        if shape[0] % n:
            leaf = jax.tree_util.keystr(path) or name
            raise ValueError(f"mesh axis 'data' (size {n}) does not divide the batch "
                             f"dimension of {leaf} (size {shape[0]}); expected a batch that is "
                             f"a multiple of {n}")
        return P("data", *([None] * (len(shape) - 1)))

    return jax.tree_util.tree_map_with_path(spec, batch)


def shard_model(model: nnx.Module, mesh: Mesh, rules=RULES, *, fsdp: bool = False,
                strict: bool = False) -> nnx.Module:
    """Places ``model``'s state on ``mesh`` by ``rules`` (in place) and returns the model."""
    shardings = named(partition_specs(model, mesh, rules, fsdp=fsdp, strict=strict), mesh)
    nnx.update(model, place(nnx.state(model), shardings))
    return model


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Places every array of ``batch`` (a pytree) with its leading (batch) axis on ``"data"``.

    Scalars are replicated. Raises ValueError naming the leaf when its batch size
    is not a multiple of the ``data`` axis. ``batch`` is the global batch; with
    several processes each passes the same global batch (:func:`place`).
    """
    batch = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), batch)
    return place(batch, named(batch_specs(batch, mesh), mesh))


def mesh_of(tree: Any) -> Mesh | None:
    """The mesh of the first ``NamedSharding`` leaf of ``tree`` (e.g. a sharded model's
    state), or None when no leaf is placed on one."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
            return sharding.mesh
    return None


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
