"""The zoo's entries on disk: one directory per spec, written atomically, checked on load.

Entries live in two roots with one layout: the shipped weights inside the package
(``lab/zoo/weights/<name>-<digest>/``, :func:`shipped_dir`, read-only) and the
cache of models trained on this host (``$LAB_CACHE/zoo/<name>-<digest>/``,
:func:`zoo_dir`; ``LAB_CACHE`` defaults to ``~/.cache/lab``). An entry holds:

- ``params.safetensors``: the model's ``nnx.Param`` arrays, keyed by their
  dotted path (``layers.0.attn.qkv.kernel``), in float32 or (shipped entries whose
  held-out metrics allow it) a compact float type, cast back on load;
- ``spec.json``: the :class:`ZooSpec` and its digest;
- ``metrics.json``: train / held-out accuracy per task, training time;
- ``manifest.json``: the SHA-256 of every other file, written last.

An entry is built in a temporary sibling directory and renamed into place
(``os.rename`` of a directory is atomic on POSIX), under an exclusive
``fcntl`` lock per entry, so concurrent processes neither corrupt it nor train
it twice. A partial training run lives in ``.work-<key>`` and resumes after a
kill (the trainer's checkpoints). On load every checksum, key and shape is
verified; a mismatch raises :class:`CorruptEntry`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, MutableMapping
from typing import Any, NamedTuple

import jax
import numpy as np
from absl import logging
from flax import nnx
from safetensors.numpy import load_file, save_file

from lab.nn import Transformer, TransformerConfig, fuse_qkv

PARAMS_FILE, SPEC_FILE, METRICS_FILE, MANIFEST_FILE = (
    "params.safetensors", "spec.json", "metrics.json", "manifest.json")


class CorruptEntry(ValueError):
    """A cache entry that exists but cannot be trusted (names the entry and the problem)."""


def cache_root() -> str:
    """``$LAB_CACHE`` if set, else ``~/.cache/lab``."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LAB_CACHE") or "~/.cache/lab"))


def zoo_dir() -> str:
    """The cache's entries: ``$LAB_CACHE/zoo``."""
    return os.path.join(cache_root(), "zoo")


SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


def shipped_dir() -> str:
    """The entries shipped with Lab: :data:`SHIPPED_DIR`, ``lab/zoo/weights`` inside the
    package (tests point it elsewhere)."""
    return SHIPPED_DIR


def entry_keys(root: str, name: str | None = None) -> list[str]:
    """Entry directories (``<name>-<digest>``) under ``root``, of model ``name`` if given;
    temporary, corrupt and work directories are not entries."""
    if not os.path.isdir(root):
        return []
    keys = []
    for key in sorted(os.listdir(root)):
        if key.startswith(".") or ".corrupt-" in key or ".old-" in key or not os.path.isdir(
                os.path.join(root, key)):
            continue
        if name is None or key.rsplit("-", 1)[0] == name:
            keys.append(key)
    return keys


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def entry_lock(key: str, root: str | None = None):
    """Exclusive lock on the entry ``key`` under ``root`` (default :func:`zoo_dir`; blocks
    until the holder releases it)."""
    root = root or zoo_dir()
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{key}.lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def flatten_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """``{"layers.0.attn.qkv.kernel": array, ...}`` of the model's ``nnx.Param`` values."""
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
        flat[".".join(str(p.key) for p in path)] = np.asarray(leaf)
    return flat


def abstract_model(config: TransformerConfig) -> nnx.Module:
    return nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))


def fuse_unfused(config: TransformerConfig, flat: dict[str, np.ndarray]) -> dict:
    """Entries written before q/k/v and gate/up were fused (``attn.q.kernel``, ...,
    ``mlp.gate.kernel``, ``mlp.up.kernel``) in today's layout (``attn.qkv.kernel``,
    ``mlp.gate_up.kernel``); other dicts pass through unchanged."""
    if "layers.0.attn.q.kernel" not in flat:
        return flat
    out = dict(flat)
    for i in range(config.n_layers):
        a, m = f"layers.{i}.attn.", f"layers.{i}.mlp."
        q, k, v = (out.pop(f"{a}{n}.kernel") for n in "qkv")
        out[f"{a}qkv.kernel"] = np.asarray(fuse_qkv(q, k, v, config=config))
        if f"{a}q.bias" in out:
            q, k, v = (out.pop(f"{a}{n}.bias")[None] for n in "qkv")
            out[f"{a}qkv.bias"] = np.asarray(fuse_qkv(q, k, v, config=config))[0]
        out[f"{m}gate_up.kernel"] = np.stack([out.pop(f"{m}gate.kernel"),
                                              out.pop(f"{m}up.kernel")], axis=1)
    return out


