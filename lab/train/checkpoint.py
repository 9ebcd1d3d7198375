"""Checkpoints of a training run: one orbax save holds the whole state of the run.

:class:`RunCheckpoints` wraps ``orbax.checkpoint.CheckpointManager`` (flax
``examples/gemma/train.py``, maxtext ``common/checkpointing.py``): every save
writes, under ``<dir>/<step>/``, an item ``state`` (model parameters and other
model state, optimizer state, RNG key data) and an item ``meta`` (JSON: the
step, the train config, a signature of the state's tree, a SHA-256 digest of
its bytes). Orbax writes into a temporary directory and renames it when the save
is complete, so a killed run never leaves a half-written step behind; leftover
temporary directories are removed when the manager opens.

Sharded state (a :class:`lab.train.Trainer` on a mesh) is saved by orbax one
shard per device, each process writing its own; the digest is of the global
arrays, so it does not depend on the layout. :meth:`RunCheckpoints.restore_latest`
restores onto the shardings of its ``target``, which may belong to another mesh
shape than the one that saved (orbax reads each new shard's slice).

On restore the newest step is tried first; a step that fails to restore or
whose bytes do not match the digest is reported (``absl.logging.warning``
naming its path), moved aside to ``<dir>_corrupt/<step>`` and the previous step
is tried. A checkpoint written for a different model or optimizer (its tree
signature differs) raises ValueError instead: that is a user error, not damage.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _unwrap_keys(tree):
    """Typed PRNG key arrays (e.g. an ``nnx.Rngs`` stream) -> their uint32 key data."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _rewrap_keys(tree, like):
    return jax.tree.map(
        lambda x, ref: jax.random.wrap_key_data(x, impl=jax.random.key_impl(ref))
        if _is_key(ref) else x, tree, like)


def tree_signature(tree) -> list[list]:
    """Returns ``[[path, shape, dtype], ...]`` for the leaves of ``tree`` (JSON-able)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [[jax.tree_util.keystr(path), list(np.shape(x)), str(x.dtype)] for path, x in leaves]


def tree_digest(tree) -> str:
    """Returns the SHA-256 hex digest of the bytes of every leaf, in tree order."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:  # other hosts' shards
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        leaf = jax.device_get(leaf)
        arr = np.ascontiguousarray(np.asarray(leaf))
        h.update(str((arr.shape, arr.dtype.str)).encode())
        h.update(arr.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()


class RunCheckpoints:
    """Keep-last-N atomic checkpoints of a run in ``directory``.

    Args:
      directory: where the steps go (created if missing).
      keep: ``max_to_keep``.
    """

    def __init__(self, directory: str, keep: int):
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False,
            cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Saves ``state`` (a pytree of arrays) and ``meta`` (JSON) as ``step``; blocks."""
        state = _unwrap_keys(state)
        meta = dict(meta, step=int(step), signature=tree_signature(state),
                    digest=tree_digest(state))
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def restore_latest(self, target: Any) -> tuple[int, Any, dict] | None:
        """Restores the newest intact step into the structure of ``target``.

        Args:
          target: a pytree with the saved state's structure (arrays or
            ``jax.ShapeDtypeStruct``); its shapes and dtypes are checked against the
            saved signature and the arrays are restored onto its shardings.

        Returns:
          ``(step, state, meta)``, or None when no intact checkpoint exists.

        Raises:
          ValueError: a checkpoint's tree signature differs from ``target``'s.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _unwrap_keys(target))
        want = tree_signature(abstract)
        for step in reversed(self.steps()):
            path = os.path.join(self.directory, str(step))
            try:
                meta = self.manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
                if not isinstance(meta, dict) or "signature" not in meta:
                    raise ValueError("its meta item has no signature")
            except Exception as e:  # noqa: BLE001 - any failure to read is damage
                self._set_aside(step, path, e)
                continue
            if meta["signature"] != want:
                raise ValueError(_mismatch(path, meta["signature"], want))
            try:
                state = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract)))["state"]
                digest = tree_digest(state)
                if digest != meta.get("digest"):
                    raise ValueError(f"its arrays' SHA-256 {digest[:12]} differs from the "
                                     f"saved digest {str(meta.get('digest'))[:12]}")
            except Exception as e:  # noqa: BLE001
                self._set_aside(step, path, e)
                continue
            return step, _rewrap_keys(state, target), meta
        return None

    def _set_aside(self, step: int, path: str, error: Exception) -> None:
        aside = os.path.join(self.directory + "_corrupt", f"{step}-{int(time.time())}")
        logging.warning("Checkpoint %s is corrupt and is skipped (%s: %s); moved to %s; "
                        "falling back to the previous checkpoint.", path, type(error).__name__,
                        str(error)[:300], aside)
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        shutil.move(path, aside)
        self.manager.reload()

    def close(self) -> None:
        self.manager.close()


def _mismatch(path: str, got: list, want: list) -> str:
    got_d = {p: (s, d) for p, s, d in got}
    want_d = {p: (s, d) for p, s, d in want}
    for p in sorted(set(got_d) | set(want_d)):
        if got_d.get(p) != want_d.get(p):
            return (f"checkpoint {path} was written for a different model or optimizer: "
                    f"{p} is {got_d.get(p)} there and {want_d.get(p)} here (shape, dtype); "
                    "use another workdir or the matching model")
    return f"checkpoint {path} has a different tree structure than this trainer's state"
