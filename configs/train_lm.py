"""Train a byte-level Transformer LM on Lab's synthetic mixture (any zoo or custom config).

Run:
  python -m experiments.train_lm --config=configs/train_lm.py:default --workdir=/tmp/train_lm

The fields mirror :class:`lab.zoo.ZooSpec`: ``model`` (every
``lab.nn.TransformerConfig`` field), ``train`` (``lab.train.TrainConfig``
fields), ``data`` (the ``lab.data.mixture`` tasks, example counts, seed),
``seq_len``, ``batch_size``, ``pack``, ``prompt_weight``, ``init`` (a named zoo model
whose trained weights start training, loaded or trained first; lm-xs starts from
lm-xs-copy). Presets start from a named zoo spec:
``test`` = lm-test, ``default`` = lm-xs, ``paper`` = lm-m; override any field
with ``--config.train.steps=...``. Checkpoints go to ``<workdir>/train``; rerunning
in the same workdir resumes from the latest one.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset
from lab.zoo.spec import NAMED

BASE = {"test": "lm-test", "default": "lm-xs", "paper": "lm-m"}


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    spec = NAMED[BASE[preset]].to_dict()
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.name = spec["name"]
    c.model = ml_collections.ConfigDict(spec["model"])
    c.train = ml_collections.ConfigDict(spec["train"])
    c.data = ml_collections.ConfigDict(spec["data"])
    c.seq_len = spec["seq_len"]
    c.batch_size = spec["batch_size"]
    c.pack = spec["pack"]
    c.prompt_weight = spec["prompt_weight"]
    c.init = spec["init"]  # a named zoo model whose weights start training; "" = random init
    return c
