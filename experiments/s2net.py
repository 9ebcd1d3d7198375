"""S²-Net experiment: accuracy and energy proxy per task for each model, beside
shortcut / no-context baselines and oracles, with regime checks.

Tasks:

* binding (:func:`lab.methods.s2net.flicker_batch`): pixels of interleaved rows that
  differ only in the phase at which they fire; ARI of phase clusters. Beside the
  models: fixed local rules (orientation, intensity / single-frame k-means, connected
  components, position k-means, all untrained), a trained feed-forward conv pooled over
  time (``cnn``), and the temporal oracle (per-pixel Fourier phase over all frames and
  over S²-Net's readout window).
* reasoning (:func:`lab.methods.s2net.bound_query_batch`): "is colour 0 bound to
  shape 0?" from which feature channels fire together; accuracy, beside chance, a
  no-context readout of channel rates, and an oracle that compares the two channels'
  phases.
* decoding (direction from synthetic spike trains) and signal (waveform class).

Models: S²-Net; the same SNN without synchronisation; Kuramoto oscillators without
spikes; an equal-size ANN (binding: a recurrent grid conv, :class:`ConvRNN`; sequences:
a tanh RNN with the same neurons, scaffold, encoder and readout). Every model of a task
gets the same data, training steps, batch and learning rate, and trains once from each
of ``config.seeds``; a model's score is the mean over its seeds and its standard error
is over the seeds (an untrained baseline's over evaluation samples); a difference's SE
is ``sqrt(se_a^2 + se_b^2)``.
Energy proxy: see :mod:`lab.methods.s2net.metrics`.

  python -m experiments.s2net --config=configs/s2net.py:default --workdir=/tmp/s2net
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
from absl import logging
from flax import nnx

from configs.s2net import get_config
from lab import launch, outputs
from lab.config import SEEDS, check
from lab.methods import s2net as s2
from lab.methods.s2net import shortcuts as sh

MODELS = ("s2net", "snn", "oscillators", "ann")
TASKS = ("binding", "reasoning", "decoding", "signal")
BINDING_MODELS = (*MODELS, "cnn")  # binding adds the feed-forward conv baseline
SHORTCUTS = ("orientation", "intensity", "components", "frame", "position")

# Rules of the claims and the regime (fixed before the default run).
BIND_MIN_ARI = 0.8        # S²-Net binds: ARI at least this
MIN_GAIN = 0.1            # a gain worth the name, and beyond 2 standard errors
SHORTCUT_MAX_ARI = 0.2    # shortcuts (and the feed-forward conv) stay under this
ORACLE_MIN_ARI = 0.9      # the task is solvable from timing
CEILING_ARI = 0.9         # the baselines leave room above them
REASONING_MIN_GAIN = 0.2  # S²-Net answers the query: this far above the no-context readout
CHANCE_TOL = 0.1          # the no-context readout is within this of chance
CEILING_ACC = 0.97        # the reasoning baselines leave room above them
ORACLE_MIN_ACC = 0.9      # the query is answerable from timing


def models_for(task: str) -> tuple:
    """The trained models of a task."""
    return BINDING_MODELS if task == "binding" else MODELS


def tasks_of(config) -> tuple:
    """The tasks ``config.tasks`` selects, in :data:`TASKS` order."""
    chosen = {t.strip() for t in config.tasks.split(",")}
    return tuple(t for t in TASKS if t in chosen)


def _valid_tasks(value: str) -> bool:
    chosen = [t.strip() for t in value.split(",")]
    return bool(chosen) and all(t in TASKS for t in chosen)


def _checks():
    pos = (lambda v: v > 0, "a positive number")
    steps = (lambda v: v >= 1, ">= 1")
    return {"impl": (lambda v: v in ("", "xla", "pallas"), '"", "xla" or "pallas"'),
            "tasks": (_valid_tasks, f"comma-separated names out of {','.join(TASKS)}"),
            "model.n_neurons": pos, "model.window": pos, "model.delay": pos,
            "model.period": pos,
            "seeds": SEEDS,
            "binding.size": (lambda v: v >= 4, "an int >= 4"),
            "binding.n_objects": (lambda v: v >= 2, "an int >= 2"),
            "binding.train_steps": steps, "reasoning.train_steps": steps,
            "decoding.train_steps": steps, "signal.train_steps": steps}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _generator(task: str, config):
    """``gen(seed, index, batch) -> batch dict`` for a task."""
    t, period = config[task], config.model.period
    if task == "binding":
        return lambda s, i, b: s2.flicker_batch(s, i, b, size=t.size, steps=t.steps,
                                                n_objects=t.n_objects, period=period,
                                                rate=t.rate, depth=t.depth, jitter=t.jitter)
    if task == "reasoning":
        return lambda s, i, b: s2.bound_query_batch(s, i, b, n_objects=t.n_objects,
                                                    n_features=t.n_features, steps=t.steps,
                                                    period=period, rate=t.rate, depth=t.depth,
                                                    jitter=t.jitter)
    if task == "decoding":
        return lambda s, i, b: s2.spike_train_batch(s, i, b, n_in=t.n_in, steps=t.steps,
                                                    n_classes=t.n_classes,
                                                    peak_rate=t.peak_rate,
                                                    gain_noise=t.gain_noise)
    return lambda s, i, b: s2.signal_batch(s, i, b, steps=t.steps, noise=t.noise)


def _task_data(task: str, config):
    """Returns ``(batch_fn, eval_batches, n_in, n_out)`` for a task: ``batch_fn(seed,
    step)`` draws a training batch; the evaluation batches come from ``config.seed``, so
    every training seed of ``config.seeds`` and every untrained baseline is scored on the
    same samples."""
    t = config[task]
    gen = _generator(task, config)
    n_in, n_out = {"binding": (None, None), "reasoning": (2 * t.get("n_features", 0), 2),
                   "decoding": (t.get("n_in"), t.get("n_classes")),
                   "signal": (2, len(s2.tasks.SIGNAL_CLASSES))}[task]
    evals = [gen(config.seed + 1000, i, t.eval_batch) for i in range(t.eval_batches)]
    return (lambda seed, step: gen(seed, step, t.batch)), evals, n_in, n_out


def _build(kind: str, task: str, config, n_in, n_out, seed: int):
    m = config.model
    dyn = s2.Dynamics(beta=m.beta, threshold=m.threshold, period=m.period, window=m.window,
                      delay=m.delay, slope=m.slope)
    impl = config.impl or None
    rngs = nnx.Rngs(seed)
    if task == "binding":
        b = config.binding
        n, scaffold = b.size * b.size, {"grid": (b.size, b.size, b.radius)}
        if kind == "ann":
            return s2.ConvRNN(b.size, b.size, b.radius, rngs=rngs)
        if kind == "cnn":
            return s2.ConvEmbed(b.size, b.size, b.radius, rngs=rngs)
        if kind == "oscillators":
            return s2.KuramotoNet(n, scaffold, dynamics=dyn, drive=1.0, rngs=rngs)
        return s2.S2Net(n, scaffold, sync=kind == "s2net", dynamics=dyn, drive=b.drive,
                        impl=impl, rngs=rngs)
    n = m.n_neurons
    scaffold = {"adjacency": s2.ring_adjacency(n, m.ring_k)}
    if kind == "ann":
        return s2.RateRNN(n, scaffold, n_in=n_in, n_out=n_out, rngs=rngs)
    if kind == "oscillators":
        return s2.KuramotoNet(n, scaffold, n_in=n_in, n_out=n_out, dynamics=dyn,
                              drive=m.osc_drive, rngs=rngs)
    return s2.S2Net(n, scaffold, n_in=n_in, n_out=n_out, sync=kind == "s2net",
                    coupling="scalar", dynamics=dyn, drive=m.snn_drive, impl=impl, rngs=rngs)


def _energy(kind: str, task: str, config, spikes: float, evals, n_in, n_out) -> dict:
    """Operation counts and pJ per sample (conventions in lab.methods.s2net.metrics)."""
    t = config[task]
    steps = t.steps
    if task == "binding":
        # Only object pixels do any work (all of them on the flicker task), and every model
        # is charged for those.
        n = float(np.mean([(b["labels"] > 0).sum(1).mean() for b in evals]))
        fanout = float(s2.grid_adjacency(t.size, t.size, t.radius).sum(1).mean())
        enc_macs, n_out_, in_spikes, enc_fan = float(steps * n), 0, 0.0, 0
    else:
        n = config.model.n_neurons
        fanout = float(s2.ring_adjacency(n, config.model.ring_k).sum(1).mean())
        n_out_ = n_out
        if task in ("decoding", "reasoning"):  # binary input spikes: one AC per weight reached
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
        enc = enc_macs if task in ("binding", "signal") else steps * n_in * n
        readout = 2 * n * n_out_ if n_out_ else 0
        return s2.metrics.dense_energy(2 * steps * n * fanout + enc + readout)
    if task == "binding":
        if kind == "cnn":  # one (2r+1)^2 kernel per pixel, channel and frame
            return s2.metrics.dense_energy(steps * 2 * n * (2 * t.radius + 1) ** 2)
        # ConvRNN: per pixel, channel and step: neighbours, 2 self-recurrent, 1 input
        return s2.metrics.dense_energy(steps * 2 * n * (fanout + 3))
    return s2.metrics.dense_energy(steps * (n_in * n + n * fanout) + n * n_out_)


def _score(values) -> dict:
    v = np.asarray(values, np.float64)
    return {"score": float(v.mean()), "se": s2.metrics.standard_error(v)}


def over_seeds(per_seed: list[dict]) -> dict:
    """One model's entry from its per-seed entries: the mean of each number, ``se`` the
    standard error over the seeds (the spread between training runs, which on these tasks
    is far larger than the evaluation samples'; with one seed, that seed's sample SE),
    ``eval_se`` the mean sample SE and ``seed_scores`` each seed's score."""
    keys = [k for k in per_seed[0] if k not in ("se", "seconds")]
    scores = [e["score"] for e in per_seed]
    entry = {k: float(np.mean([e[k] for e in per_seed])) for k in keys}
    entry["se"] = (s2.metrics.standard_error(scores) if len(per_seed) > 1
                   else float(per_seed[0]["se"]))
    entry["eval_se"] = float(np.mean([e["se"] for e in per_seed]))
    entry["seed_scores"] = [float(s) for s in scores]
    entry["seconds"] = float(sum(e["seconds"] for e in per_seed))
    return entry