def model_from_flat(config: TransformerConfig, flat: dict[str, np.ndarray],
                    where: str = "params") -> nnx.Module:
    """Builds a Transformer with ``flat`` as its parameters; every key and shape must match.

    Raises CorruptEntry naming the first missing/unexpected key or wrong shape.
    """
    flat = fuse_unfused(config, flat)
    graphdef, state, rest = nnx.split(abstract_model(config), nnx.Param, ...)
    pure = nnx.to_pure_dict(state)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(pure)
    expected = {".".join(str(p.key) for p in path): leaf for path, leaf in leaves}
    missing = sorted(set(expected) - set(flat))
    extra = sorted(set(flat) - set(expected))
    if missing or extra:
        raise CorruptEntry(f"{where}: parameters missing {missing[:3]}, unexpected {extra[:3]}")
    values = []
    for name, leaf in expected.items():
        arr = flat[name]
        if tuple(arr.shape) != tuple(leaf.shape):
            raise CorruptEntry(f"{where}: parameter {name} has shape {tuple(arr.shape)}, "
                               f"expected {tuple(leaf.shape)}")
        values.append(jax.numpy.asarray(arr, dtype=leaf.dtype))
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, values))
    return nnx.merge(graphdef, state, rest)


def write_entry(key: str, model: nnx.Module, spec_dict: dict, metrics: dict, *,
                root: str | None = None, dtype=None) -> str:
    """Writes the entry atomically (temp dir + rename) under ``root`` (default the cache,
    :func:`zoo_dir`), replacing an existing one; returns its path. ``dtype``: the stored
    float type of the parameters (default their own)."""
    flat = flatten_params(model)
    if dtype is not None:
        flat = {k: v.astype(dtype) for k, v in flat.items()}
    return write_files(key, flat, spec_dict, metrics, root=root or zoo_dir())


