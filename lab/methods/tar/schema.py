"""The public TAR annotation schema: task files, the test split, submissions, frames.

TAR (Traffic Anomaly Reasoning, the AI City Challenge 2026 Track 3 release,
``nvidia/PhysicalAI-Traffic-Anomaly-Reasoning``) ships:

* ``train/<task>.json``: ``{"items": [{"video_id", "question", "answer",
  "reasoning"}, ...]}``, one file per task in :data:`TASKS`; other top-level keys
  (``media_root``, ``metadata``) and other item keys are kept as they are;
* ``test/test.json``: the same item fields plus an ``item_index`` (the join key of a
  submission) and the item's task (``task``, or ``task_type``); when
  ``metadata.answers_redacted`` is true the answers are redacted (absent, null or
  empty), so the split can be predicted and validated but not scored;
* a submission: a CSV with exactly the columns ``item_index,prediction``, one row per
  test item (multi-line predictions are quoted).

Video ids resolve against a configurable media root: ``<media_root>/<video_id>`` is a
video file, or (what :func:`load_frames` reads) a folder of extracted frames, one image
per frame, in file-name order.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lab import atomic

TASKS = ("bcq", "bcq_openended", "causal_linkage", "mcq", "mcq_openended", "open_qa",
         "scene_description", "temporal_description", "temporal_localization")
# The three task groups of the TAR paper (Question Answering, Temporal Reasoning, Scene
# Understanding), as we assign the released task files to them.
TASK_GROUPS = {
    "question_answering": ("bcq", "bcq_openended", "mcq", "mcq_openended", "open_qa"),
    "temporal_reasoning": ("temporal_localization", "temporal_description", "causal_linkage"),
    "scene_understanding": ("scene_description",),
}
# The metric of each task (lab.methods.tar.metrics): accuracy of a normalised yes/no or
# option letter, mean temporal IoU, or open-ended text similarity.
TASK_METRIC = {"bcq": "yes_no", "mcq": "choice", "temporal_localization": "interval",
               **{t: "text" for t in TASKS if t not in ("bcq", "mcq", "temporal_localization")}}
TRAIN_FIELDS = ("video_id", "question", "answer", "reasoning")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm")


@dataclasses.dataclass(frozen=True)
class Item:
    """One annotation. ``answer`` is None when redacted; ``item_index`` is None on train
    files (which have none); ``extra`` holds the item's other keys, untouched."""

    task: str
    video_id: str
    question: str
    answer: str | None
    reasoning: str | None = None
    item_index: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def key(self, position: int) -> str:
        """The join key of a prediction: ``item_index``, else ``<task>/<position>``."""
        return self.item_index if self.item_index is not None else f"{self.task}/{position}"

    def to_json(self) -> dict:
        out = {**self.extra, "video_id": self.video_id, "question": self.question,
               "answer": self.answer, "reasoning": self.reasoning}
        if self.item_index is not None:
            out = {"item_index": self.item_index, "task": self.task, **out}
        return out


class SchemaError(ValueError):
    """A TAR file that does not follow the schema; the message names the file, the item
    index and the field."""


def _fail(path, index, field, problem) -> None:
    where = f"{path}: item {index}" if index is not None else str(path)
    raise SchemaError(f"{where}: field {field!r} {problem}")


def _read_json(path: str) -> Any:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such TAR annotation file")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise SchemaError(f"{path}: not valid JSON ({e})") from e


def _items_of(data: Any, path: str) -> list:
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: top level is {type(data).__name__}; expected an object "
                          'with an "items" list')
    if "items" not in data:
        _fail(path, None, "items", "is missing; expected a list of items")
    if not isinstance(data["items"], list):
        _fail(path, None, "items", f"is {type(data['items']).__name__}; expected a list")
    return data["items"]


def _string(path, index, item, field, *, optional=False):
    if field not in item or item[field] is None:
        if optional:
            return None
        _fail(path, index, field, "is missing")
    value = item[field]
    if not isinstance(value, str):
        _fail(path, index, field, f"is {type(value).__name__} ({value!r:.40}); expected a string")
    if not optional and field in ("video_id", "question") and not value.strip():
        _fail(path, index, field, "is empty")
    return value


