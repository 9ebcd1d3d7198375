"""Video-MME and LongVideoBench records over pre-extracted frame folders.

Both benchmarks ship questions as records and videos as MP4 files; Lab reads
the records and expects the frames already extracted (one folder per video,
one image or ``.npy`` file per frame, any tool), so that no video decoder is a
dependency.

- Video-MME (Fu et al. 2024, "Video-MME: The First-Ever Comprehensive
  Evaluation Benchmark of Multi-modal LLMs in Video Analysis"; the Hugging Face
  ``lmms-lab/Video-MME`` parquet): ``video_id, duration`` ("short" / "medium" /
  "long"), ``domain, sub_category, question_id, task_type, question,
  options`` (``["A. ...", "B. ...", ...]``), ``answer`` (a letter), and
  ``videoID`` (the YouTube id that names the video file) where present.
- LongVideoBench (Wu et al. 2024, "LongVideoBench: A Benchmark for Long-context
  Interleaved Video-Language Understanding"; ``lvb_val.json``): ``id,
  video_id, question, candidates, correct_choice`` (an int; absent in the test
  split), ``duration`` (seconds), ``subtitle_path`` and
  ``starting_timestamp_for_subtitles``, plus ``question_category`` and
  ``duration_group`` where present. Subtitle files hold either ``{"timestamp":
  [start, end], "text"}`` or ``{"start": "HH:MM:SS.mmm", "end", "line"}``
  entries, read as the reference loader (``longvideobench_dataset.py``) reads them.

Both loaders return rows in the layout of :func:`lab.data.video_qa`:
``prompt`` (the question, then ``"A. option"`` lines), ``options`` (texts,
without letters), ``answer`` (the letter, ``""`` when unknown),
``answer_index`` (-1 when unknown), ``question_type``, ``difficulty``,
``task``, ``video_id``, ``frame_dir`` and ``frame_paths`` (sorted by the
number in the file name; empty without ``frames_dir``), ``n_frames``.
:func:`load_frames` reads frames into ``uint8 [T, H, W, 3]``;
:func:`uniform_indices` picks ``k`` of ``n`` frames the way both papers'
baselines sample them (segment midpoints).

Records come as ``.json`` (a list of objects), ``.jsonl`` or ``.parquet``.
Every error names the file, the record (its index and id) and the field.
"""

from __future__ import annotations

import json
import os
import re

import datasets
import numpy as np

VIDEOMME_FIELDS = ("video_id", "duration", "domain", "sub_category", "question_id", "task_type",
                   "question", "options", "answer")
VIDEOMME_DURATIONS = ("short", "medium", "long")
LVB_FIELDS = ("id", "video_id", "question", "candidates", "duration")
FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".npy")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# LongVideoBench's duration groups (seconds): 8-15, 15-60, 180-600, 900-3600.
LVB_DURATION_EDGES = (15.0, 60.0, 600.0)


