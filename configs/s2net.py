"""S²-Net: spiking-by-synchronisation vs. an SNN, Kuramoto oscillators and an ANN.

Run:
  python -m experiments.s2net --config=configs/s2net.py:default --workdir=/tmp/s2net

Four tasks (temporal binding of objects defined only by when their pixels fire,
a bound-feature query as semantic reasoning, decoding direction from synthetic
spike trains, waveform classification), four models each (binding adds a
feed-forward conv), the same training steps and learning rate for every model of
a task, and untrained shortcut / no-context baselines and oracles beside them.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0  # the evaluation samples and the untrained baselines' data
    # every model trains once from each of these seeds (initialisation and training
    # batches) and is scored on the same evaluation samples; the tables give the mean and
    # the standard error over seeds. One seed is not enough: at `default`, S²-Net's binding
    # ARI and the ANN's each range from about chance to their best between seeds.
    c.seeds = (0, 1, 2, 3, 4)
    c.impl = ""  # "" = automatic kernel choice, or "xla" / "pallas"
    # the tasks to run (comma-separated, a subset of binding,reasoning,decoding,signal);
    # the claims and regime checks of the tasks left out are left out
    c.tasks = "binding,reasoning,decoding,signal"

    c.model = ml_collections.ConfigDict(dict(
        n_neurons=64, ring_k=4, beta=0.9, threshold=1.0, period=8, window=16, delay=2,
        slope=5.0, spike_penalty=0.5, oscillator_weight=1.0, snn_drive=1.0, osc_drive=0.05,
    ))
    # binding: lab.methods.s2net.flicker_batch (rows of the grid as objects, phase-locked
    # Bernoulli firing); drive 1.0 = one input spike takes a resting neuron to threshold
    c.binding = ml_collections.ConfigDict(dict(
        size=8, radius=2, steps=64, n_objects=2, rate=0.2, depth=1.0, jitter=0.5, drive=1.0,
        batch=16, train_steps=150, learning_rate=0.02, eval_batches=4, eval_batch=32,
    ))
    # reasoning: lab.methods.s2net.bound_query_batch ("is colour 0 bound to shape 0?");
    # its own spike penalty: at model.spike_penalty (0.5) the spiking networks fall nearly
    # silent on its sparse inputs (S²-Net 10 spikes per query, accuracy 0.68; 0.05: 0.84)
    c.reasoning = ml_collections.ConfigDict(dict(
        n_objects=3, n_features=4, steps=32, rate=0.3, depth=1.0, jitter=0.5, batch=32,
        spike_penalty=0.05, train_steps=200,
        learning_rate=0.02, eval_batches=4, eval_batch=128, no_context_samples=2048,
    ))
    c.decoding = ml_collections.ConfigDict(dict(
        n_in=32, n_classes=8, steps=32, peak_rate=0.1, gain_noise=0.4, batch=32,
        train_steps=200, learning_rate=0.01, eval_batches=4, eval_batch=128,
    ))
    c.signal = ml_collections.ConfigDict(dict(
        steps=64, noise=0.2, batch=32, train_steps=250, learning_rate=0.02, eval_batches=4,
        eval_batch=128,
    ))
    if preset == "test":
        c.seeds = (0, 1)
        c.binding.update(steps=24, batch=4, train_steps=2, eval_batches=1, eval_batch=8)
        c.reasoning.update(steps=12, batch=8, train_steps=2, eval_batches=1, eval_batch=16,
                           no_context_samples=64)
        c.decoding.update(steps=12, batch=8, train_steps=2, eval_batches=1, eval_batch=16)
        c.signal.update(steps=16, batch=8, train_steps=2, eval_batches=1, eval_batch=16)
        c.model.n_neurons = 16
        c.model.ring_k = 2
    elif preset == "paper":
        c.binding.update(size=16, steps=128, train_steps=2000, eval_batches=16)
        c.reasoning.update(steps=64, train_steps=3000, eval_batches=16)
        c.decoding.update(n_in=96, steps=64, train_steps=3000, eval_batches=16)
        c.signal.update(steps=128, train_steps=3000, eval_batches=16)
        c.model.n_neurons = 256
        c.model.ring_k = 8
    return c
