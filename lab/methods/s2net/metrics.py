"""Metrics for S²-Net's tasks: the adjusted Rand index of phase clusters, and the
energy proxy (synaptic operations and an estimate in picojoules).

Energy proxy. Each model's inference cost is counted in multiply-accumulates
(MAC, a real-valued product and sum) and accumulates (AC, the addition a
binary spike triggers at a synapse), then priced with Horowitz's 45 nm float32
figures (ISSCC 2014: 4.6 pJ per MAC, 0.9 pJ per AC), the convention of the SNN
literature (e.g. Yin et al. 2021; Zhou et al., Spikformer 2023):

* SNN: per spike, one AC per outgoing recurrent synapse and per readout
  weight; binary input spikes cost one AC per encoder weight they reach,
  real-valued inputs a MAC per encoder weight per step; one MAC per neuron per
  step for the leak.
* S²-Net adds one MAC per neuron per step for the modulation and two for the
  phase update, and, event-driven, two MACs per outgoing coupling edge each
  time a neuron's windowed phasor changes (a spike enters or leaves its window,
  counted as twice its spikes), which is when the coupling sum changes.
* Kuramoto oscillators: two MACs per coupling edge per step (each neighbour's
  cos and sin of the delayed phase) plus the encoder MACs.
* ANN: dense MACs of every layer at every step (tanh RNN: encoder plus
  recurrent weights per step, readout once; ConvEmbed: one kernel per pixel).
"""

from __future__ import annotations

import numpy as np

PJ_PER_MAC = 4.6
PJ_PER_AC = 0.9


def adjusted_rand_index(labels_true, labels_pred) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985) of two flat labelings; 1.0 when both
    put everything in one cluster (the convention of ``sklearn.metrics.adjusted_rand_score``)."""
    a, b = np.asarray(labels_true).ravel(), np.asarray(labels_pred).ravel()
    if a.shape != b.shape:
        raise ValueError(f"labels_true has {a.size} entries, labels_pred {b.size}; expected equal")
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), np.int64)
    np.add.at(table, (ai, bi), 1)

    def pairs(x):
        return (x * (x - 1) // 2).sum()

    index = pairs(table)
    sum_a, sum_b, total = pairs(table.sum(1)), pairs(table.sum(0)), a.size * (a.size - 1) // 2
    expected = sum_a * sum_b / total if total else 0.0
    maximum = (sum_a + sum_b) / 2
    if maximum == expected:
        return 1.0
    return float((index - expected) / (maximum - expected))


def circular_kmeans(emb: np.ndarray, k: int, iters: int = 20) -> np.ndarray:
    """Clusters ``[M, 2]`` embeddings by direction (spherical k-means, farthest-point
    initialisation from the first point, deterministic); returns ``[M]`` cluster ids."""
    u = emb / np.maximum(np.linalg.norm(emb, axis=-1, keepdims=True), 1e-9)
    centres = [u[0]]
    for _ in range(1, k):
        sim = np.max(u @ np.stack(centres).T, axis=1)
        centres.append(u[np.argmin(sim)])
    c = np.stack(centres)
    for _ in range(iters):
        assign = np.argmax(u @ c.T, axis=1)
        new = np.stack([u[assign == j].sum(0) if np.any(assign == j) else c[j] for j in range(k)])
        c = new / np.maximum(np.linalg.norm(new, axis=-1, keepdims=True), 1e-9)
    return np.argmax(u @ c.T, axis=1)


def binding_ari(emb, labels, n_groups: int = 2) -> np.ndarray:
    """Per-sample ARI of phase clusters over the pixels that belong to exactly one shape
    (labels 1..n_groups; background 0 and overlaps 3 are left out); returns ``[B]``."""
    emb, labels = np.asarray(emb), np.asarray(labels)
    out = []
    for e, lab in zip(emb, labels, strict=True):
        keep = (lab >= 1) & (lab <= n_groups)
        out.append(adjusted_rand_index(lab[keep], circular_kmeans(e[keep], n_groups)))
    return np.asarray(out)


def standard_error(values) -> float:
    """Standard error of the mean of per-sample scores, ``std(ddof=1) / sqrt(n)`` (0.0
    for fewer than two samples)."""
    v = np.asarray(values, np.float64).ravel()
    return float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0


def snn_energy(spikes_per_sample: float, *, n_neurons: int, steps: int, recurrent_fanout: float,
               n_out: int, encoder_macs: float = 0.0, input_spikes: float = 0.0,
               encoder_fanout: int = 0, sync: bool = False, coupling_fanout: float = 0.0) -> dict:
    """Operation counts and pJ for one sample of a spiking model (see module docstring)."""
    ac = spikes_per_sample * (recurrent_fanout + n_out) + input_spikes * encoder_fanout
    mac = encoder_macs + n_neurons * steps
    if sync:
        mac += 3 * n_neurons * steps + 2 * (2 * spikes_per_sample) * coupling_fanout
    return {"mac": float(mac), "ac": float(ac), "pj": float(PJ_PER_MAC * mac + PJ_PER_AC * ac)}


def dense_energy(mac: float) -> dict:
    """Operation counts and pJ for a model that only does MACs."""
    return {"mac": float(mac), "ac": 0.0, "pj": float(PJ_PER_MAC * mac)}
