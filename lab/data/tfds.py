"""TensorFlow Datasets builders over ``array_record`` files, with no TensorFlow.

TFDS (``tensorflow-datasets``) can prepare a dataset as ``array_record`` shards
and read it back through ``tfds.data_source`` (random access, NumPy values)
without TensorFlow installed, provided two things TFDS would otherwise hand
to TensorFlow are done here instead:

- ``DatasetInfo`` is built directly (``dataset_info_from_configs`` looks for
  package metadata files next to the builder's module);
- images are given as PNG bytes (``tfds.features.Image`` encodes NumPy arrays
  with ``tf.image.encode_png``; a file object of PNG bytes is stored as it is
  and decoded with PIL on read). :func:`build` encodes ``uint8`` arrays for
  every ``Image`` feature, and every frame of a ``Sequence(Image)`` feature,
  with PIL. (``tfds.features.Video`` needs TensorFlow even to be constructed;
  use ``Sequence(Image(...))`` for frames: it reads back as a list of arrays.)

Usage::

    features = {"question": tfds.features.Text(), "answer": tfds.features.Text(),
                "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png")}
    builder = build("my_set", features, {"train": gen_train, "test": gen_test},
                    data_dir="/tmp/tfds")
    split = load(builder.data_dir)["train"]       # or load("/tmp/tfds/my_set/1.0.0")
    split[0]["question"]                          # str (Text is decoded from bytes)

Each split's generator is a zero-argument callable returning an iterable of
``(key, example)`` pairs with unique string keys. TFDS shuffles records by a
hash of the key when it writes them; pass ``shuffle=False`` to keep generation
order. Preparation writes into a temporary ``incomplete.*`` directory and
renames it when done (TFDS's own atomic write), so an interrupted build leaves
no half-written dataset behind.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

Generator = Callable[[], Iterable[tuple[str, dict[str, Any]]]]


def _tfds():
    import tensorflow_datasets as tfds  # noqa: PLC0415  (heavy; imported on use)

    return tfds


def encode_png(image: np.ndarray) -> io.BytesIO:
    """PNG bytes of a ``uint8 [H, W]`` or ``[H, W, C]`` array as a file object (PIL)."""
    from PIL import Image  # noqa: PLC0415

    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"encode_png: image dtype {image.dtype}, expected uint8")
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    buf.seek(0)
    return buf


def _image_keys(features) -> tuple[list[str], list[str]]:
    """Names of ``Image`` features and of ``Sequence(Image)`` features (frame stacks)."""
    tfds = _tfds()
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    frames = [k for k, f in features.items() if isinstance(f, tfds.features.Sequence)
              and isinstance(f.feature, tfds.features.Image)]
    return images, frames


def _prepare_example(example: dict[str, Any], keys: tuple[list[str], list[str]]):
    images, frames = keys
    out = dict(example)
    for k in images:
        if isinstance(out.get(k), np.ndarray):
            out[k] = encode_png(out[k])
    for k in frames:
        v = out.get(k)
        if v is not None:
            out[k] = [encode_png(f) if isinstance(f, np.ndarray) else f for f in v]
    return out


def _snake(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"tfds dataset name {name!r}: expected lower snake_case [a-z][a-z0-9_]*")
    return name


def make_builder_class(
    name: str,
    features: Mapping[str, Any],
    splits: Mapping[str, Generator],
    *,
    version: str = "1.0.0",
    description: str = "",
    homepage: str | None = None,
    citation: str | None = None,
    shuffle: bool = True,
):
    """A ``tfds.core.GeneratorBasedBuilder`` subclass named ``name`` (not registered).

    ``features`` maps feature names to ``tfds.features`` objects (or is a
    ``FeaturesDict``); ``splits`` maps split names to example generators.
    """
    tfds = _tfds()
    _snake(name)
    if not splits:
        raise ValueError(f"tfds builder {name!r}: splits is empty, expected at least one split")
    for split in splits:
        if not re.fullmatch(r"[A-Za-z0-9_]+", split):
            raise ValueError(f"tfds builder {name!r}: split name {split!r}, expected [A-Za-z0-9_]+")
    feats = features if isinstance(features, tfds.features.FeaturesDict) else (
        tfds.features.FeaturesDict(dict(features)))
    image_keys = _image_keys(feats)
    splits = dict(splits)

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, description=description, features=feats,
            homepage=homepage, citation=citation, disable_shuffling=not shuffle)

    def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(split=split) for split in splits}

    def _generate_examples(self, split):
        for key, example in splits[split]():
            yield str(key), _prepare_example(example, image_keys)

    body = {"name": name, "VERSION": tfds.core.Version(version),
            "RELEASE_NOTES": {version: "Generated by lab.data.tfds."},
            "_info": _info, "_split_generators": _split_generators,
            "_generate_examples": _generate_examples,
            # No package directory holds checksums or metadata for a generated
            # builder; TFDS's lookup of one needs ``importlib_resources``.
            "code_path": None,
            "__module__": __name__}
    cls_name = "".join(p.capitalize() for p in name.split("_")) or "Dataset"
    return type(cls_name, (tfds.core.GeneratorBasedBuilder,), body, skip_registration=True)


def build(
    name: str,
    features: Mapping[str, Any],
    splits: Mapping[str, Generator],
    data_dir: str | os.PathLike,
    **kwargs,
):
    """Prepare ``name`` as ``array_record`` shards under ``data_dir``; return the builder.

    ``kwargs`` go to :func:`make_builder_class` (``version``, ``description``,
    ``homepage``, ``citation``, ``shuffle``). A dataset already prepared at
    that version is reused as it is (TFDS's rule).
    """
    cls = make_builder_class(name, features, splits, **kwargs)
    builder = cls(data_dir=os.fspath(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return builder


class Source:
    """Random access to one prepared split: ``len``, ``[i]``, iteration.

    Wraps ``tfds``'s array_record data source and decodes ``Text`` features
    from bytes to ``str`` (TFDS returns bytes); images come as ``uint8`` arrays.
    """

    def __init__(self, source, text_keys: list[str]):
        self._source = source
        self._text_keys = text_keys

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a split of {len(self)} records")
        example = dict(self._source[index % len(self)])
        for k in self._text_keys:
            if isinstance(example.get(k), bytes):
                example[k] = example[k].decode("utf-8")
        return example

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def load(path: str | os.PathLike) -> dict[str, Source]:
    """Every split of the dataset prepared at ``path`` (``<data_dir>/<name>/<version>``).

    Reads through ``tfds.builder_from_directory(...).as_data_source()``: no
    TensorFlow, no builder class needed.
    """
    tfds = _tfds()
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "dataset_info.json")):
        raise FileNotFoundError(
            f"tfds load: {path!r} holds no dataset_info.json; expected a prepared dataset "
            "directory <data_dir>/<name>/<version>")
    builder = tfds.builder_from_directory(path)
    text_keys = [k for k, f in builder.info.features.items()
                 if isinstance(f, tfds.features.Text)]
    return {split: Source(src, text_keys) for split, src in builder.as_data_source().items()}
