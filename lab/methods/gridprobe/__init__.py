"""GridProbe: answer-space frame selection for long-video QA with a K x K grid of probes
and Shape-Adaptive Selection of the number of frames kept (:mod:`.selection`), on the VLM
zoo's models (:class:`ZooReader`, :mod:`.zoo_reader`), a Qwen3-VL checkpoint
(:class:`QwenVLReader`, :mod:`.qwen_reader`) or small trainable
:class:`lab.nn.VLM` selectors and QA models (:mod:`.models`), with the baselines
(monolithic, uniform, encoder-space similarity, fixed M) in :func:`select`."""

from __future__ import annotations

import functools

import numpy as np

from lab.methods.gridprobe import models
from lab.methods.gridprobe.models import forward_flops, posteriors
from lab.methods.gridprobe.qwen_reader import QwenVLReader
from lab.methods.gridprobe.selection import (
    CONFIDENCES,
    RULES,
    check_grid_size,
    confidences,
    cosine_scores,
    grid_frames,
    importance_map,
    probe_slots,
    select_m,
    shape_adaptive_m,
    top_m_mask,
    uniform_mask,
)
from lab.methods.gridprobe.zoo_reader import ZooReader

SELECTORS = ("monolithic", "uniform", "similarity", "gridprobe_fixed", "gridprobe")

__all__ = ["CONFIDENCES", "RULES", "SELECTORS", "check_grid_size", "confidences", "cosine_scores",
           "forward_flops", "grid_frames", "importance_map", "models", "posteriors",
           "probe", "probe_slots", "select", "select_m", "shape_adaptive_m", "top_m_mask",
           "uniform_mask", "QwenVLReader", "ZooReader"]


def probe(selector, videos: np.ndarray, questions, options, k: int, *, chunk: int = 64,
          times=None, confidence: str = "peak") -> dict:
    """Runs the ``2K`` grid probes of every question: ``videos [B, K^2, H, W, 3]`` (the
    grid's frames in time order); ``selector`` a :class:`ZooReader` or
    :class:`QwenVLReader` (string questions and options) or a :mod:`.models` VLM (token
    ids); ``times [B, K^2]``, each frame's second in its video, goes with the frames to a
    :class:`QwenVLReader` (its video mode writes them as timestamps). ``confidence``
    (:data:`CONFIDENCES`): ``"peak"``, the peak posterior, or ``"kl"``, the KL divergence
    from the selector's posterior on the question alone (one more forward per question).
    Returns ``{"row", "col"}`` confidences ``[B, K]``, ``"map"`` ``[B, K^2]``, the probes'
    ``"posteriors"`` ``[B, 2K, n_options]`` and, for ``"kl"``, the ``"prior"`` ``[B,
    n_options]``."""
    b, n = videos.shape[:2]
    if n != k * k:
        raise ValueError(f"videos has {n} frames per row; a K={k} grid needs K^2={k * k}")
    if confidence not in CONFIDENCES:
        raise ValueError(f"confidence={confidence!r}; expected one of {CONFIDENCES}")
    slots = probe_slots(k)                                          # [2K, K]
    frames = videos[:, slots].reshape(b * 2 * k, k, *videos.shape[2:])
    masks = np.ones((b * 2 * k, k), bool)
    q = [questions[i] for i in range(b) for _ in range(2 * k)]
    opts = np.repeat(np.asarray(options), 2 * k, axis=0)
    run = (selector.posteriors if isinstance(selector, ZooReader | QwenVLReader)
           else functools.partial(posteriors, selector))
    kw = {}
    if times is not None:
        if not isinstance(selector, QwenVLReader):
            raise ValueError(f"times is given for a {type(selector).__name__} selector; only "
                             "a QwenVLReader reads frame times")
        kw["times"] = np.asarray(times, float)[:, slots].reshape(b * 2 * k, k)
    post = run(frames, masks, q, opts, chunk=chunk, **kw).reshape(b, 2 * k, -1)
    out = {"posteriors": post}
    if confidence == "kl":
        out["prior"] = run(videos, np.zeros((b, n), bool), list(questions),
                           np.asarray(options), chunk=chunk)
        conf = np.asarray(confidences(post, out["prior"][:, None]))
    else:
        conf = np.asarray(confidences(post))
    row, col = conf[:, :k], conf[:, k:]
    return {"row": row, "col": col, "map": np.asarray(importance_map(row, col)), **out}


def select(kind: str, *, n: int, m=None, importance=None, rule: str = "shape",
           scale: float = 3.0, m_min: int = 1, m_max: int | None = None,
           frame_emb=None, query_emb=None, batch: int | None = None) -> np.ndarray:
    """Frame masks ``[B, N]`` of a selector (one of :data:`SELECTORS`):
    ``"monolithic"`` every frame; ``"uniform"`` ``m`` frames spread in time;
    ``"similarity"`` the ``m`` frames whose embedding is most cosine-similar to the
    question's; ``"gridprobe_fixed"`` the top ``m`` of the importance map;
    ``"gridprobe"`` the top ``M_eff`` of the map by ``rule`` (:func:`select_m`)."""
    if kind not in SELECTORS:
        raise ValueError(f"kind={kind!r}; expected one of {SELECTORS}")
    if kind == "monolithic":
        return np.ones((batch, n), bool)
    if kind == "gridprobe":
        m_eff = select_m(importance, rule, scale=scale, m_min=m_min, m_max=m_max)
        return np.asarray(top_m_mask(importance, m_eff))
    b = batch if batch is not None else len(importance if importance is not None else frame_emb)
    ms = np.broadcast_to(np.asarray(m, np.int64), (b,))
    if ms.min() < 1 or ms.max() > n:
        raise ValueError(f"m={m!r}; expected frames to keep in [1, N={n}]")
    if kind == "uniform":
        return uniform_mask(n, ms)
    if kind == "similarity":
        return np.asarray(top_m_mask(cosine_scores(frame_emb, query_emb), ms))
    return np.asarray(top_m_mask(importance, ms))