def _json_list(path: str, what: str) -> list:
    """The JSON list in ``path`` (a ``.jsonl`` file: one value a line); ValueError naming
    the file (and line) for a missing file, invalid JSON or a value that is not a list."""
    if not os.path.exists(path):
        raise ValueError(f"{what} file {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            out = []
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from e
            return out
        try:
            value = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(value, list):
        raise ValueError(f"{path}: expected a JSON list, got {type(value).__name__}")
    return value


def read_records(path: str) -> list[dict]:
    """The records of a ``.json`` list, ``.jsonl`` or ``.parquet`` file."""
    if path.endswith(".parquet"):
        if not os.path.exists(path):
            raise ValueError(f"records file {path!r} does not exist")
        import pyarrow.parquet as pq  # a dependency of datasets
        recs = pq.read_table(path).to_pylist()
    else:
        recs = _json_list(path, "records")
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: record {i}: expected an object, got {type(rec).__name__}")
    if not recs:
        raise ValueError(f"records file {path!r} has no records")
    return recs


class _Where:
    """Formats ``"<file>: record <i> (<id>): field '<name>'=<value>; expected ..."``."""

    def __init__(self, path: str, index: int, rec: dict, id_field: str):
        self.prefix = f"{path}: record {index} ({id_field}={rec.get(id_field)!r})"

    def error(self, field: str, value, expected: str) -> ValueError:
        return ValueError(f"{self.prefix}: field {field!r}={value!r}; expected {expected}")

    def missing(self, field: str) -> ValueError:
        return ValueError(f"{self.prefix}: missing field {field!r}")


def _str(rec: dict, field: str, at: _Where) -> str:
    value = rec[field]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(value)                     # ids stored as numbers
    if not isinstance(value, str) or not value.strip():
        raise at.error(field, value, "a non-empty string")
    return value


def _options(rec: dict, field: str, at: _Where, strip_letters: bool) -> list[str]:
    value = rec[field]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(o, str) for o in value):
        raise at.error(field, value, "a list of strings")
    if len(value) < 2:
        raise at.error(field, value, "at least 2 options")
    if len(value) > len(LETTERS):
        raise at.error(field, f"<{len(value)} options>", f"at most {len(LETTERS)} options")
    if strip_letters:
        out = []
        for i, o in enumerate(value):
            m = re.match(rf"\s*{LETTERS[i]}[.):]\s*", o)
            out.append(o[m.end():] if m else o.strip())
        return out
    return list(value)


def _natural_key(name: str):
    nums = re.findall(r"\d+", name)
    return (int(nums[-1]) if nums else -1, name)


def frame_paths(folder: str) -> list[str]:
    """The frame files of ``folder`` (:data:`FRAME_EXTENSIONS`), sorted by the last number in
    the name (``frame_2.jpg`` before ``frame_10.jpg``)."""
    names = [n for n in os.listdir(folder) if n.lower().endswith(FRAME_EXTENSIONS)]
    return [os.path.join(folder, n) for n in sorted(names, key=_natural_key)]


def _frames_for(frames_dir: str | None, keys: list[tuple[str, str]], at: _Where):
    if frames_dir is None:
        return "", []
    for field, key in keys:
        folder = os.path.join(frames_dir, key)
        if key and os.path.isdir(folder):
            paths = frame_paths(folder)
            if not paths:
                raise at.error(field, key, f"frame files {FRAME_EXTENSIONS} in {folder!r} "
                                           "(the folder is empty)")
            return folder, paths
    field, key = keys[0]
    tried = ", ".join(repr(os.path.join(frames_dir, k)) for _, k in keys if k)
    raise at.error(field, key, f"a frame folder (tried {tried})")


def _prompt(question: str, options: list[str]) -> str:
    return question + "\n" + "".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(options))


def load_videomme(records: str, frames_dir: str | None = None) -> datasets.Dataset:
    """Video-MME records (see the module docstring) -> a Dataset, one row per question.

    ``frames_dir/<videoID>/`` (or ``frames_dir/<video_id>/``) holds each video's
    frames. Extra columns: ``question_id``, ``duration``, ``domain``,
    ``sub_category``, ``task_type`` (also ``question_type``), ``video_key``
    (``videoID`` or ``video_id``); ``difficulty`` is 0 / 1 / 2 for short /
    medium / long videos; ``task = "videomme"``.
    """
    rows = []
    for i, rec in enumerate(read_records(records)):
        at = _Where(records, i, rec, "question_id")
        for field in VIDEOMME_FIELDS:
            if field not in rec:
                raise at.missing(field)
        text = {f: _str(rec, f, at) for f in ("video_id", "domain", "sub_category",
                                               "question_id", "task_type", "question")}
        if rec["duration"] not in VIDEOMME_DURATIONS:
            raise at.error("duration", rec["duration"], f"one of {VIDEOMME_DURATIONS}")
        options = _options(rec, "options", at, strip_letters=True)
        answer = rec["answer"]
        if not isinstance(answer, str) or answer.strip() not in LETTERS[:len(options)]:
            raise at.error("answer", answer, f"a letter in A..{LETTERS[len(options) - 1]}")
        answer = answer.strip()
        key = str(rec.get("videoID") or "")
        folder, paths = _frames_for(frames_dir, [("videoID", key),
                                                 ("video_id", text["video_id"])], at)
        rows.append({
            "prompt": _prompt(text["question"], options), "answer": answer,
            "answer_index": LETTERS.index(answer), "options": options,
            "difficulty": VIDEOMME_DURATIONS.index(rec["duration"]), "task": "videomme",
            "question_type": text["task_type"], "duration": rec["duration"],
            **text, "video_key": key or text["video_id"], "frame_dir": folder,
            "frame_paths": paths, "n_frames": len(paths),
        })
    return datasets.Dataset.from_list(rows)