def _seed_scores(entry: dict) -> str:
    return ", ".join(f"{s:.2f}" for s in entry.get("seed_scores", ()))


def baselines(config, evals: dict) -> dict:
    """Untrained baselines on the evaluation sets: ``{"binding": {rule: {score, se}},
    "reasoning": {...}}``; binding's rules are :data:`SHORTCUTS` plus ``oracle`` (all
    frames) and ``oracle_window`` (the last ``model.window`` frames, what S²-Net's readout
    sees); reasoning's are ``chance`` (the majority class), ``no_context`` and ``oracle``."""
    b, r, period = config.binding, config.reasoning, config.model.period
    rules = {"orientation": lambda x: sh.orientation_rule(x, b.size),
             "intensity": lambda x: sh.intensity_kmeans(x, b.n_objects),
             "components": lambda x: sh.connected_components(x, b.size),
             "frame": lambda x: sh.frame_kmeans(x, b.n_objects),
             "position": lambda x: sh.position_kmeans(x, b.size, b.n_objects),
             "oracle": lambda x: sh.temporal_oracle(x, period, b.n_objects),
             "oracle_window": lambda x: sh.temporal_oracle(x[:, -config.model.window:],
                                                           period, b.n_objects)}
    out = {}
    if "binding" in evals:
        out["binding"] = {}
    for name, rule in (rules.items() if "binding" in evals else ()):
        out["binding"][name] = _score(np.concatenate(
            [sh.group_ari(rule(e["inputs"]), e["labels"], b.n_objects)
             for e in evals["binding"]]))
    if "reasoning" not in evals:
        return out
    out["reasoning"] = {}
    labels = np.concatenate([e["labels"] for e in evals["reasoning"]])
    majority = max(np.mean(labels), 1 - np.mean(labels))
    out["reasoning"]["chance"] = {"score": float(majority), "se": 0.0}
    train = _generator("reasoning", config)(config.seed + 2000, 0, r.no_context_samples)
    x = [e["inputs"] for e in evals["reasoning"]]
    out["reasoning"]["no_context"] = _score(np.concatenate(
        [sh.no_context_readout(train["inputs"], train["labels"], xi) for xi in x]) == labels)
    out["reasoning"]["oracle"] = _score(np.concatenate(
        [sh.query_oracle(xi, r.n_features, period, r.n_objects) for xi in x]) == labels)
    return out


