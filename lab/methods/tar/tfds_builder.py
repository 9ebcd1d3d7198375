"""A ``tensorflow-datasets`` builder for TAR annotations (array_record, no TensorFlow).

:func:`build_annotations` prepares the items of a TAR root (``train/<task>.json`` and,
when present, ``test/test.json``) as a TFDS dataset through the generic builder
:func:`lab.data.tfds.build`: splits ``train`` and ``test``, one record per item with
the text features ``task``, ``video_id``, ``question``, ``answer``, ``reasoning`` and
``item_index`` (empty strings for a redacted answer, a missing reasoning or a train
item's index). Videos are not stored; ``video_id`` resolves against the media root.
Needs the ``tfds`` extra (``tensorflow-datasets``, ``array_record``).
"""

from __future__ import annotations

import os

from lab.methods.tar import schema

FIELDS = ("task", "video_id", "question", "answer", "reasoning", "item_index")


def _record(item: schema.Item) -> dict[str, str]:
    return {f: getattr(item, f) or "" for f in FIELDS}


def build_annotations(root: str, data_dir: str, *, name: str = "tar_annotations",
                      version: str = "1.0.0"):
    """Prepares ``root``'s annotations under ``data_dir``; returns the builder (read back
    with ``lab.data.tfds.load(builder.data_dir)``)."""
    from lab.data import tfds as ltfds

    tfds = ltfds._tfds()
    train = schema.load_train(root)
    splits = {"train": lambda: ((f"{t}/{i}", _record(it)) for t, items in train.items()
                                for i, it in enumerate(items))}
    test_path = os.path.join(root, "test", "test.json")
    if os.path.exists(test_path):
        test, _ = schema.load_test(test_path)
        splits["test"] = lambda: ((it.item_index, _record(it)) for it in test)
    features = {f: tfds.features.Text() for f in FIELDS}
    return ltfds.build(name, features, splits, data_dir, version=version, shuffle=False,
                       description="TAR (Traffic Anomaly Reasoning) annotations.")
