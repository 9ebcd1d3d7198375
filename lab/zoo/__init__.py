"""Named small LMs that Lab trains on its synthetic tasks on first use and caches.

``zoo.load("lm-s") -> (model, tokenizer)``; ``zoo.list()`` names them;
``zoo.load_spec(ZooSpec(...))`` trains and caches a method's own model
(``zoo.spec_from_config`` builds one from a launcher's ``config.zoo`` block);
``zoo.load_model(name_or_dir)`` takes a zoo name or a Hugging Face checkpoint directory.
Entries live under ``$LAB_CACHE/zoo`` (default ``~/.cache/lab/zoo``), keyed
by ``<name>-<digest of the spec>`` (:mod:`lab.zoo.spec`, :mod:`lab.zoo.store`).
"""

from __future__ import annotations

import collections
import json
import os
import shutil

from absl import logging

from lab.data import ByteTokenizer
from lab.zoo.evaluate import evaluate
from lab.zoo.spec import NAMED, ZOO_FORMAT, ZooSpec, byte_lm, spec_from_config, train_recipe
from lab.zoo.store import (
    METRICS_FILE,
    CorruptEntry,
    cache_root,
    entry_lock,
    quarantine,
    read_entry,
    write_entry,
    zoo_dir,
)

# How many times this process trained each entry (tests check that a cached load does not).
TRAININGS: collections.Counter = collections.Counter()
ON_CORRUPT = ("retrain", "raise")


def list() -> dict[str, str]:  # noqa: A001 - the issue's name, ``zoo.list()``
    """``{name: description}`` of the named models."""
    return {name: spec.description for name, spec in NAMED.items()}


def get_spec(name: str) -> ZooSpec:
    if name not in NAMED:
        raise ValueError(f"zoo model {name!r} is unknown; expected one of {sorted(NAMED)}")
    return NAMED[name]


def entry_path(spec: ZooSpec | str) -> str:
    """The cache directory of a spec (or named model), whether or not it exists yet."""
    spec = get_spec(spec) if isinstance(spec, str) else spec
    return os.path.join(zoo_dir(), spec.key)


def _read(spec: ZooSpec):
    model, metrics = read_entry(spec.key, spec.model, spec.digest())
    return model, metrics


def load_spec(spec: ZooSpec, *, on_corrupt: str = "retrain", progress: bool = True):
    """Returns ``(model, tokenizer)`` for ``spec``, training and caching it if needed.

    A cached entry is verified (checksums, parameter names and shapes, digest)
    before use. ``on_corrupt="retrain"`` moves a corrupt entry aside
    (``<entry>.corrupt-<ms>``) and retrains; ``"raise"`` raises
    :class:`CorruptEntry` naming the entry and the problem.
    """
    from lab.zoo.train import train_model  # lab.train is only needed to train

    if not isinstance(spec, ZooSpec):
        raise ValueError(f"load_spec expects a ZooSpec, got {type(spec).__name__}")
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={on_corrupt!r}; expected one of {ON_CORRUPT}")
    key = spec.key
    try:
        return _read(spec)[0], ByteTokenizer()
    except FileNotFoundError:
        pass
    except CorruptEntry:
        if on_corrupt == "raise":
            raise
    with entry_lock(key):
        try:  # another process may have finished it while we waited
            return _read(spec)[0], ByteTokenizer()
        except FileNotFoundError:
            pass
        except CorruptEntry as e:
            if on_corrupt == "raise":
                raise
            moved = quarantine(entry_path(spec))
            logging.warning("zoo: %s; moved it to %s and retraining", e, moved)
        init = load_base(spec, on_corrupt=on_corrupt, progress=progress)
        workdir = os.path.join(zoo_dir(), f".work-{key}")
        model, metrics = train_model(spec, workdir, progress=progress, init=init)
        TRAININGS[key] += 1
        write_entry(key, model, {"spec": spec.to_dict(), "digest": spec.digest(),
                                 "format": ZOO_FORMAT}, metrics)
        shutil.rmtree(workdir, ignore_errors=True)
    return model, ByteTokenizer()


def load_base(spec: ZooSpec, *, on_corrupt: str = "retrain", progress: bool = True):
    """The trained model of ``spec.init`` (loaded, or trained and cached first), whose weights
    start ``spec``'s training; None for a spec without a base."""
    base = spec.base()
    return load_spec(base, on_corrupt=on_corrupt, progress=progress)[0] if base else None


def load(name: str, *, on_corrupt: str = "retrain", progress: bool = True):
    """``(model, tokenizer)`` of the named model (``zoo.list()``), trained on first use."""
    return load_spec(get_spec(name), on_corrupt=on_corrupt, progress=progress)


def is_checkpoint_dir(path) -> bool:
    """Whether ``path`` is a directory with a ``config.json`` (a Hugging Face checkpoint)."""
    return isinstance(path, (str, os.PathLike)) and os.path.isfile(
        os.path.join(path, "config.json"))


def load_model(name_or_dir: str | os.PathLike, *, dtype=None, progress: bool = True):
    """``(model, tokenizer)`` of a zoo name (:func:`load`, trained on first use) or of a
    Hugging Face checkpoint directory (``config.json`` + safetensors:
    :func:`lab.hf.load_pretrained` with ``dtype``, and :func:`lab.hf.load_tokenizer`).

    A zoo name wins over a directory of the same name. Anything else raises ValueError
    naming the argument and the zoo's names.
    """
    if isinstance(name_or_dir, str) and name_or_dir in NAMED:
        return load(name_or_dir, progress=progress)
    if is_checkpoint_dir(name_or_dir):
        from lab import hf  # only real checkpoints need the tokenizers package

        return hf.load_pretrained(name_or_dir, dtype=dtype), hf.load_tokenizer(name_or_dir)
    what = ("a directory without config.json" if isinstance(name_or_dir, (str, os.PathLike))
            and os.path.isdir(name_or_dir) else "not a zoo name nor a directory")
    raise ValueError(f"model {name_or_dir!r} is {what}; expected a zoo model, one of "
                     f"{sorted(NAMED)}, or a Hugging Face checkpoint directory (config.json + "
                     "model.safetensors)")


def metrics(spec: ZooSpec | str) -> dict:
    """The stored ``metrics.json`` of a trained entry (train / held-out accuracy per task)."""
    path = os.path.join(entry_path(spec), METRICS_FILE)
    if not os.path.exists(path):
        raise ValueError(f"{spec if isinstance(spec, str) else spec.name} is not trained yet "
                         f"({path} does not exist); call zoo.load first")
    with open(path) as f:
        return json.load(f)


__all__ = [
    "NAMED", "TRAININGS", "CorruptEntry", "ZooSpec", "byte_lm", "cache_root", "entry_path",
    "evaluate", "get_spec", "is_checkpoint_dir", "list", "load", "load_base", "load_model",
    "load_spec", "metrics", "spec_from_config", "train_recipe",
]