def _gap(a: dict, b: dict) -> tuple[float, float]:
    """``a - b`` of two ``{score, se}`` entries and its standard error."""
    return a["score"] - b["score"], math.hypot(a["se"], b["se"])


def _beats(a: dict, b: dict, margin: float) -> bool:
    gap, se = _gap(a, b)
    return gap >= margin and gap > 2 * se


def _best(entries: dict, names) -> tuple[str, dict]:
    name = max(names, key=lambda k: entries[k]["score"])
    return name, entries[name]


def _claims(table: dict, base: dict) -> list:
    """The claims, decided on the measured table and the untrained baselines; a claim whose
    task is not in ``table`` is left out."""
    def get(task, kind, key="score"):
        return table[task][kind][key]

    claims = []
    if "binding" in table:
        bind = table["binding"]
        sc_name, shortcut = _best({**base["binding"], "cnn": bind["cnn"]}, (*SHORTCUTS, "cnn"))
        s2n, ann, snn = bind["s2net"], bind["ann"], bind["snn"]
        context = {"s2net": s2n["score"], "s2net_se": s2n["se"], "ann": ann["score"],
                   "ann_se": ann["se"], "best_shortcut": sc_name,
                   "shortcut": shortcut["score"], "shortcut_se": shortcut["se"]}
        claims += [
            outputs.claim(
                f"Time-delayed synchronisation lets spiking neurons bind objects defined only "
                f"by when their pixels fire: S²-Net's ARI >= {BIND_MIN_ARI}, and at least "
                f"{MIN_GAIN} (and 2 SE) above the equal-size ANN and the best shortcut "
                "baseline.",
                "binding ARI, S²-Net vs ANN (ConvRNN) and best shortcut (rules, trained CNN)",
                context, s2n["score"] >= BIND_MIN_ARI and _beats(s2n, ann, MIN_GAIN)
                and _beats(s2n, shortcut, MIN_GAIN)),
            outputs.claim(
                f"Synchronisation improves binding over the same SNN without it (ARI gain >= "
                f"{MIN_GAIN} and beyond 2 SE), and S²-Net is not below the ANN (within 2 SE).",
                "ARI(S²-Net) - ARI(SNN); ARI(S²-Net) - ARI(ANN)",
                {**context, "snn": snn["score"], "snn_se": snn["se"],
                 "gain": _gap(s2n, snn)[0]},
                _beats(s2n, snn, MIN_GAIN) and _gap(s2n, ann)[0] >= -2 * _gap(s2n, ann)[1]),
        ]
    if "reasoning" in table:
        rs, ra = table["reasoning"]["s2net"], table["reasoning"]["ann"]
        nc = base["reasoning"]["no_context"]
        claims.append(outputs.claim(
            f"S²-Net reasons over bound features (is colour 0 bound to shape 0?): accuracy at "
            f"least {REASONING_MIN_GAIN} (and 2 SE) above the no-context readout of channel "
            "rates, and within 5 points of the equal-size ANN.",
            "reasoning accuracy, S²-Net vs no-context readout and ANN (tanh RNN)",
            {"s2net": rs["score"], "s2net_se": rs["se"], "ann": ra["score"],
             "ann_se": ra["se"], "no_context": nc["score"], "no_context_se": nc["se"],
             "chance": base["reasoning"]["chance"]["score"]},
            _beats(rs, nc, REASONING_MIN_GAIN) and rs["score"] >= ra["score"] - 0.05))
    for task in ("decoding", "signal"):
        if task not in table:
            continue
        acc_s, acc_a = get(task, "s2net"), get(task, "ann")
        e_s, e_a = get(task, "s2net", "pj"), get(task, "ann", "pj")
        claims.append(outputs.claim(
            f"S²-Net processes signals energy-efficiently ({task}): energy proxy below the "
            "equal-size ANN's at comparable accuracy (within 5 points).",
            f"{task}: energy ratio S²-Net/ANN; accuracy S²-Net vs ANN",
            {"energy_ratio": e_s / e_a, "acc_s2net": acc_s, "acc_ann": acc_a},
            e_s < e_a and acc_s >= acc_a - 0.05))
    gaps = {task: get(task, "s2net") - max(get(task, "snn"), get(task, "oscillators"))
            for task in TASKS if task in table}
    claims.append(outputs.claim(
        "S²-Net is at least as good as both of its parts alone (SNN without synchronisation, "
        "oscillators without spikes) on every task (within 2 points).",
        "min over tasks of S²-Net's score minus the better part's", min(gaps.values()),
        min(gaps.values()) >= -0.02))
    return claims


