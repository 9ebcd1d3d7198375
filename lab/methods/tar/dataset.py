"""Synthetic TAR splits on disk, in the public schema.

:func:`make_videos` generates seeded videos (:mod:`lab.methods.tar.synthetic`) with
event types balanced over :data:`~lab.methods.tar.synthetic.EVENT_TYPES`;
:func:`write_split` labels them (:mod:`lab.methods.tar.labels`) and writes
``<root>/train/<task>.json`` or ``<root>/test/test.json`` (with ``item_index``; answers
kept unless ``redact``), the frames as image folders ``<root>/videos/<video_id>/``
(the media root) and the ground-truth event logs ``<root>/<split>_events.json``;
:func:`build_splits` writes a train and a test split and reads them back.
"""

from __future__ import annotations

import os

import numpy as np

from lab import atomic
from lab.methods.tar import labels, schema, synthetic


def make_videos(seed: int, n: int, *, prefix: str = "syn", n_frames: int = 48) -> list:
    """``[(video_id, frames, log)]`` for ``n`` videos; event types cycle through a seeded
    permutation so every type gets ``n / 5`` videos (up to one)."""
    rng = np.random.default_rng(seed)
    types = [synthetic.EVENT_TYPES[i % len(synthetic.EVENT_TYPES)] for i in range(n)]
    types = [types[i] for i in rng.permutation(n)]
    out = []
    for i, event in enumerate(types):
        frames, log = synthetic.generate_video(int(rng.integers(2 ** 31)), event,
                                               n_frames=n_frames)
        out.append((f"{prefix}_{seed}_{i:04d}", frames, log))
    return out


def build_splits(root: str, *, seed: int, train_videos: int, test_videos: int,
                 n_frames: int = 48, fps: float = 8.0) -> tuple[dict, list, str]:
    """Writes a synthetic train split (videos and labels seeded by ``seed``) and test split
    (``seed + 1``) under ``root`` and reads them back through the loader: ``(train {task:
    items}, test items, media root)``."""
    for split, s, n in (("train", seed, train_videos), ("test", seed + 1, test_videos)):
        write_split(root, make_videos(s, n, prefix=split, n_frames=n_frames), split, seed=s,
                    fps=fps)
    test, _ = schema.load_test(os.path.join(root, "test", "test.json"))
    return schema.load_train(root), test, os.path.join(root, "videos")


def write_split(root: str, videos: list, split: str, *, seed: int = 0, fps: float = 8.0,
                redact: bool = False, write_frames: bool = True) -> dict[str, list]:
    """Labels ``videos`` and writes them as ``split`` (``"train"`` or ``"test"``) under
    ``root``; returns ``{task: items}``."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}; expected 'train' or 'test'")
    rng = np.random.default_rng(seed)
    by_task: dict[str, list] = {t: [] for t in schema.TASKS}
    for video_id, frames, log in videos:
        for item in labels.label_video(video_id, log, rng, fps=fps,
                                       with_index=split == "test"):
            by_task[item.task].append(item)
        if write_frames:
            schema.save_frames(frames, os.path.join(root, "videos", video_id))
    if split == "train":
        for task, items in by_task.items():
            schema.write_task(os.path.join(root, "train", f"{task}.json"), items,
                              media_root="videos")
    else:
        flat = [it for t in schema.TASKS for it in by_task[t]]
        schema.write_test(os.path.join(root, "test", "test.json"), flat, redact=redact)
    atomic.write_json(os.path.join(root, f"{split}_events.json"),
                      {vid: log for vid, _, log in videos})
    return by_task