def write_files(key: str, flat: dict[str, np.ndarray], spec_dict: dict, metrics: dict, *,
                root: str) -> str:
    """Writes the entry ``root/key`` (``flat`` arrays as safetensors, the spec, the metrics
    and their manifest) atomically: built in a temporary sibling and renamed into place,
    replacing an existing one. Returns its path."""
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, key)
    tmp = tempfile.mkdtemp(dir=root, prefix=f".tmp-{key}-")
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would hide a shared cache from other users
        save_file(flat, os.path.join(tmp, PARAMS_FILE))
        for fname, obj in ((SPEC_FILE, spec_dict), (METRICS_FILE, metrics)):
            with open(os.path.join(tmp, fname), "w") as f:
                json.dump(obj, f, indent=1, sort_keys=True)
        manifest = {fname: _sha256(os.path.join(tmp, fname))
                    for fname in (PARAMS_FILE, SPEC_FILE, METRICS_FILE)}
        with open(os.path.join(tmp, MANIFEST_FILE), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        for fname in os.listdir(tmp):
            os.chmod(os.path.join(tmp, fname), 0o644)
            with open(os.path.join(tmp, fname), "rb") as f:
                os.fsync(f.fileno())
        old = None
        if os.path.exists(final):  # a corrupt entry, or one being retrained (we hold the lock)
            old = f"{final}.old-{int(time.time() * 1000)}"
            os.rename(final, old)
        os.rename(tmp, final)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def quarantine(path: str) -> str:
    """Moves a bad entry aside to ``<path>.corrupt-<time>`` (kept for inspection)."""
    dest = f"{path}.corrupt-{int(time.time() * 1000)}"
    os.rename(path, dest)
    return dest


class Resolved(NamedTuple):
    """What :func:`resolve` found: the object, its stored metrics, where it came from
    (``"shipped"``, ``"cached"`` or ``"trained"``), the entry's path, and the notes on
    entries passed over."""

    obj: Any
    metrics: dict
    source: str
    path: str
    notes: list[str]


def resolve(key: str, name: str, source: str, *, shipped: str, cache: str,
            read: Callable[[str], tuple[Any, dict]], build: Callable[[], tuple[Any, dict]],
            trainings: MutableMapping[str, int], what: str = "entry", reship: str = "",
            on_corrupt: str = "retrain") -> Resolved:
    """The one rule by which the zoo's stores (named models, VLMs, method bundles) find
    the entry ``key`` of model ``name``: shipped, cached or trained now.

    ``source`` (already resolved): ``"auto"`` and ``"shipped"`` try ``shipped/key`` first;
    a shipped entry of another key (its recipe changed; ``reship`` is appended to that
    note) or one that fails its checks is noted, logged and passed over, and
    ``"shipped"`` then raises ValueError. Next the cache ``cache/key`` (``"train"``
    reads it only for what this process trained itself, counted in ``trainings``); else
    ``build()`` trains, writes ``cache/key`` and returns ``(obj, metrics)``, under the
    entry's lock so that concurrent processes train it once. A corrupt cache entry is
    moved aside and rebuilt, or (``on_corrupt="raise"``) raises :class:`CorruptEntry`.
    ``read(root) -> (obj, metrics)`` raises FileNotFoundError when ``root`` has no such
    entry and CorruptEntry when it cannot be trusted.
    """
    notes: list[str] = []
    if source in ("auto", "shipped"):
        keys = entry_keys(shipped, name)
        if key in keys:
            try:
                obj, metrics = read(shipped)
                return Resolved(obj, metrics, "shipped", os.path.join(shipped, key), notes)
            except CorruptEntry as e:
                notes.append(f"the shipped entry cannot be trusted: {e}")
        elif keys:
            notes.append(f"the shipped {name} is {', '.join(keys)}, trained by another recipe "
                         f"than {key}'s{reship}")
        if notes:
            logging.warning("zoo: %s; using the cache or training instead", notes[-1])
        if source == "shipped":
            raise ValueError(f"source='shipped' but Lab ships no usable {what} {key} "
                             f"({'; '.join(notes) or 'none of that name'}); shipped: "
                             f"{entry_keys(shipped)}")
    path = os.path.join(cache, key)

    def cached() -> Resolved:
        obj, metrics = read(cache)
        return Resolved(obj, metrics, "trained" if trainings.get(key) else "cached", path,
                        notes)

    use_cache = source != "train" or bool(trainings.get(key))
    if use_cache:  # without the lock: a read-only cache still serves what it holds
        try:
            return cached()
        except FileNotFoundError:
            pass
        except CorruptEntry:
            if on_corrupt == "raise":
                raise
    with entry_lock(key, cache):
        if use_cache or trainings.get(key):  # another process may have built it meanwhile
            try:
                return cached()
            except FileNotFoundError:
                pass
            except CorruptEntry as e:
                if on_corrupt == "raise":
                    raise
                logging.warning("zoo: %s; moved it to %s and retraining", e, quarantine(path))
        obj, metrics = build()
        trainings[key] = trainings.get(key, 0) + 1
    return Resolved(obj, metrics, "trained", path, notes)


def read_entry(key: str, config: TransformerConfig, digest: str,
               root: str | None = None) -> tuple[nnx.Module, dict]:
    """Loads and verifies the entry ``key`` under ``root`` (default the cache,
    :func:`zoo_dir`); returns ``(model, metrics)``.

    Raises FileNotFoundError when there is no entry, CorruptEntry when one
    exists but a file is missing, fails its checksum, or does not match
    ``config`` / ``digest``.
    """
    path = os.path.join(root or zoo_dir(), key)
    flat, metrics = read_files(path, digest)
    return model_from_flat(config, flat, where=f"zoo entry {path}"), metrics


def read_files(path: str, digest: str) -> tuple[dict[str, np.ndarray], dict]:
    """``(flat arrays, metrics)`` of the entry at ``path``, verified: every file against the
    manifest's SHA-256 and the stored spec's digest against ``digest``.

    Raises FileNotFoundError when there is no entry, CorruptEntry when a file is missing,
    fails its checksum, or the digest differs.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(path)
    manifest_path = os.path.join(path, MANIFEST_FILE)
    if not os.path.exists(manifest_path):
        raise CorruptEntry(f"zoo entry {path} has no {MANIFEST_FILE} (interrupted write?)")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptEntry(f"zoo entry {path}: {MANIFEST_FILE} is not valid JSON ({e})") from e
    for fname in (PARAMS_FILE, SPEC_FILE, METRICS_FILE):
        fpath = os.path.join(path, fname)
        if not os.path.exists(fpath):
            raise CorruptEntry(f"zoo entry {path}: {fname} is missing")
        if manifest.get(fname) != _sha256(fpath):
            raise CorruptEntry(f"zoo entry {path}: {fname} fails its SHA-256 checksum")
    with open(os.path.join(path, SPEC_FILE)) as f:
        stored = json.load(f)
    if stored.get("digest") != digest:
        raise CorruptEntry(f"zoo entry {path}: spec digest {stored.get('digest')!r} != "
                           f"{digest!r}")
    with open(os.path.join(path, METRICS_FILE)) as f:
        metrics = json.load(f)
    return load_file(os.path.join(path, PARAMS_FILE)), metrics
