"""Baselines without learning for S²-Net's tasks: the shortcuts a task must defeat,
and the oracles that show it is solvable.

Each rule maps a batch's ``inputs`` ``[B, T, N]`` (pixels of a ``size x size`` grid,
row-major) to predicted groups ``[B, N]``; :func:`group_ari` scores them against the
ground truth with the adjusted Rand index over the pixels of the objects, as
:func:`lab.methods.s2net.metrics.binding_ari` does for phase embeddings.

* :func:`orientation_rule`: horizontal minus vertical lit neighbours within radius 2
  in one frame (a fixed local rule that scores ARI 1.0 on crossing bars).
* :func:`intensity_kmeans`: k-means on each pixel's time-averaged intensity.
* :func:`connected_components`: 4-connected components of the lit pixels of one frame.
* :func:`frame_kmeans`: k-means on one frame's pixel values.
* :func:`position_kmeans`: k-means on pixel coordinates (objects as spatial blobs).
* :func:`temporal_oracle`: each pixel's Fourier coefficient at the flicker frequency,
  clustered by angle (uses the temporal structure the task is built on).

For the bound-feature query (:func:`~lab.methods.s2net.tasks.bound_query_batch`):
:func:`no_context_readout` (a linear readout of channel rates, no timing) and
:func:`query_oracle` (compares the two queried channels' firing phases).
"""

from __future__ import annotations

import numpy as np

from lab.methods.s2net.metrics import adjusted_rand_index, circular_kmeans


def kmeans(points: np.ndarray, k: int, iters: int = 20) -> np.ndarray:
    """Euclidean k-means of ``[M, D]`` points, farthest-point initialisation from the
    first point (deterministic); returns ``[M]`` cluster ids."""
    pts = np.asarray(points, np.float64)
    centres = [pts[0]]
    for _ in range(1, k):
        d = np.min(((pts[:, None] - np.stack(centres)[None]) ** 2).sum(-1), axis=1)
        centres.append(pts[np.argmax(d)])
    c = np.stack(centres)
    for _ in range(iters):
        assign = np.argmin(((pts[:, None] - c[None]) ** 2).sum(-1), axis=1)
        c = np.stack([pts[assign == j].mean(0) if np.any(assign == j) else c[j]
                      for j in range(k)])
    return np.argmin(((pts[:, None] - c[None]) ** 2).sum(-1), axis=1)


def group_ari(pred, labels, n_groups: int = 2) -> np.ndarray:
    """Per-sample ARI of predicted groups ``[B, N]`` over the pixels with labels
    ``1..n_groups``; returns ``[B]``."""
    pred, labels = np.asarray(pred), np.asarray(labels)
    keep = (labels >= 1) & (labels <= n_groups)
    return np.asarray([adjusted_rand_index(lab[m], p[m])
                       for p, lab, m in zip(pred, labels, keep, strict=True)])


