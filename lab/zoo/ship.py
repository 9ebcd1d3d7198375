"""Writes the zoo entries that ship with Lab (``lab/zoo/weights``) from trained cache entries.

    python -m lab.zoo.ship lm-xs-long lm-xs-docs [--cache_dir DIR] [--force]

For each named model, the cache entry of its current key (trained by ``zoo.load``) is
verified, then stored in the most compact float type whose held-out exact match
stays within :data:`TOLERANCE` examples per task of the float32 model's (float16,
else float32), beside its spec, its ``metrics.json`` and a SHA-256 manifest.
``metrics.json`` gains a ``"shipped"`` block: the stored dtype, the float32 model's
held-out result, the host that shipped it, and a small check set (the first
:data:`CHECK_PER_TASK` held-out rows of each task, by their index in
:func:`lab.zoo.train.held_out_pool`) with the shipped model's exact match on it, which
the tests re-measure. ``held_out`` becomes the shipped (rounded) model's result, and so
does ``regime`` for a reasoning model (:mod:`lab.zoo.reasoning`; the float32 model's
stays as ``shipped["regime_float32"]``).

An entry already shipped under the same key is left as it is (a rerun changes no
file, so the repository's history only grows when a recipe changes) unless
``--force``; a shipped entry of the same name and another key (an older recipe) is
removed.

A VLM of :mod:`lab.zoo.vlm` (``python -m lab.zoo.ship vlm-xs``) ships as trained
(float32, :func:`ship_vlm`), its ``metrics.json`` gaining the same ``"shipped"`` block
with a check set: the first :data:`CHECK_PER_TASK` held-out videos of each question type
and as many images, with the shipped model's chosen option on each, which the tests
re-measure.

    python -m lab.zoo.ship --bundle gpa-assets-<digest>

ships a method's bundle of trained modules (:mod:`lab.zoo.bundle`) from the cache to
``lab/zoo/assets`` as trained (float32), after verifying its checksums.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
from absl import app, flags, logging
from flax import nnx

from lab import host
from lab.data import ByteTokenizer
from lab.zoo import bundle, vlm
from lab.zoo.evaluate import evaluate
from lab.zoo.spec import NAMED, ZOO_FORMAT, ZooSpec
from lab.zoo.store import (
    entry_keys,
    flatten_params,
    model_from_flat,
    read_entry,
    read_files,
    shipped_dir,
    write_entry,
    write_files,
    zoo_dir,
)
from lab.zoo.train import build_data, held_out_pool, per_task_indices

COMPACT = ("float16",)  # tried in order; float32 when none keeps the held-out metrics
TOLERANCE = 2  # held-out examples per task a compact dtype may change (of n_eval, 64 today)
CHECK_PER_TASK = 8


def rounded(model: nnx.Module, spec: ZooSpec, dtype: str) -> nnx.Module:
    """``model`` with every parameter rounded to ``dtype`` (and held in float32 again), which
    is what loading an entry stored in ``dtype`` gives."""
    flat = {k: v.astype(dtype) for k, v in flatten_params(model).items()}
    return model_from_flat(spec.model, flat)


def within(result: dict, reference: dict, tolerance: int = TOLERANCE) -> bool:
    """Whether every task's exact match in ``result`` is within ``tolerance`` examples of
    ``reference``'s (two :func:`lab.zoo.evaluate.evaluate` results)."""
    return all(abs(result[t]["exact_match"] - r["exact_match"]) * r["n"] <= tolerance + 1e-9
               for t, r in reference.items() if t != "all")


def check_rows(spec: ZooSpec):
    """``(indices, dataset, held_out, train_prompts)``: the first :data:`CHECK_PER_TASK`
    held-out rows of each task, by their index in :func:`lab.zoo.train.held_out_pool` (so a
    test rebuilds them without the training set), the whole held-out set and the training
    prompts."""
    train, _, held_out = build_data(spec)
    prompts = set(train["prompt"])
    pool = held_out_pool(spec)
    idx = per_task_indices(pool, spec.data["n_eval"], exclude=prompts)
    first = per_task_indices(held_out, CHECK_PER_TASK)
    indices = [idx[i] for i in first]
    return indices, pool.select(indices), held_out, prompts


