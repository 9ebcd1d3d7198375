"""Named small LMs that Lab ships trained, or trains on its synthetic tasks on first use.

``zoo.load("lm-xs-long") -> (model, tokenizer)``; the VLM zoo's ``zoo.load("vlm-xs")``
gives a :class:`lab.nn.VLM` and its word tokenizer (:mod:`lab.zoo.vlm`); ``zoo.list()`` names
them and says
where each would come from; ``zoo.regime("cot-s")`` gives a reasoning model's measured
chain-of-thought regime (:mod:`lab.zoo.reasoning`); ``zoo.load_spec(ZooSpec(...))`` loads
or trains a method's own model (``zoo.spec_from_config`` builds one from a launcher's
``config.zoo`` block); ``zoo.load_model(name_or_dir)`` takes a zoo name or a Hugging Face
checkpoint directory.

Where the weights come from (``source=``, or ``$LAB_ZOO``; default ``"auto"``):

- ``"auto"``: the entry shipped with Lab (``lab/zoo/weights``) when its key (the spec's
  digest) matches and its checksums verify, else the cache of this host
  (``$LAB_CACHE/zoo``, default ``~/.cache/lab/zoo``), else training (cached after);
- ``"shipped"``: the shipped entry only (ValueError when there is none for the spec);
- ``"cache"``: the cache, else training; shipped weights are ignored;
- ``"train"``: train from scratch (its base too), once per process, into the cache.

A shipped entry of another key than the spec's (a recipe changed without its weights
being re-shipped) or a corrupt one is reported with a warning, and the cache or
training takes over. Every load is recorded in :func:`loads` (where the model came
from, its training time and host), which ``experiments.reproduce`` reports.
Entries are keyed by ``<name>-<digest of the spec>`` (:mod:`lab.zoo.spec`,
:mod:`lab.zoo.store`); ``python -m lab.zoo.ship`` writes the shipped ones.
"""

from __future__ import annotations

import collections
import json
import os
import shutil

from lab.data import ByteTokenizer
from lab.zoo import store, vlm
from lab.zoo.evaluate import evaluate
from lab.zoo.spec import NAMED, ZOO_FORMAT, ZooSpec, byte_lm, spec_from_config, train_recipe
from lab.zoo.store import (
    METRICS_FILE,
    CorruptEntry,
    cache_root,
    entry_keys,
    read_entry,
    shipped_dir,
    write_entry,
    zoo_dir,
)

SOURCES = ("auto", "shipped", "cache", "train")
SOURCE_ENV = "LAB_ZOO"
# How many times this process trained each entry (tests check that a cached load does not).
TRAININGS: collections.Counter = collections.Counter()
ON_CORRUPT = ("retrain", "raise")


def resolve_source(source: str | None = None) -> str:
    """``source``, else ``$LAB_ZOO``, else ``"auto"``; ValueError for anything not in
    :data:`SOURCES`."""
    value = source if source is not None else (os.environ.get(SOURCE_ENV) or "auto")
    if value not in SOURCES:
        where = "source" if source is not None else SOURCE_ENV
        raise ValueError(f"{where}={value!r}; expected one of {SOURCES}")
    return value


def list(source: str | None = None) -> dict[str, dict]:  # noqa: A001 - the issue's name
    """``{name: {"description", "key", "source"}}`` of the named models, where ``source`` is
    where :func:`load` would take it from now: ``"shipped"``, ``"cached"`` or ``"train"``
    (nothing verified yet: a corrupt entry is found at load time)."""
    source = resolve_source(source)
    out = {}
    for name, spec in {**NAMED, **vlm.NAMED}.items():
        key = spec.key
        if source in ("auto", "shipped") and key in entry_keys(shipped_dir(), name):
            where = "shipped"
        elif source in ("auto", "cache") and key in entry_keys(zoo_dir(), name):
            where = "cached"
        else:
            where = "train"
        out[name] = {"description": spec.description, "key": key, "source": where}
    return out


