"""S²-Net experiment: accuracy and energy proxy per task for each model.

Tasks: temporal binding of crossing bars (ARI of phase clusters), direction
decoding from synthetic spike trains (accuracy), waveform classification
(accuracy). Models: S²-Net; the same SNN without synchronisation; Kuramoto
oscillators without spikes; an equal-size ANN (a tanh RNN with the same neurons,
scaffold, encoder and readout; for binding a one-layer conv embedding with as
many parameters as S²-Net). Every model of a task gets the same data, training
steps, batch and learning rate. Energy proxy: see :mod:`lab.methods.s2net.metrics`.

  python -m experiments.s2net --config=configs/s2net.py:default --workdir=/tmp/s2net
"""

from __future__ import annotations

import time

import numpy as np
from absl import logging
from flax import nnx

from configs.s2net import get_config
from lab import launch, outputs
from lab.config import check
from lab.methods import s2net as s2

MODELS = ("s2net", "snn", "oscillators", "ann")
TASKS = ("binding", "decoding", "signal")


def _checks():
    pos = (lambda v: v > 0, "a positive number")
    return {"impl": (lambda v: v in ("", "xla", "pallas"), '"", "xla" or "pallas"'),
            "model.n_neurons": pos, "model.window": pos, "model.delay": pos,
            "model.period": pos, "binding.size": (lambda v: v >= 4, "an int >= 4"),
            "binding.train_steps": (lambda v: v >= 1, ">= 1"),
            "decoding.train_steps": (lambda v: v >= 1, ">= 1"),
            "signal.train_steps": (lambda v: v >= 1, ">= 1")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _task_data(task: str, config):
    """Returns ``(batch_fn, eval_batches, n_in, n_out)`` for a task."""
    t, seed = config[task], config.seed
    if task == "binding":
        def gen(s, i, b):
            return s2.binding_batch(s, i, b, size=t.size, steps=t.steps)
        n_in = n_out = None
    elif task == "decoding":
        def gen(s, i, b):
            return s2.spike_train_batch(s, i, b, n_in=t.n_in, steps=t.steps,
                                        n_classes=t.n_classes, peak_rate=t.peak_rate,
                                        gain_noise=t.gain_noise)
        n_in, n_out = t.n_in, t.n_classes
    else:
        def gen(s, i, b):
            return s2.signal_batch(s, i, b, steps=t.steps, noise=t.noise)
        n_in, n_out = 2, len(s2.tasks.SIGNAL_CLASSES)
    evals = [gen(seed + 1000, i, t.eval_batch) for i in range(t.eval_batches)]
    return (lambda step: gen(seed, step, t.batch)), evals, n_in, n_out


def _build(kind: str, task: str, config, n_in, n_out):
    m, seed = config.model, config.seed
    dyn = s2.Dynamics(beta=m.beta, threshold=m.threshold, period=m.period, window=m.window,
                      delay=m.delay, slope=m.slope)
    impl = config.impl or None
    rngs = nnx.Rngs(seed)
    if task == "binding":
        b = config.binding
        n, scaffold = b.size * b.size, {"grid": (b.size, b.size, b.radius)}
        if kind == "ann":
            return s2.ConvEmbed(b.size, b.size, b.radius, rngs=rngs), scaffold
        if kind == "oscillators":
            return s2.KuramotoNet(n, scaffold, dynamics=dyn, drive=1.0, rngs=rngs), scaffold
        return s2.S2Net(n, scaffold, sync=kind == "s2net", dynamics=dyn, drive=b.drive,
                        impl=impl, rngs=rngs), scaffold
    n = m.n_neurons
    scaffold = {"adjacency": s2.ring_adjacency(n, m.ring_k)}
    if kind == "ann":
        return s2.RateRNN(n, scaffold, n_in=n_in, n_out=n_out, rngs=rngs), scaffold
    if kind == "oscillators":
        return s2.KuramotoNet(n, scaffold, n_in=n_in, n_out=n_out, dynamics=dyn,
                              drive=m.osc_drive, rngs=rngs), scaffold
    return s2.S2Net(n, scaffold, n_in=n_in, n_out=n_out, sync=kind == "s2net",
                    coupling="scalar", dynamics=dyn, drive=m.snn_drive, impl=impl,
                    rngs=rngs), scaffold


def _energy(kind: str, task: str, config, model, spikes: float, evals, n_in, n_out) -> dict:
    """Operation counts and pJ per sample (conventions in lab.methods.s2net.metrics)."""
    t = config[task]
    steps = t.steps
    if task == "binding":
        # Only lit pixels do any work (a dark pixel's neuron gets no current and never
        # spikes; its oscillator has amplitude 0), so every model is charged for those.
        n = float(np.mean([(b["labels"] > 0).sum(1).mean() for b in evals]))
        fanout = float(s2.grid_adjacency(t.size, t.size, t.radius).sum(1).mean())
        enc_macs, n_out_, in_spikes, enc_fan = float(steps * n), 0, 0.0, 0
    else:
        n = config.model.n_neurons
        fanout = float(s2.ring_adjacency(n, config.model.ring_k).sum(1).mean())
        n_out_ = n_out
        if task == "decoding":  # binary input spikes: one AC per encoder weight reached
            in_spikes = float(np.mean([b["inputs"].sum((1, 2)).mean() for b in evals]))
            enc_macs, enc_fan = 0.0, n
        else:
            enc_macs, in_spikes, enc_fan = float(steps * n_in * n), 0.0, 0
    if kind in ("s2net", "snn"):
        return s2.metrics.snn_energy(spikes, n_neurons=n, steps=steps, recurrent_fanout=fanout,
                                     n_out=n_out_, encoder_macs=enc_macs, input_spikes=in_spikes,
                                     encoder_fanout=enc_fan, sync=kind == "s2net",
                                     coupling_fanout=fanout)
    if kind == "oscillators":
        enc = enc_macs if task != "decoding" else steps * n_in * n
        readout = 2 * n * n_out_ if n_out_ else 0
        return s2.metrics.dense_energy(2 * steps * n * fanout + enc + readout)
    if task == "binding":  # ConvEmbed: one (2r+1)^2 kernel per lit pixel and channel
        return s2.metrics.dense_energy(2 * n * (2 * t.radius + 1) ** 2)
    return s2.metrics.dense_energy(steps * (n_in * n + n * fanout) + n * n_out_)


def _claims(table: dict) -> list:
    def get(task, kind, key):
        return table[task][kind][key]

    ari = {k: get("binding", k, "score") for k in MODELS}
    claims = [
        outputs.claim("Time-delayed synchronisation lets spiking neurons bind overlapping shapes "
                      "by phase (S²-Net ARI >= 0.8 on crossing bars).", "binding ARI, S²-Net",
                      ari["s2net"], ari["s2net"] >= 0.8),
        outputs.claim("Synchronisation improves binding over the same SNN without it "
                      "(ARI gain >= 0.1).", "ARI(S²-Net) - ARI(SNN)",
                      ari["s2net"] - ari["snn"], ari["s2net"] - ari["snn"] >= 0.1),
    ]
    for task in ("decoding", "signal"):
        acc_s, acc_a = get(task, "s2net", "score"), get(task, "ann", "score")
        e_s, e_a = get(task, "s2net", "pj"), get(task, "ann", "pj")
        claims.append(outputs.claim(
            f"S²-Net processes signals energy-efficiently ({task}): energy proxy below the "
            "equal-size ANN's at comparable accuracy (within 5 points).",
            f"{task}: energy ratio S²-Net/ANN; accuracy S²-Net vs ANN",
            {"energy_ratio": e_s / e_a, "acc_s2net": acc_s, "acc_ann": acc_a},
            e_s < e_a and acc_s >= acc_a - 0.05))
    gaps = {task: get(task, "s2net", "score") - max(get(task, "snn", "score"),
                                                    get(task, "oscillators", "score"))
            for task in TASKS}
    claims.append(outputs.claim(
        "S²-Net is at least as good as both of its parts alone (SNN without synchronisation, "
        "oscillators without spikes) on every task (within 2 points).",
        "min over tasks of S²-Net's score minus the better part's", min(gaps.values()),
        min(gaps.values()) >= -0.02))
    return claims


def run(config, workdir: str) -> dict:
    """Trains and evaluates every model on every task; writes results.json, report.md and
    a plot to ``workdir``; returns the results."""
    check_config(config)
    table, rows, started = {}, [], time.time()
    for task in TASKS:
        t = config[task]
        batch_fn, evals, n_in, n_out = _task_data(task, config)
        if task == "binding":
            loss = s2.binding_loss(config.model.spike_penalty, config.model.oscillator_weight)
        else:
            loss = s2.classify_loss(config.model.spike_penalty)
        table[task] = {}
        for kind in MODELS:
            t0 = time.time()
            model, _ = _build(kind, task, config, n_in, n_out)
            model, history = s2.fit(model, loss, batch_fn, steps=t.train_steps,
                                    learning_rate=t.learning_rate, seed=config.seed)
            ev = s2.evaluate(model, evals, task="binding" if task == "binding" else "classify",
                             seed=config.seed + 7)
            score = ev.get("ari", ev.get("accuracy"))
            energy = _energy(kind, task, config, model, ev["spikes"], evals, n_in, n_out)
            entry = {"score": score, "spikes": ev["spikes"], **energy,
                     "params": s2.n_params(model), "final_loss": history[-1]["loss"],
                     "seconds": time.time() - t0}
            table[task][kind] = entry
            rows.append({"task": task, "model": kind,
                         "metric": "ARI" if task == "binding" else "accuracy", **entry})
            logging.info("s2net %s/%s: score %.3f, %.3g pJ, %.1f spikes (%.0f s)", task, kind,
                         score, energy["pj"], ev["spikes"], entry["seconds"])
    results = {"table": table, "claims": _claims(table), "seconds": time.time() - started}
    plots = [_plot(table, workdir)]
    cols = ["task", "model", "metric", "score", "pj", "spikes", "mac", "ac", "params",
            "seconds"]
    report = ("## Accuracy and energy proxy per task and model\n\n"
              "score: ARI of phase clusters (binding) or test accuracy; pj: energy proxy per "
              "sample in picojoules (4.6 pJ/MAC, 0.9 pJ/AC, Horowitz 2014); spikes: spikes per "
              "sample; seconds: training + evaluation time. Counting rules in "
              "`lab.methods.s2net.metrics`; for binding every model is charged for the lit "
              "pixels only.\n\n"
              + outputs.markdown_table(rows, cols) +
              f"\nPreset `{config.preset}`, total {results['seconds']:.0f} s.\n")
    return outputs.write_outputs(workdir, name="s2net", config=config, results=results,
                                 report=report, plots=plots)


def _plot(table: dict, workdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    x = np.arange(len(TASKS))
    for i, kind in enumerate(MODELS):
        axes[0].bar(x + 0.2 * i, [table[t][kind]["score"] for t in TASKS], 0.2, label=kind)
        axes[1].bar(x + 0.2 * i, [table[t][kind]["pj"] for t in TASKS], 0.2, label=kind)
    for ax, title in zip(axes, ("score (ARI / accuracy)", "energy proxy (pJ / sample)"),
                         strict=True):
        ax.set_xticks(x + 0.3, TASKS)
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    return outputs.save_figure(fig, workdir, "s2net.png")


if __name__ == "__main__":
    launch.main(run)
