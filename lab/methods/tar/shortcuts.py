"""Shortcut baselines and a frame-tracker upper bound, as harness predictors.

Each ``fit_*`` takes the train items (``{task: items}``) and returns a
:class:`~lab.methods.tar.harness.PredictFn`:

* :func:`fit_majority`: the most frequent train answer of the task (for mcq the most
  frequent option letter, i.e. the answer-position prior; for temporal localization
  the mean train interval);
* :func:`fit_question_only`: the most frequent train answer to the same question text;
  for mcq the option naming the event type most often correct in train (the class
  prior); else the majority answer;
* :func:`fit_frame_rule`: a nearest-centroid event-type classifier on one frame
  (``"first"``, ``"middle"`` or ``"last"``, 8 x 8 mean-pooled RGB, standardised), whose
  type answers bcq / mcq and picks the majority train answer of that type for the
  other tasks (the mean interval of that type for temporal localization);
* :func:`tracker`: :func:`~lab.methods.tar.synthetic.track_events` on all frames, then
  the auto-labeller's answer for the estimated event log (an upper bound showing the
  labels are recoverable from the pixels; it knows the renderer's geometry and palette).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from lab.methods.tar import labels, metrics, schema, synthetic


def _most_common(values):
    return Counter(values).most_common(1)[0][0]


def _interval_json(intervals) -> str:
    a = np.asarray(intervals, np.float64).mean(0)
    return json.dumps({"start": f"{a[0]:.3f}", "end": f"{a[1]:.3f}"})


def _majority_answers(train: Mapping[str, Sequence[schema.Item]]) -> dict[str, str]:
    out = {}
    for task, items in train.items():
        if not items:
            continue
        if task == "temporal_localization":
            out[task] = _interval_json([metrics.parse_interval(it.answer) for it in items])
        else:
            out[task] = _most_common([it.answer for it in items])
    return out


def fit_majority(train):
    """The most frequent train answer per task (see the module docstring)."""
    answers = _majority_answers(train)
    return lambda items, frames: [answers.get(it.task, "") for it in items]


def fit_question_only(train):
    """The most frequent train answer to the same question (see the module docstring)."""
    majority = _majority_answers(train)
    by_question = {(task, q): _most_common(a) for task, items in train.items()
                   for q, a in _group(items).items()}
    types = [labels.type_of_answer(it) for it in train.get("mcq", [])]
    prior = _most_common([t for t in types if t]) if types else None

    def predict(items, frames):
        out = []
        for it in items:
            if it.task == "mcq" and prior is not None:
                out.append(labels.option_of(it.question, prior) or majority["mcq"])
            else:
                out.append(by_question.get((it.task, it.question), majority.get(it.task, "")))
        return out

    return predict


def _group(items):
    g = defaultdict(list)
    for it in items:
        g[it.question].append(it.answer)
    return g


def frame_features(frames: np.ndarray, position: str) -> np.ndarray:
    """One frame (``first`` / ``middle`` / ``last``) mean-pooled to 8 x 8 x 3, flat."""
    index = {"first": 0, "middle": len(frames) // 2, "last": len(frames) - 1}
    if position not in index:
        raise ValueError(f"position={position!r}; expected first, middle or last")
    f = frames[index[position]].astype(np.float64)
    h, w = f.shape[0] // 8 * 8, f.shape[1] // 8 * 8
    f = f[:h, :w].reshape(8, h // 8, 8, w // 8, 3).mean((1, 3))
    return f.ravel()


def video_types(train) -> dict[str, str]:
    """``{video_id: event type}`` read from the train mcq answers."""
    return {it.video_id: t for it in train.get("mcq", []) if (t := labels.type_of_answer(it))}


def fit_frame_rule(train, media_root: str, position: str = "last", *,
                   frames: Mapping[str, np.ndarray] | None = None):
    """Nearest-centroid event type from one frame (see the module docstring); ``frames``
    (``{video_id: frames}``) saves reading the train videos again."""
    types = video_types(train)
    if not types:
        raise ValueError("fit_frame_rule needs train mcq items to read event types from")
    get = (lambda v: frames[v]) if frames is not None else (
        lambda v: schema.load_frames(v, media_root))
    feats = {v: frame_features(get(v), position) for v in types}
    x = np.stack(list(feats.values()))
    mu, sd = x.mean(0), x.std(0) + 1e-6
    classes = sorted(set(types.values()))
    centroids = np.stack([np.mean([(feats[v] - mu) / sd for v in types if types[v] == c], 0)
                          for c in classes])
    per_type = {}
    for task, items in train.items():
        for c in classes:
            own = [it for it in items if types.get(it.video_id) == c]
            if not own:
                continue
            if task == "temporal_localization":
                per_type[task, c] = _interval_json([metrics.parse_interval(it.answer)
                                                    for it in own])
            else:
                per_type[task, c] = _most_common([it.answer for it in own])
    majority = _majority_answers(train)

    def predict(items, frames):
        out = []
        for it, f in zip(items, frames, strict=True):
            if f is None:
                raise ValueError("fit_frame_rule's predictor needs frames (give a media_root)")
            z = (frame_features(f, position) - mu) / sd
            c = classes[int(np.argmin(((centroids - z) ** 2).sum(1)))]
            if it.task == "bcq":
                out.append("Yes" if labels.asked_type(it.question) == c else "No")
            elif it.task == "mcq":
                out.append(labels.option_of(it.question, c) or majority["mcq"])
            else:
                out.append(per_type.get((it.task, c), majority.get(it.task, "")))
        return out

    return predict


def tracker(fps: float = 8.0):
    """The frame-tracker upper bound (see the module docstring)."""
    logs: dict[int, tuple] = {}  # id(frames) -> (frames, log): the harness reuses arrays

    def predict(items, frames):
        out = []
        for it, f in zip(items, frames, strict=True):
            if id(f) not in logs or logs[id(f)][0] is not f:
                logs[id(f)] = (f, synthetic.track_events(f))
            log = logs[id(f)][1]
            if it.task == "temporal_localization" and log["type"] == "normal":
                out.append("no anomaly found")  # malformed on purpose: nothing to localise
                continue
            out.append(labels.answer(it.task, it.question, log, fps)[0])
        return out

    return predict