def regime_checks(table: dict, base: dict) -> list:
    """What must hold for the claims to say anything (``results["regime"]``); the checks of
    a task not in ``table`` are left out."""
    checks = []
    if "binding" in table:
        bind = base["binding"]
        shortcuts = {**{k: bind[k]["score"] for k in SHORTCUTS},
                     "cnn": table["binding"]["cnn"]["score"]}
        worst = max(shortcuts, key=shortcuts.get)
        room = max(table["binding"]["snn"]["score"], table["binding"]["ann"]["score"])
        checks += [
            outputs.regime(f"binding is solvable from timing: the temporal oracle (per-pixel "
                           f"Fourier phase, all frames) has ARI >= {ORACLE_MIN_ARI}",
                           bind["oracle"]["score"], bind["oracle"]["score"] >= ORACLE_MIN_ARI),
            outputs.regime(f"no shortcut binds: every fixed local rule and the trained "
                           f"feed-forward CNN stay below ARI {SHORTCUT_MAX_ARI} "
                           f"(highest: {worst})", shortcuts,
                           shortcuts[worst] < SHORTCUT_MAX_ARI),
            outputs.regime(f"binding leaves room above the baselines: the SNN without "
                           f"synchronisation and the ANN are below ARI {CEILING_ARI}",
                           room, room < CEILING_ARI),
        ]
    if "reasoning" in table:
        rb = base["reasoning"]
        r_room = max(table["reasoning"]["snn"]["score"], table["reasoning"]["ann"]["score"])
        nc_gap = abs(rb["no_context"]["score"] - rb["chance"]["score"])
        checks += [
            outputs.regime(f"reasoning is answerable from timing: the phase oracle's accuracy "
                           f"is >= {ORACLE_MIN_ACC}", rb["oracle"]["score"],
                           rb["oracle"]["score"] >= ORACLE_MIN_ACC),
            outputs.regime(f"reasoning cannot be read from rates: the no-context readout is "
                           f"within {CHANCE_TOL} of chance", nc_gap, nc_gap <= CHANCE_TOL),
            outputs.regime(f"reasoning leaves room above the baselines: the SNN and the ANN "
                           f"are below accuracy {CEILING_ACC}", r_room, r_room < CEILING_ACC),
        ]
    return checks