def parse_items(data: Any, path: str, task: str) -> list[Item]:
    """Validates a parsed train task file and returns its items (see :func:`load_task`)."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; expected one of {TASKS}")
    items = []
    for i, raw in enumerate(_items_of(data, path)):
        if not isinstance(raw, dict):
            raise SchemaError(f"{path}: item {i}: is {type(raw).__name__}; expected an object")
        values = {f: _string(path, i, raw, f) for f in TRAIN_FIELDS}
        extra = {k: v for k, v in raw.items() if k not in TRAIN_FIELDS}
        items.append(Item(task=task, extra=extra, **values))
    return items


def load_task(path: str, task: str | None = None) -> list[Item]:
    """The items of a train task file ``{"items": [{video_id, question, answer,
    reasoning}, ...]}``; ``task`` defaults to the file's stem. Raises :class:`SchemaError`
    naming the file, the item index and the field on a wrong schema."""
    task = task or os.path.splitext(os.path.basename(path))[0]
    return parse_items(_read_json(path), path, task)


def load_train(root: str, tasks: Iterable[str] | None = None) -> dict[str, list[Item]]:
    """``{task: items}`` from ``<root>/train/<task>.json`` for ``tasks`` (default: every
    task whose file exists; a task asked for by name must exist)."""
    asked = tasks is not None
    out = {}
    for task in (tuple(tasks) if asked else TASKS):
        path = os.path.join(root, "train", f"{task}.json")
        if not asked and not os.path.exists(path):
            continue
        out[task] = load_task(path, task)
    if not out:
        raise FileNotFoundError(f"{root}/train: no TAR task file (expected <task>.json for "
                                f"tasks in {TASKS})")
    return out


def parse_test(data: Any, path: str) -> tuple[list[Item], bool]:
    """Validates a parsed test file; returns ``(items, answers_redacted)``."""
    meta = data.get("metadata", {}) if isinstance(data, dict) else {}
    if not isinstance(meta, dict):
        _fail(path, None, "metadata", f"is {type(meta).__name__}; expected an object")
    redacted = bool(meta.get("answers_redacted", False))
    items, seen = [], {}
    for i, raw in enumerate(_items_of(data, path)):
        if not isinstance(raw, dict):
            raise SchemaError(f"{path}: item {i}: is {type(raw).__name__}; expected an object")
        index = raw.get("item_index")
        if isinstance(index, int) and not isinstance(index, bool):
            index = str(index)
        if not isinstance(index, str) or not index:
            _fail(path, i, "item_index", f"is {index!r}; expected a non-empty string")
        if index in seen:
            _fail(path, i, "item_index", f"{index!r} repeats item {seen[index]}")
        seen[index] = i
        task_field = "task" if "task" in raw else "task_type"
        task = _string(path, i, raw, task_field)
        if task not in TASKS:
            _fail(path, i, task_field, f"is {task!r}; expected one of {TASKS}")
        answer = _string(path, i, raw, "answer", optional=redacted)
        if redacted:
            answer = answer or None
        known = {"item_index", "task", "task_type", *TRAIN_FIELDS}
        items.append(Item(task=task, video_id=_string(path, i, raw, "video_id"),
                          question=_string(path, i, raw, "question"), answer=answer,
                          reasoning=_string(path, i, raw, "reasoning", optional=True),
                          item_index=index,
                          extra={k: v for k, v in raw.items() if k not in known}))
    return items, redacted


def load_test(path: str) -> tuple[list[Item], bool]:
    """The test split ``test/test.json``: ``(items, answers_redacted)``; each item carries
    its ``item_index`` and task; redacted answers are None."""
    return parse_test(_read_json(path), path)


def write_task(path: str, items: Sequence[Item], **top_level) -> None:
    """Writes ``items`` (of one task) as a train task file, atomically."""
    atomic.write_json(path, {**top_level, "items": [
        {**it.extra, **{f: getattr(it, f) for f in TRAIN_FIELDS}} for it in items]})


def write_test(path: str, items: Sequence[Item], *, redact: bool = False) -> None:
    """Writes ``items`` (with ``item_index`` and task) as a test file, atomically; with
    ``redact`` the answers and reasoning are dropped and ``metadata.answers_redacted``
    is set."""
    rows = []
    for it in items:
        if it.item_index is None:
            raise ValueError(f"item of task {it.task!r}, video {it.video_id!r} has no "
                             "item_index; a test file needs one per item")
        row = it.to_json()
        if redact:
            row["answer"], row["reasoning"] = None, None
        rows.append(row)
    atomic.write_json(path, {"metadata": {"answers_redacted": redact}, "items": rows})


def write_submission(path: str, predictions: Mapping[str, str]) -> None:
    """Writes ``{item_index: prediction}`` as the CSV ``item_index,prediction``
    atomically (quoting multi-line or comma-holding predictions)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["item_index", "prediction"])
    for index, pred in predictions.items():
        if not isinstance(pred, str):
            raise ValueError(f"prediction for item_index {index!r} is "
                             f"{type(pred).__name__}; expected a string")
        writer.writerow([index, pred])
    atomic.write_text(path, buf.getvalue())


