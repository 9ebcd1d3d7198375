"""A training run's metric records: ``metrics.jsonl`` beside the checkpoints, shared by
:class:`lab.train.Trainer` and :class:`lab.train.rl.RLTrainer`.

One JSON record per logged update (``{"step": n, ...}``), appended and flushed as it
is made; on resume the file is cut back to the restored step, so a run killed and
restarted ends with the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from lab.atomic import write_text as atomic_write_text


def to_python(x) -> Any:
    """A JSON-ready value of a scalar or array (an int/float, or nested lists)."""
    arr = np.asarray(x)
    return arr.item() if arr.ndim == 0 else arr.tolist()


def truncate_metrics(path: str, step: int) -> list[dict]:
    """Keeps the records of ``path`` up to ``step`` (rewritten atomically); returns them.
    A line cut by a kill is dropped."""
    if not os.path.exists(path):
        return []
    kept = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", step + 1) <= step:
                kept.append(record)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def due(done: int, every: int, final: bool) -> bool:
    """Whether update ``done`` (1-based) logs, evaluates or checkpoints on an ``every``
    cadence (0 = only at the end): at the final update or every ``every`` updates."""
    return final or (bool(every) and done % every == 0)


def log_update(done: int, record: Mapping, *, eval_fn: Callable | None, eval_due: bool,
               model_fn: Callable, history: list, log_file: IO | None) -> dict:
    """Adds ``eval_fn(model_fn(), done)`` (prefixed ``eval/``) to ``record`` when
    ``eval_due``; a non-empty result becomes ``{"step": done, ...}``, appended to
    ``history`` and written (flushed) to ``log_file``. Returns it ({} when nothing)."""
    record = dict(record)
    if eval_fn is not None and eval_due:
        result = eval_fn(model_fn(), done)
        record.update({f"eval/{k}": to_python(v) for k, v in dict(result).items()})
    if not record:
        return {}
    record = {"step": done, **record}
    history.append(record)
    if log_file is not None:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
    return record