def run(config, workdir: str) -> dict:
    """Trains and evaluates every model on every task; writes results.json, report.md and
    a plot to ``workdir``; returns the results."""
    check_config(config)
    table, rows, started, all_evals = {}, [], time.time(), {}
    for task in tasks_of(config):
        t = config[task]
        batch_fn, evals, n_in, n_out = _task_data(task, config)
        all_evals[task] = evals
        if task == "binding":
            loss = s2.binding_loss(config.model.spike_penalty, config.model.oscillator_weight,
                                   t.n_objects)
        else:
            loss = s2.classify_loss(t.get("spike_penalty", config.model.spike_penalty))
        table[task] = {}
        metric = "ari" if task == "binding" else "accuracy"
        for kind in models_for(task):
            per_seed = []
            for seed in config.seeds:
                t0 = time.time()
                model = _build(kind, task, config, n_in, n_out, seed)
                model, history = s2.fit(model, loss, functools.partial(batch_fn, seed),
                                        steps=t.train_steps, learning_rate=t.learning_rate,
                                        seed=seed)
                ev = s2.evaluate(model, evals,
                                 task="binding" if task == "binding" else "classify",
                                 seed=seed + 7, n_groups=t.get("n_objects", 2))
                energy = _energy(kind, task, config, ev["spikes"], evals, n_in, n_out)
                per_seed.append({"score": ev[metric], "se": ev[f"{metric}_se"],
                                 "spikes": ev["spikes"], **energy,
                                 "params": s2.n_params(model),
                                 "final_loss": history[-1]["loss"],
                                 "seconds": time.time() - t0})
                logging.info("s2net %s/%s seed %d: score %.3f, %.3g pJ, %.1f spikes (%.0f s)",
                             task, kind, seed, ev[metric], energy["pj"], ev["spikes"],
                             per_seed[-1]["seconds"])
            entry = over_seeds(per_seed)
            table[task][kind] = entry
            rows.append({"task": task, "model": kind,
                         "metric": "ARI" if task == "binding" else "accuracy", **entry,
                         "seeds": _seed_scores(entry)})
    base = baselines(config, all_evals)
    results = {"table": table, "baselines": base, "claims": _claims(table, base),
               "regime": regime_checks(table, base), "seconds": time.time() - started}
    plots = [_plot(table, base, workdir)]
    cols = ["task", "model", "metric", "score", "se", "seeds", "pj", "spikes", "mac", "ac",
            "params", "seconds"]
    base_rows = [{"task": task, "baseline": name, **entry}
                 for task in base for name, entry in base[task].items()]
    report = ("## Accuracy and energy proxy per task and model\n\n"
              f"score: ARI of phase clusters (binding) or test accuracy, the mean over "
              f"{len(config.seeds)} training seeds (seeds: each seed's score; every seed is "
              "scored on the same evaluation samples), se its standard error over the "
              "seeds; pj: energy proxy per sample in picojoules (4.6 pJ/MAC, 0.9 pJ/AC, "
              "Horowitz 2014); spikes: spikes per sample; seconds: training + evaluation "
              "time over the seeds. Counting rules in `lab.methods.s2net.metrics`; for binding "
              "every model is charged for the object pixels only. Binding's `cnn` is the "
              "trained feed-forward conv (per frame, pooled over time), a shortcut baseline."
              "\n\n" + outputs.markdown_table(rows, cols) +
              "\n## Untrained baselines and oracles\n\n"
              "binding: fixed rules scored by ARI (orientation: horizontal minus vertical lit "
              "neighbours within radius 2 in one frame; intensity: k-means of time-averaged "
              "intensity; components: 4-connected lit components of one frame; frame: k-means "
              "of one frame; position: k-means of pixel coordinates; oracle: per-pixel Fourier "
              "phase over all frames, oracle_window: over the last `model.window` frames). "
              "reasoning: accuracy of the majority class (chance), of a linear readout of "
              "channel rates (no_context) and of the phase comparison (oracle).\n\n"
              + (outputs.markdown_table(base_rows, ["task", "baseline", "score", "se"])
                 if base_rows else "(no binding or reasoning task in this run)\n") +
              f"\nPreset `{config.preset}`, total {results['seconds']:.0f} s.\n")
    return outputs.write_outputs(workdir, name="s2net", config=config, results=results,
                                 report=report, plots=plots)


