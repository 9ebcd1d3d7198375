"""A weighted mixture of synthetic tasks in one Dataset (what the zoo trains on)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import datasets
import numpy as np

from lab.data.synthetic.arithmetic import arithmetic
from lab.data.synthetic.base import COMMON_COLUMNS, check_n
from lab.data.synthetic.copy import copy
from lab.data.synthetic.icl import icl_classification
from lab.data.synthetic.image import image_qa
from lab.data.synthetic.kv_retrieval import kv_retrieval
from lab.data.synthetic.long_context import needle, variable_tracking
from lab.data.synthetic.recall import associative_recall
from lab.data.synthetic.video import video_qa

GENERATORS = {
    "arithmetic": arithmetic,
    "variable_tracking": variable_tracking,
    "needle": needle,
    "kv_retrieval": kv_retrieval,
    "icl_classification": icl_classification,
    "copy": copy,
    "associative_recall": associative_recall,
    "video_qa": video_qa,
    "image_qa": image_qa,
}


def generate(task: str, n: int, seed: int = 0, **kwargs) -> datasets.Dataset:
    """Calls the generator named ``task`` (a key of :data:`GENERATORS`)."""
    if task not in GENERATORS:
        raise ValueError(f"task={task!r} is unknown; expected one of {sorted(GENERATORS)}")
    try:
        return GENERATORS[task](n, seed, **kwargs)
    except TypeError as e:  # an unknown keyword: name the task in the message
        raise ValueError(f"bad arguments for task {task!r}: {e}") from e


def mixture(n: int, seed: int, tasks: Mapping[str, Mapping]) -> datasets.Dataset:
    """``n`` examples drawn from several generators, shuffled together.

    ``tasks`` maps a generator name to its keyword arguments plus an optional
    ``"weight"`` (default 1): ``{"arithmetic": {"weight": 2, "steps": (1, 3)},
    "needle": {"context_len": 256}}``. Task ``i`` gets ``round(n * w_i / sum
    w)`` examples (the last takes the remainder) from seed ``(seed, i)``.
    The result has the common columns plus ``meta``: a JSON string of the
    task-specific columns, so that tasks with different columns share one
    schema. Deterministic in ``seed``.
    """
    check_n(n, seed)
    if not tasks:
        raise ValueError("tasks is empty; expected a mapping of generator name -> kwargs")
    names = list(tasks)
    weights = []
    for name in names:
        w = tasks[name].get("weight", 1.0)
        if not isinstance(w, (int, float)) or w < 0:
            raise ValueError(f"tasks[{name!r}]['weight']={w!r}; expected a non-negative number")
        weights.append(float(w))
    total = sum(weights)
    if total <= 0:
        raise ValueError("all task weights are zero")
    counts = [int(round(n * w / total)) for w in weights]
    counts[-1] = n - sum(counts[:-1])
    parts = []
    for i, (name, count) in enumerate(zip(names, counts, strict=True)):
        if count <= 0:
            continue
        kwargs = {k: v for k, v in tasks[name].items() if k != "weight"}
        ds = generate(name, count, seed=int(np.random.default_rng([seed, i]).integers(2**31)),
                      **kwargs)
        extra = [c for c in ds.column_names if c not in COMMON_COLUMNS]
        rows = ds.to_list()
        parts.extend(
            {**{c: r[c] for c in COMMON_COLUMNS},
             "meta": json.dumps({c: r[c] for c in extra})} for r in rows)
    order = np.random.default_rng([seed, 999]).permutation(len(parts))
    return datasets.Dataset.from_list([parts[int(j)] for j in order])