def ship(name: str, *, cache_dir: str | None = None, force: bool = False,
         trained_here: bool = False) -> dict:
    """Ships the cache entry of ``name``'s current key; returns ``{"name", "key", "status"``
    (``"shipped"`` or ``"unchanged"``), ``"dtype"``, ``"bytes"}``. ``trained_here``: an entry
    whose metrics predate the host record was trained on this host (checked by retraining
    it here bit for bit): record this host as its training host."""
    if name not in NAMED:
        raise ValueError(f"zoo model {name!r} is unknown; expected one of {sorted(NAMED)}")
    spec = NAMED[name]
    key, root = spec.key, shipped_dir()
    final = os.path.join(root, key)
    if os.path.isdir(final) and not force:
        return {"name": name, "key": key, "status": "unchanged", "bytes": _bytes(final)}
    try:
        model, metrics = read_entry(key, spec.model, spec.digest(), root=cache_dir or zoo_dir())
    except FileNotFoundError:
        raise ValueError(f"{name}: no cache entry {key} under {cache_dir or zoo_dir()}; train "
                         f"it first (zoo.load({name!r}, source='cache'))") from None
    tok = ByteTokenizer()
    indices, check, held_out, train_prompts = check_rows(spec)
    reference = evaluate(model, held_out, tok, spec.seq_len)
    dtype, result = "float32", reference
    for candidate in COMPACT:
        m = rounded(model, spec, candidate)
        if not all(np.isfinite(v).all() for v in flatten_params(m).values()):
            continue
        r = evaluate(m, held_out, tok, spec.seq_len)
        logging.info("ship %s: %s held-out %s against float32 %s", name, candidate,
                     {t: v["exact_match"] for t, v in r.items()},
                     {t: v["exact_match"] for t, v in reference.items()})
        if within(r, reference):
            dtype, result, model = candidate, r, m
            break
    checked = evaluate(model, check, tok, spec.seq_len)
    shipped = {"dtype": dtype, "tolerance_examples": TOLERANCE, "held_out_float32": reference,
               "shipped_on": host.describe(),
               "check": {"per_task": CHECK_PER_TASK, "pool_indices": indices,
                         "exact_match": {t: v["exact_match"] for t, v in checked.items()},
                         "token_accuracy": {t: v["token_accuracy"] for t, v in checked.items()}}}
    if "host" not in metrics and trained_here:  # entries trained before the host was recorded
        metrics = {**metrics, "host": host.describe()}
        shipped["host_of_training"] = "recorded at shipping: retrained here bit for bit"
    elif "host" not in metrics:
        shipped["host_of_training"] = "not recorded; shipped_on is the host that shipped it"
    metrics = {**metrics, "held_out": result, "shipped": shipped}
    if spec.regime is not None:  # the regime of the model as shipped (rounded), not float32's
        from lab.zoo.reasoning import spec_regime

        shipped["regime_float32"] = metrics.get("regime")
        metrics["regime"] = spec_regime(spec, model, train_prompts, tok)
    write_entry(key, model, {"spec": spec.to_dict(), "digest": spec.digest(),
                             "format": ZOO_FORMAT}, metrics, root=root, dtype=dtype)
    for old in entry_keys(root, name):
        if old != key:
            shutil.rmtree(os.path.join(root, old))
    return {"name": name, "key": key, "status": "shipped", "dtype": dtype,
            "bytes": _bytes(final)}


def vlm_check(spec: vlm.VLMSpec) -> dict:
    """The check set of a shipped VLM: ``{"videos": indices of the held-out videos,
    "images": indices of the held-out images}``, the first :data:`CHECK_PER_TASK` of each
    question type (and as many images)."""
    videos, images = vlm.held_out(spec)
    types = np.asarray(videos["question_type"])
    idx = sorted(int(i) for t in dict.fromkeys(types.tolist())
                 for i in np.flatnonzero(types == t)[:CHECK_PER_TASK])
    return {"videos": idx,
            "images": list(range(min(CHECK_PER_TASK, len(images)))) if images else []}