def get_spec(name: str) -> ZooSpec:
    if name in vlm.NAMED:
        return vlm.NAMED[name]
    if name not in NAMED:
        raise ValueError(f"zoo model {name!r} is unknown; expected one of "
                         f"{sorted({**NAMED, **vlm.NAMED})}")
    return NAMED[name]


def entry_path(spec: ZooSpec | str) -> str:
    """The cache directory of a spec (or named model), whether or not it exists yet."""
    spec = get_spec(spec) if isinstance(spec, str) else spec
    return os.path.join(zoo_dir(), spec.key)


# Every load of this process, in order (``loads()``).
_LOADS: list[dict] = []


def loads() -> list[dict]:
    """Every zoo load of this process, in order: ``{"name", "key", "source"`` (``"shipped"``,
    ``"cached"`` or ``"trained"`` here), ``"path"``, ``"train_seconds"`` (the recorded
    training's wall seconds; measured now for ``"trained"``), ``"trained_on"`` (the CPU of
    the host that trained it, when recorded), ``"stored_dtype"``, ``"notes"``
    (why a shipped entry was passed over)}``."""
    return [dict(r) for r in _LOADS]


def record_load(row: dict) -> None:
    """Appends a load to :func:`loads` (:mod:`lab.zoo.bundle` records its bundles here)."""
    _LOADS.append(dict(row))


def record_resolved(name: str, key: str, got: store.Resolved) -> None:
    """Records a load found by :func:`lab.zoo.store.resolve` (:func:`loads`): where it came
    from, its training time and host, the dtype it was stored in, the notes."""
    m = got.metrics
    record_load({"name": name, "key": key, "source": got.source, "path": got.path,
                 "train_seconds": (m.get("seconds") or {}).get("train", m.get("train_seconds")),
                 "trained_on": (m.get("host") or {}).get("cpu"),
                 "stored_dtype": (m.get("shipped") or {}).get("dtype", "float32"),
                 "notes": got.notes[:]})


def load_spec(spec: ZooSpec, *, source: str | None = None, on_corrupt: str = "retrain",
              progress: bool = True):
    """Returns ``(model, tokenizer)`` for ``spec``: shipped, cached or trained (``source``, see
    the module docstring, and :func:`lab.zoo.store.resolve`), and records where it came
    from (:func:`loads`).

    An entry is verified (checksums, parameter names and shapes, digest) before
    use. A corrupt cache entry: ``on_corrupt="retrain"`` moves it aside
    (``<entry>.corrupt-<ms>``) and retrains; ``"raise"`` raises :class:`CorruptEntry`
    naming the entry and the problem. A fine-tune's base is loaded the same way.
    """
    from lab.zoo.train import train_model  # lab.train is only needed to train

    if not isinstance(spec, ZooSpec):
        raise ValueError(f"load_spec expects a ZooSpec, got {type(spec).__name__}")
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={on_corrupt!r}; expected one of {ON_CORRUPT}")
    source, key = resolve_source(source), spec.key

    def build():
        init = load_base(spec, source=source, on_corrupt=on_corrupt, progress=progress)
        workdir = os.path.join(zoo_dir(), f".work-{key}")
        if source == "train":  # from scratch: not from a partial run of an earlier process
            shutil.rmtree(workdir, ignore_errors=True)
        model, metrics = train_model(spec, workdir, progress=progress, init=init)
        write_entry(key, model, {"spec": spec.to_dict(), "digest": spec.digest(),
                                 "format": ZOO_FORMAT}, metrics)
        shutil.rmtree(workdir, ignore_errors=True)
        return model, metrics

    got = store.resolve(
        key, spec.name, source, shipped=shipped_dir(), cache=zoo_dir(),
        read=lambda root: read_entry(key, spec.model, spec.digest(), root=root), build=build,
        trainings=TRAININGS, on_corrupt=on_corrupt,
        reship=(f" (its spec changed and the weights were not re-shipped: python -m "
                f"lab.zoo.ship {spec.name})"))
    record_resolved(spec.name, key, got)
    return got.obj, ByteTokenizer()


