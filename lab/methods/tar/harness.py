"""The evaluation harness: run a predictor over a split, score it per task.

A predictor follows :class:`PredictFn`: ``predict_fn(items, frames) -> predictions``,
``items`` a batch of :class:`~lab.methods.tar.schema.Item` (answers hidden: ``answer``
and ``reasoning`` are None), ``frames`` the matching ``uint8 [T, H, W, 3]`` arrays
(None when no media root is given), one raw output string per item back. A VLM's
``generate`` wrapped in a prompt is one; :mod:`lab.methods.tar.shortcuts` holds the
shortcut baselines and a frame-tracker upper bound.

:func:`evaluate` scores ``{key: prediction}`` against a split with answers, with the
evaluator of each task (:mod:`lab.methods.tar.metrics`), and averages per task group
(:data:`~lab.methods.tar.schema.TASK_GROUPS`) and over all tasks (``aggregate``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from lab.methods.tar import metrics, schema


class PredictFn(Protocol):
    def __call__(self, items: Sequence[schema.Item],
                 frames: Sequence[np.ndarray | None]) -> Sequence[str]: ...


def hidden(item: schema.Item) -> schema.Item:
    """``item`` without its answer and reasoning (what a predictor may see)."""
    return dataclasses.replace(item, answer=None, reasoning=None)


def predict(predict_fn: PredictFn, items: Sequence[schema.Item], *,
            media_root: str | None = None, batch_size: int = 32,
            max_frames: int | None = None,
            frames_cache: dict[str, np.ndarray] | None = None) -> dict[str, str]:
    """``{item.key(position): prediction}`` for ``items``, in batches of ``batch_size``;
    frames are read from ``media_root`` (:func:`~lab.methods.tar.schema.load_frames`),
    once per video, into ``frames_cache`` when given (shared between calls)."""
    out: dict[str, str] = {}
    cache: dict[str, np.ndarray] = {} if frames_cache is None else frames_cache
    for b in range(0, len(items), batch_size):
        batch = list(items[b:b + batch_size])
        frames = []
        for it in batch:
            if media_root is None:
                frames.append(None)
                continue
            if it.video_id not in cache:
                cache[it.video_id] = schema.load_frames(it.video_id, media_root,
                                                        max_frames=max_frames)
            frames.append(cache[it.video_id])
        preds = list(predict_fn([hidden(it) for it in batch], frames))
        if len(preds) != len(batch):
            raise ValueError(f"predict_fn returned {len(preds)} predictions for "
                             f"{len(batch)} items")
        for i, (it, p) in enumerate(zip(batch, preds, strict=True)):
            out[it.key(b + i)] = p if isinstance(p, str) else ""
    return out


def evaluate(predictions: Mapping[str, str], split: Sequence[schema.Item], *,
             scorer=None) -> dict:
    """Per-task metrics of ``predictions`` (keyed by ``item.key(position)``, positions in
    ``split``): ``{"tasks": {task: {"metric", "score", "n", "malformed", "missing",
    ...}}, "groups": {group: mean score}, "aggregate": mean over tasks}``. A missing
    prediction scores as malformed and is counted in ``missing``; an item without an
    answer raises (a redacted split can be validated, not scored)."""
    per_task: dict[str, list] = {}
    for pos, it in enumerate(split):
        if it.answer is None:
            raise ValueError(f"item {pos} ({it.task}, video {it.video_id!r}) has no answer; "
                             "a redacted split cannot be scored")
        per_task.setdefault(it.task, []).append((predictions.get(it.key(pos)), it))
    tasks = {}
    for task, pairs in per_task.items():
        preds = [p for p, _ in pairs]
        answers = [it.answer for _, it in pairs]
        kind = schema.TASK_METRIC[task]
        if kind in ("yes_no", "choice"):
            res = {"metric": "accuracy", **metrics.accuracy(
                preds, answers, kind, [it.question for _, it in pairs])}
        elif kind == "interval":
            res = {"metric": "mean_iou", **metrics.mean_iou(preds, answers)}
        else:
            res = metrics.text_similarity(preds, answers, scorer)
        res["missing"] = sum(p is None for p in preds)
        tasks[task] = res
    groups = {}
    for group, members in schema.TASK_GROUPS.items():
        scores = [tasks[t]["score"] for t in members if t in tasks]
        if scores:
            groups[group] = float(np.mean(scores))
    aggregate = float(np.mean([r["score"] for r in tasks.values()])) if tasks else float("nan")
    return {"tasks": tasks, "groups": groups, "aggregate": aggregate}