def vlm_choices(model, spec: vlm.VLMSpec, check: dict) -> dict:
    """The option ``model`` chooses on each row of ``check`` (:func:`vlm_check`):
    ``{"videos": [...], "images": [...]}``."""
    videos, images = vlm.held_out(spec)
    out = {}
    for part, ds in (("videos", videos), ("images", images)):
        if not check[part]:
            out[part] = []
            continue
        rows = ds.select(check[part])
        post = vlm.posteriors(model, vlm.render_rows(rows), rows["question"], rows["options"],
                              tokenizer=spec.tokenizer)
        out[part] = [int(i) for i in post.argmax(-1)]
    return out


def ship_vlm(name: str, *, cache_dir: str | None = None, force: bool = False) -> dict:
    """Ships the cache entry of the VLM ``name``'s current key as trained (float32), with
    its check set's choices; ``{"name", "key", "status", "dtype", "bytes"}``."""
    if name not in vlm.NAMED:
        raise ValueError(f"VLM zoo model {name!r} is unknown; expected one of "
                         f"{sorted(vlm.NAMED)}")
    spec = vlm.NAMED[name]
    key, root = spec.key, shipped_dir()
    final = os.path.join(root, key)
    if os.path.isdir(final) and not force:
        return {"name": name, "key": key, "status": "unchanged", "bytes": _bytes(final)}
    src = os.path.join(cache_dir or zoo_dir(), key)
    try:
        flat, metrics = read_files(src, spec.digest())
    except FileNotFoundError:
        raise ValueError(f"{name}: no cache entry {key} under {cache_dir or zoo_dir()}; train "
                         f"it first (zoo.load({name!r}, source='cache'))") from None
    model = vlm.model_from_flat(spec.model, flat, f"zoo entry {src}")
    check = vlm_check(spec)
    metrics = {**metrics, "shipped": {"dtype": "float32", "shipped_on": host.describe(),
                                      "check": {**check, "per_task": CHECK_PER_TASK,
                                                "choices": vlm_choices(model, spec, check)}}}
    write_files(key, flat, {"spec": spec.to_dict(), "digest": spec.digest(),
                            "format": vlm.VLM_FORMAT}, metrics, root=root)
    for old in entry_keys(root, name):
        if old != key:
            shutil.rmtree(os.path.join(root, old))
    return {"name": name, "key": key, "status": "shipped", "dtype": "float32",
            "bytes": _bytes(final)}


def _bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Zoo cache to ship from (default "
                                 "$LAB_CACHE/zoo).")
_BUNDLES = flags.DEFINE_list(
    "bundle", [], "Cache keys of method bundles to ship as trained (lab.zoo.bundle), e.g. "
    "the gpa-assets-<digest> an experiment's report names.")
_FORCE = flags.DEFINE_bool("force", False, "Rewrite an entry already shipped under its key.")
_TRAINED_HERE = flags.DEFINE_bool(
    "trained_here", False, "Record this host as the training host of entries whose metrics "
    "predate the host record (only after retraining them here bit for bit).")


def main(argv):
    names = argv[1:]
    if not names and not _BUNDLES.value:
        sys.exit(f"usage: python -m lab.zoo.ship [--bundle KEY,...] NAME [NAME ...]; names: "
                 f"{sorted({**NAMED, **vlm.NAMED})}")
    for k in _BUNDLES.value:
        r = bundle.ship(k)
        print(f"{r['key']}: {r['status']} (float32, {r['bytes'] / 1e6:.2f} MB)")
    for name in names:
        if name in vlm.NAMED:
            r = ship_vlm(name, cache_dir=_CACHE_DIR.value, force=_FORCE.value)
        else:
            r = ship(name, cache_dir=_CACHE_DIR.value, force=_FORCE.value,
                     trained_here=_TRAINED_HERE.value)
        print(f"{r['name']}: {r['status']} {r['key']} ({r.get('dtype', 'as before')}, "
              f"{r['bytes'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    app.run(main)