def load_base(spec: ZooSpec, *, source: str | None = None, on_corrupt: str = "retrain",
              progress: bool = True):
    """The trained model of ``spec.init`` (:func:`load_spec` with the same ``source``), whose
    weights start ``spec``'s training; None for a spec without a base."""
    base = spec.base()
    if base is None:
        return None
    return load_spec(base, source=source, on_corrupt=on_corrupt, progress=progress)[0]


def load(name: str, *, source: str | None = None, on_corrupt: str = "retrain",
         progress: bool = True):
    """``(model, tokenizer)`` of the named model (``zoo.list()``): shipped, cached or trained
    (``source``: see the module docstring)."""
    if name in vlm.NAMED:
        return vlm.load_spec(vlm.NAMED[name], source=source, progress=progress)
    return load_spec(get_spec(name), source=source, on_corrupt=on_corrupt, progress=progress)


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
    if isinstance(name_or_dir, str) and (name_or_dir in NAMED or name_or_dir in vlm.NAMED):
        return load(name_or_dir, progress=progress)
    if is_checkpoint_dir(name_or_dir):
        from lab import hf  # only real checkpoints need the tokenizers package

        return hf.load_pretrained(name_or_dir, dtype=dtype), hf.load_tokenizer(name_or_dir)
    what = ("a directory without config.json" if isinstance(name_or_dir, (str, os.PathLike))
            and os.path.isdir(name_or_dir) else "not a zoo name nor a directory")
    raise ValueError(f"model {name_or_dir!r} is {what}; expected a zoo model, one of "
                     f"{sorted(NAMED)}, or a Hugging Face checkpoint directory (config.json + "
                     "model.safetensors)")


def metrics(spec: ZooSpec | vlm.VLMSpec | str) -> dict:
    """The stored ``metrics.json`` (train / held-out accuracy per task, training time and host)
    of the entry this process last loaded for ``spec``, else of its shipped entry, else of its
    cache entry. A VLM's: held-out accuracy by question type with all frames, with the
    evidence frames only and with no frames, and its regime checks (:mod:`lab.zoo.vlm`)."""
    spec = get_spec(spec) if isinstance(spec, str) else spec
    loaded = [r["path"] for r in _LOADS if r["key"] == spec.key]
    shipped = os.path.join(shipped_dir(), spec.key)
    where = loaded[-1] if loaded else shipped if os.path.isdir(shipped) else entry_path(spec)
    path = os.path.join(where, METRICS_FILE)
    if not os.path.exists(path):
        raise ValueError(f"{spec.name} is not trained yet "
                         f"({path} does not exist); call zoo.load first")
    with open(path) as f:
        return json.load(f)


def regime(spec: ZooSpec | str, *, source: str | None = None) -> dict:
    """The chain-of-thought regime of a model whose spec sets ``regime``
    (:mod:`lab.zoo.reasoning`: accuracy by difficulty, pass@k, the checks): the block stored
    in its metrics when it was measured with the spec's current :class:`RegimeConfig`,
    else measured now on the loaded model (trained first if need be)."""
    from lab.zoo import reasoning

    spec = get_spec(spec) if isinstance(spec, str) else spec
    if spec.regime is None:
        raise ValueError(f"{spec.name} has no regime (ZooSpec.regime is None); the reasoning "
                         "zoo's models have one")
    model, tok = load_spec(spec, source=source)
    stored = metrics(spec).get("regime")
    if stored and stored["config"] == reasoning.RegimeConfig.from_mapping(
            spec.regime).to_dict():
        return stored
    from lab.zoo.train import build_data

    return reasoning.spec_regime(spec, model, set(build_data(spec)[0]["prompt"]), tok)


__all__ = [
    "NAMED", "SOURCES", "TRAININGS", "vlm", "CorruptEntry", "ZooSpec", "byte_lm", "cache_root",
    "entry_path", "evaluate", "get_spec", "is_checkpoint_dir", "list", "load", "load_base",
    "load_model", "load_spec", "loads", "metrics", "record_resolved", "regime", "resolve_source",
    "shipped_dir",
    "spec_from_config", "train_recipe",
]