def main_table(results) -> list[dict]:
    """The results page's table: one row per task and model or baseline (the trained models,
    then the untrained rules, oracles and no-context readout), score and standard error (a
    model's over its training seeds, whose scores ``seeds`` lists)."""
    rows = []
    for task, models in results["table"].items():
        rows += [{"task": task, "entry": name, "kind": "model", "score": m["score"],
                  "se": m["se"], "seeds": _seed_scores(m)}
                 for name, m in models.items()]
        rows += [{"task": task, "entry": name, "kind": "baseline", "score": b["score"],
                  "se": b["se"], "seeds": ""}
                 for name, b in results.get("baselines", {}).get(task, {}).items()]
    return rows


def _plot(table: dict, base: dict, workdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if t in table]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    x = np.arange(len(tasks))
    width = 0.8 / len(BINDING_MODELS)
    for i, kind in enumerate(BINDING_MODELS):
        have = [j for j, t in enumerate(tasks) if kind in table[t]]
        for ax, key in zip(axes, ("score", "pj"), strict=True):
            ax.bar(x[have] + width * i, [table[tasks[j]][kind][key] for j in have], width,
                   yerr=[table[tasks[j]][kind]["se"] for j in have] if key == "score"
                   else None, label=kind)
    if "binding" in base:
        name, best = _best(base["binding"], SHORTCUTS)
        axes[0].plot(x[tasks.index("binding")] + np.array([0, 0.8]), [best["score"]] * 2, "k:",
                     label=f"best shortcut ({name})")
    if "reasoning" in base:
        axes[0].plot(x[tasks.index("reasoning")] + np.array([0, 0.8]),
                     [base["reasoning"]["no_context"]["score"]] * 2, "k--", label="no context")
    for ax, title in zip(axes, ("score (ARI / accuracy)", "energy proxy (pJ / sample)"),
                         strict=True):
        ax.set_xticks(x + 0.4 - width / 2, tasks)
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    return outputs.save_figure(fig, workdir, "s2net.png")


if __name__ == "__main__":
    launch.main(run)