def _seconds(value, field: str, at: _Where) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+):(\d+):(\d+(?:\.\d*)?)\s*", value)
        if m:
            return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    raise at.error(field, value, "seconds or 'HH:MM:SS.mmm'")


def load_subtitles(path: str, offset: float = 0.0, duration: float | None = None) -> list[dict]:
    """A LongVideoBench subtitle file -> ``[{"start", "end", "text"}]`` in seconds from the
    video's start (``offset`` = ``starting_timestamp_for_subtitles`` subtracted); an open
    end (not a number) becomes ``duration``."""
    entries = _json_list(path, "subtitle")
    out = []
    for i, e in enumerate(entries):
        at = _Where(path, i, e if isinstance(e, dict) else {}, "start")
        at.prefix = f"{path}: entry {i}"
        if not isinstance(e, dict):
            raise ValueError(f"{at.prefix}: expected an object, got {type(e).__name__}")
        if "timestamp" in e:
            ts = e["timestamp"]
            if not isinstance(ts, (list, tuple)) or len(ts) != 2:
                raise at.error("timestamp", ts, "a [start, end] pair")
            start = _seconds(ts[0], "timestamp", at)
            end = float(ts[1]) if isinstance(ts[1], (int, float)) else duration
            text_field = "text"
        else:
            for field in ("start", "end", "line"):
                if field not in e:
                    raise at.missing(field)
            start, end = _seconds(e["start"], "start", at), _seconds(e["end"], "end", at)
            text_field = "line"
        if text_field not in e:
            raise at.missing(text_field)
        if not isinstance(e[text_field], str):
            raise at.error(text_field, e[text_field], "a string")
        end = start if end is None else end
        out.append({"start": start - offset, "end": end - offset, "text": e[text_field]})
    return out