def _grid(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[-1] != size * size:
        raise ValueError(f"inputs have {x.shape[-1]} pixels; expected size*size={size * size}")
    return x.reshape(*x.shape[:-1], size, size)


def orientation_rule(inputs, size: int, radius: int = 2, frame: int = 0) -> np.ndarray:
    """Group 1 where a pixel of frame ``frame`` has more lit horizontal than vertical
    neighbours within ``radius``, else group 2."""
    img = _grid(np.asarray(inputs)[:, frame] > 0.5, size).astype(np.int64)
    pad = np.pad(img, ((0, 0), (radius, radius), (radius, radius)))
    horiz = sum(pad[:, radius:radius + size, radius + d:radius + d + size]
                for d in range(-radius, radius + 1) if d)
    vert = sum(pad[:, radius + d:radius + d + size, radius:radius + size]
               for d in range(-radius, radius + 1) if d)
    return np.where(horiz > vert, 1, 2).reshape(img.shape[0], -1)


def intensity_kmeans(inputs, n_groups: int = 2) -> np.ndarray:
    """k-means on each pixel's time-averaged intensity."""
    mean = np.asarray(inputs).mean(1)
    return np.stack([kmeans(m[:, None], n_groups) for m in mean])


def connected_components(inputs, size: int, frame: int = 0) -> np.ndarray:
    """4-connected components of frame ``frame``'s lit pixels (ids 1, 2, ...; unlit 0)."""
    img = _grid(np.asarray(inputs)[:, frame] > 0.5, size)
    out = np.zeros(img.shape, np.int64)
    for b in range(img.shape[0]):
        n = 0
        for r0 in range(size):
            for c0 in range(size):
                if not img[b, r0, c0] or out[b, r0, c0]:
                    continue
                n += 1
                stack = [(r0, c0)]
                out[b, r0, c0] = n
                while stack:
                    r, c = stack.pop()
                    for rr, cc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                        if 0 <= rr < size and 0 <= cc < size and img[b, rr, cc] \
                                and not out[b, rr, cc]:
                            out[b, rr, cc] = n
                            stack.append((rr, cc))
    return out.reshape(img.shape[0], -1)


def frame_kmeans(inputs, n_groups: int = 2, frame: int = 0) -> np.ndarray:
    """k-means on the pixel values of frame ``frame``."""
    x = np.asarray(inputs)[:, frame]
    return np.stack([kmeans(v[:, None], n_groups) for v in x])


def position_kmeans(inputs, size: int, n_groups: int = 2) -> np.ndarray:
    """k-means on pixel coordinates (the same partition for every sample)."""
    rows, cols = np.divmod(np.arange(size * size), size)
    part = kmeans(np.stack([rows, cols], 1).astype(np.float64) + 1e-3 * cols[:, None],
                  n_groups)
    return np.broadcast_to(part, (np.asarray(inputs).shape[0], size * size))


def temporal_oracle(inputs, period: int, n_groups: int = 2) -> np.ndarray:
    """Each pixel's Fourier coefficient at ``2*pi/period`` over all frames,
    ``sum_t x(t) exp(-i 2 pi t / period)``, clustered by angle (spherical k-means)."""
    x = np.asarray(inputs, np.float64)
    w = 2 * np.pi * np.arange(x.shape[1]) / period
    emb = np.stack([np.einsum("btn,t->bn", x, np.cos(w)), np.einsum("btn,t->bn", x, np.sin(w))],
                   -1)
    return np.stack([circular_kmeans(e, n_groups) for e in emb])


def fourier_phase(inputs, period: int) -> np.ndarray:
    """Angle of each channel's coefficient ``sum_t x(t) exp(-i 2 pi t / period)``;
    ``inputs [B, T, D]`` -> ``[B, D]`` radians."""
    x = np.asarray(inputs, np.float64)
    w = 2 * np.pi * np.arange(x.shape[1]) / period
    return np.arctan2(np.einsum("btd,t->bd", x, np.sin(w)), np.einsum("btd,t->bd", x, np.cos(w)))


def query_oracle(inputs, n_features: int, period: int, n_objects: int) -> np.ndarray:
    """Answers :func:`~lab.methods.s2net.tasks.bound_query_batch` from timing: 1 when the
    Fourier phases of colour 0 (channel 0) and shape 0 (channel ``n_features``) differ by
    less than half the spacing of the objects' phases, ``pi / n_objects``."""
    ph = fourier_phase(inputs, period)
    diff = np.angle(np.exp(1j * (ph[:, 0] - ph[:, n_features])))
    return (np.abs(diff) < np.pi / n_objects).astype(np.int32)


def no_context_readout(train_inputs, train_labels, inputs) -> np.ndarray:
    """A linear readout of the time-averaged channel rates (no timing): least squares of
    ``+-1`` labels on ``[mean_t x, 1]`` fitted on the training set; returns 0/1 answers."""
    def feats(x):
        m = np.asarray(x, np.float64).mean(1)
        return np.concatenate([m, np.ones((m.shape[0], 1))], 1)

    w = np.linalg.lstsq(feats(train_inputs), 2.0 * np.asarray(train_labels) - 1.0,
                        rcond=None)[0]
    return (feats(inputs) @ w > 0).astype(np.int32)