def read_submission(path: str, items: Sequence[Item] | None = None) -> dict[str, str]:
    """``{item_index: prediction}`` from a submission CSV. Raises ValueError naming the
    file and row for wrong columns, a repeated or empty ``item_index``; with ``items``
    (the test split) also for an unknown or a missing ``item_index``."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["item_index", "prediction"]:
            raise SchemaError(f"{path}: header is {header}; expected exactly "
                              "['item_index', 'prediction']")
        out = {}
        for row_no, row in enumerate(reader, start=2):
            if len(row) != 2:
                raise SchemaError(f"{path}: row {row_no} has {len(row)} columns; expected 2")
            index, pred = row
            if not index:
                raise SchemaError(f"{path}: row {row_no}: field 'item_index' is empty")
            if index in out:
                raise SchemaError(f"{path}: row {row_no}: field 'item_index' {index!r} repeats")
            out[index] = pred
    if items is not None:
        known = {it.item_index for it in items}
        unknown = sorted(set(out) - known)
        missing = sorted(known - set(out))
        if unknown:
            raise SchemaError(f"{path}: item_index {unknown[:5]} not in the test split")
        if missing:
            raise SchemaError(f"{path}: {len(missing)} test items have no prediction "
                              f"(first: {missing[:5]})")
    return out


def resolve_media_root(root: str, media_root: str | None = None) -> str:
    """The media root of a TAR tree at ``root``: ``media_root`` when given, else the
    ``media_root`` key of the first train task file that has one (relative paths are
    taken from ``root``, as the release's quick start sets it), else ``<root>/videos``."""
    if media_root:
        return media_root
    for task in TASKS:
        path = os.path.join(root, "train", f"{task}.json")
        if os.path.exists(path):
            data = _read_json(path)
            value = data.get("media_root") if isinstance(data, dict) else None
            if isinstance(value, str) and value:
                return value if os.path.isabs(value) else os.path.join(root, value)
    return os.path.join(root, "videos")


def media_path(video_id: str, media_root: str) -> str:
    """``<media_root>/<video_id>``; refuses ids that would leave the media root."""
    root = os.path.abspath(media_root)
    path = os.path.abspath(os.path.join(root, video_id))
    if os.path.commonpath([root, path]) != root:
        raise ValueError(f"video_id={video_id!r} resolves outside media_root={media_root!r}")
    return path


def frame_files(video_id: str, media_root: str) -> list[str]:
    """The frame images of ``<media_root>/<video_id>/`` in file-name order."""
    folder = media_path(video_id, media_root)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no frame folder for video_id={video_id!r} "
                                f"under media_root={media_root!r}")
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(FRAME_SUFFIXES))
    if not names:
        raise FileNotFoundError(f"{folder}: no frame images ({', '.join(FRAME_SUFFIXES)})")
    return [os.path.join(folder, n) for n in names]


def load_frames(video_id: str, media_root: str, *, stride: int = 1,
                max_frames: int | None = None) -> np.ndarray:
    """Frames of an extracted image folder as ``uint8 [T, H, W, 3]`` (every ``stride``-th
    frame, at most ``max_frames``, evenly spaced over the video when fewer are asked)."""
    from PIL import Image

    if stride < 1:
        raise ValueError(f"stride={stride}; expected an int >= 1")
    files = frame_files(video_id, media_root)[::stride]
    if max_frames is not None and len(files) > max_frames:
        pick = np.linspace(0, len(files) - 1, max_frames).round().astype(int)
        files = [files[i] for i in pick]
    frames = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise ValueError(f"{video_id}: frames differ in shape {sorted(shapes)}")
    return np.stack(frames)


def save_frames(frames: np.ndarray, folder: str) -> None:
    """Writes ``uint8 [T, H, W, 3]`` frames as ``000000.png ...`` in ``folder``: into a
    temporary sibling folder first, renamed over ``folder`` when complete (a reader never
    sees a half-written video)."""
    import shutil
    import tempfile

    from PIL import Image

    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-frames-")
    try:
        for t, frame in enumerate(np.asarray(frames, np.uint8)):
            Image.fromarray(frame).save(os.path.join(tmp, f"{t:06d}.png"), format="PNG")
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