def load_longvideobench(records: str, frames_dir: str | None = None,
                        subtitles_dir: str | None = None) -> datasets.Dataset:
    """LongVideoBench records (see the module docstring) -> a Dataset, one row per question.

    ``frames_dir/<video_id>/`` holds each video's frames; with ``subtitles_dir``
    each record's ``subtitle_path`` is read there into ``subtitles`` (else an
    empty list). Extra columns: ``id``, ``duration`` (seconds), ``question_type``
    (``question_category`` or ``""``), ``subtitles``; ``difficulty`` is the
    duration group 0-3 (8-15 s, 15-60 s, 3-10 min, 15-60 min); ``task =
    "longvideobench"``. Test-split records without ``correct_choice`` get
    ``answer = ""`` and ``answer_index = -1``.
    """
    rows = []
    for i, rec in enumerate(read_records(records)):
        at = _Where(records, i, rec, "id")
        for field in LVB_FIELDS:
            if field not in rec:
                raise at.missing(field)
        text = {f: _str(rec, f, at) for f in ("id", "video_id", "question")}
        options = _options(rec, "candidates", at, strip_letters=False)
        choice = rec.get("correct_choice", -1)
        if isinstance(choice, bool) or not isinstance(choice, (int, np.integer)) or not (
                -1 <= choice < len(options)):
            raise at.error("correct_choice", choice, f"an int in [0, {len(options)}) "
                                                     "(-1 or absent: unknown)")
        duration = rec["duration"]
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration <= 0:
            raise at.error("duration", duration, "a positive number of seconds")
        subtitles = []
        if subtitles_dir is not None:
            if not isinstance(rec.get("subtitle_path"), str):
                raise at.error("subtitle_path", rec.get("subtitle_path"),
                               "a subtitle file name (subtitles_dir is set)")
            offset = rec.get("starting_timestamp_for_subtitles", 0.0)
            if isinstance(offset, bool) or not isinstance(offset, (int, float)):
                raise at.error("starting_timestamp_for_subtitles", offset, "a number of seconds")
            subtitles = load_subtitles(os.path.join(subtitles_dir, rec["subtitle_path"]),
                                       float(offset), float(duration))
        stem = os.path.splitext(os.path.basename(str(rec.get("video_path", ""))))[0]
        folder, paths = _frames_for(frames_dir, [("video_id", text["video_id"]),
                                                 ("video_path", stem)], at)
        rows.append({
            "prompt": _prompt(text["question"], options),
            "answer": LETTERS[choice] if choice >= 0 else "", "answer_index": int(choice),
            "options": options,
            "difficulty": int(np.searchsorted(LVB_DURATION_EDGES, float(duration))),
            "task": "longvideobench", "question_type": str(rec.get("question_category", "")),
            **text, "duration": float(duration), "subtitles": subtitles, "frame_dir": folder,
            "frame_paths": paths, "n_frames": len(paths),
        })
    return datasets.Dataset.from_list(rows)


def uniform_indices(n_frames: int, k: int) -> np.ndarray:
    """``k`` frame indices at the midpoints of ``k`` equal segments of ``n_frames`` frames
    (all of them when ``k >= n_frames``)."""
    if not isinstance(n_frames, (int, np.integer)) or n_frames < 1:
        raise ValueError(f"n_frames={n_frames!r}; expected a positive int")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k={k!r}; expected a positive int (frames to keep)")
    if k >= n_frames:
        return np.arange(n_frames)
    return np.floor((np.arange(k) + 0.5) * n_frames / k).astype(int)


def load_frames(paths, indices=None) -> np.ndarray:
    """Reads frame files (``.npy`` holding ``uint8 [H, W, 3]``, or images, via PIL) ->
    ``uint8 [T, H, W, 3]``; ``indices`` selects some of ``paths`` first. Raises
    ValueError naming the file for a missing file, a wrong dtype or shape, or a
    frame whose size differs from the first."""
    paths = list(paths)
    if not paths:
        raise ValueError("paths is empty; expected at least one frame file")
    if indices is not None:
        bad = [int(i) for i in np.asarray(indices).ravel() if not 0 <= int(i) < len(paths)]
        if bad:
            raise ValueError(f"indices {bad[:5]} outside [0, {len(paths)})")
        paths = [paths[int(i)] for i in np.asarray(indices).ravel()]
    frames = []
    for p in paths:
        if not os.path.exists(p):
            raise ValueError(f"frame file {p!r} does not exist")
        if p.lower().endswith(".npy"):
            arr = np.load(p, allow_pickle=False)
        else:
            from PIL import Image  # only for image files
            with Image.open(p) as im:
                arr = np.asarray(im.convert("RGB"))
        if arr.dtype != np.uint8:
            raise ValueError(f"frame file {p!r} has dtype {arr.dtype}; expected uint8 RGB")
        if arr.ndim != 3 or arr.shape[-1] != 3:
            raise ValueError(f"frame file {p!r} has shape {arr.shape}; expected [H, W, 3]")
        if frames and arr.shape != frames[0].shape:
            raise ValueError(f"frame file {p!r} has shape {arr.shape}; expected "
                             f"{frames[0].shape} like {paths[0]!r}")
        frames.append(arr)
    return np.stack(frames)
