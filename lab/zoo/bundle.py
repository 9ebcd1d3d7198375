"""Trained modules a method builds for itself (generators, oracles), stored as the zoo's models.

A method whose experiment trains its own frozen models (GPA's sequence generators and
activity oracles) loads them with :func:`load`: ``recipe`` (a JSON dict of everything
that determines the training) is hashed into the key ``<name>-<digest>``; the bundle
comes from the entry shipped with Lab (``lab/zoo/assets/<key>/``), else this host's
cache (``$LAB_CACHE/assets/<key>/``), else ``train()`` runs and its result is cached.
``source=`` / ``$LAB_ZOO`` choose as for the zoo's models (:func:`lab.zoo.resolve_source`),
and every load is recorded in :func:`lab.zoo.loads`.

An entry has the zoo's layout and guarantees (:mod:`lab.zoo.store`: atomic write under a
lock, SHA-256 manifest verified on load): ``params.safetensors`` holds every module's
state (parameters and the other variables, such as an oracle's target scaling; random
number state excluded) in float32, keyed ``<module>/<dotted path>``, so a loaded bundle
is bit for bit the trained one. ``python -m lab.zoo.ship --bundle <key>`` ships a
cached entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import host
from lab.zoo.store import (
    CorruptEntry,
    cache_root,
    entry_keys,
    read_files,
    resolve,
    write_files,
)

BUNDLE_FORMAT = 1
SHIPPED_ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
Modules = dict[str, nnx.Module]


class Bundle(NamedTuple):
    """A loaded bundle: its modules, stored metrics, where it came from (``"shipped"``,
    ``"cached"`` or ``"trained"``) and its key."""

    modules: Modules
    metrics: dict
    source: str
    key: str


# How many times this process trained each bundle key (tests check a cached load does not).
TRAININGS: dict[str, int] = {}


def shipped_root() -> str:
    """Bundles shipped with Lab: :data:`SHIPPED_ASSETS` (``lab/zoo/assets``)."""
    return SHIPPED_ASSETS


def cache_dir() -> str:
    """Bundles trained on this host: ``$LAB_CACHE/assets``."""
    return os.path.join(cache_root(), "assets")


def digest(recipe: dict) -> str:
    """First 12 hex digits of the SHA-256 of ``recipe`` (and the bundle format) as sorted
    JSON; a recipe that is not JSON raises ValueError naming the problem."""
    try:
        text = json.dumps({"format": BUNDLE_FORMAT, "recipe": recipe}, sort_keys=True,
                          separators=(",", ":"))
    except TypeError as e:
        raise ValueError(f"recipe={recipe!r} is not JSON-serialisable: {e}") from None
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def key(name: str, recipe: dict) -> str:
    if not name or "/" in name:
        raise ValueError(f"name={name!r}; expected a non-empty name without '/'")
    return f"{name}-{digest(recipe)}"


def _stored(module: nnx.Module):
    """``(graphdef, state, rest)``: the state is stored; ``rest`` is random-number state,
    which bundles refuse (:func:`flatten`)."""
    return nnx.split(module, nnx.Not(nnx.RngState), ...)


def flatten(modules: Modules) -> dict[str, np.ndarray]:
    """``{"<module>/<dotted path>": array}`` of every module's state; ValueError for a module
    that holds random-number state (``nnx.Rngs``), which a bundle does not store."""
    flat = {}
    for name, m in modules.items():
        graphdef, state, rest = _stored(m)
        if jax.tree_util.tree_leaves(rest):
            raise ValueError(f"bundle module {name!r} holds random-number state (nnx.Rngs); "
                             "expected trained modules without it")
        pure = nnx.to_pure_dict(state)
        for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
            flat[f"{name}/" + ".".join(str(p.key) for p in path)] = np.asarray(leaf)
    return flat


def unflatten(template: Modules, flat: dict[str, np.ndarray], where: str) -> Modules:
    """``template``'s modules with the state ``flat`` holds; every key and shape must match
    (CorruptEntry naming the first that does not)."""
    out, seen = {}, set()
    for name, m in template.items():
        graphdef, state, rest = _stored(m)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
        values = []
        for path, leaf in leaves:
            k = f"{name}/" + ".".join(str(p.key) for p in path)
            if k not in flat:
                raise CorruptEntry(f"{where}: {k} is missing")
            if tuple(flat[k].shape) != tuple(leaf.shape):
                raise CorruptEntry(f"{where}: {k} has shape {tuple(flat[k].shape)}, expected "
                                   f"{tuple(leaf.shape)}")
            values.append(jnp.asarray(flat[k], dtype=leaf.dtype))
            seen.add(k)
        nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, values))
        out[name] = nnx.merge(graphdef, state, rest)
    extra = sorted(set(flat) - seen)
    if extra:
        raise CorruptEntry(f"{where}: unexpected arrays {extra[:3]}")
    return out


def _read(root: str, k: str, recipe: dict, template: Callable[[], Modules]):
    path = os.path.join(root, k)
    flat, metrics = read_files(path, digest(recipe))
    return unflatten(nnx.eval_shape(template), flat, f"bundle {path}"), metrics


def load(name: str, recipe: dict, train: Callable[[], tuple[Modules, dict]],
         template: Callable[[], Modules], *, source: str | None = None) -> Bundle:
    """The :class:`Bundle` (modules, metrics, source, key) of the bundle ``name`` trained
    by ``recipe``: shipped, cached or trained now (``source``: ``"auto"``, ``"shipped"``,
    ``"cache"``, ``"train"``).

    ``train() -> (modules, metrics)`` trains them (its metrics, JSON, are stored; this
    adds ``train_seconds`` and the host); ``template()`` builds untrained modules of the
    same structure (traced under ``nnx.eval_shape``: nothing is initialised). A shipped
    entry that fails its checks is passed over with a warning; a corrupt cache entry is
    moved aside (``<entry>.corrupt-<ms>``) and retrained.
    """
    from lab.zoo import record_resolved, resolve_source

    source, k = resolve_source(source), key(name, recipe)

    def build():
        t0 = time.perf_counter()
        modules, metrics = train()
        metrics = {**metrics, "train_seconds": time.perf_counter() - t0,
                   "host": host.describe()}
        write_files(k, flatten(modules), {"name": name, "recipe": recipe,
                                          "digest": digest(recipe), "format": BUNDLE_FORMAT},
                    metrics, root=cache_dir())
        return modules, metrics

    got = resolve(k, name, source, shipped=shipped_root(), cache=cache_dir(),
                  read=lambda root: _read(root, k, recipe, template), build=build,
                  trainings=TRAININGS, what="bundle",
                  reship=f" (python -m lab.zoo.ship --bundle {k})")
    record_resolved(name, k, got)
    return Bundle(got.obj, got.metrics, got.source, k)


def ship(k: str, *, cache: str | None = None) -> dict:
    """Copies the verified cache entry ``k`` into :func:`shipped_root` (float32, as trained)
    and removes older shipped keys of its name; ``{"key", "status", "bytes"}``."""
    src = os.path.join(cache or cache_dir(), k)
    if not os.path.isdir(src):
        raise ValueError(f"bundle {k!r}: no cache entry under {cache or cache_dir()}; "
                         f"run its experiment first")
    with open(os.path.join(src, "spec.json")) as f:
        spec = json.load(f)
    if not k.endswith(f"-{spec.get('digest')}"):
        raise CorruptEntry(f"bundle {src}: spec digest {spec.get('digest')!r} is not its key's")
    flat, metrics = read_files(src, spec["digest"])
    root, name = shipped_root(), k.rsplit("-", 1)[0]
    final = os.path.join(root, k)
    if os.path.isdir(final):
        status = "unchanged"
    else:
        write_files(k, flat, spec, metrics, root=root)
        status = "shipped"
    for old in entry_keys(root, name):
        if old != k:
            shutil.rmtree(os.path.join(root, old))
    return {"key": k, "status": status,
            "bytes": sum(os.path.getsize(os.path.join(final, f)) for f in os.listdir(final))}
