"""IPG experiment: attribution of an outcome reward to MLP neurons on a model with a
planted mechanism (a known neuron set gates the chain's first step, several tokens before
the answer; :mod:`lab.methods.ipg.plant`).

Methods, each ranking every MLP neuron of the model by ``|score|``:

* ``ipg``: integrated policy gradient of the answer's correctness over trajectories
  sampled at temperature 1 (Gauss-Legendre rule), and ``ipg_riemann`` (the Riemann rule of
  ``config.riemann_method`` at the same steps);
* ``activation``: mean activation magnitude; ``grad_x_act``: gradient x activation of the
  answer logit; ``integrated_gradients``: IG of the answer logit on the same scale path;
  ``attribution_patching``: AtP of the clean-minus-corrupt answer logit difference,
  corrupting the gated operand ``x2``. These read the model's own greedy chain.
* ``random``: the expected precision of a random ranking (chance).

Per method: precision@k (k = the planted set's size) and the greedy accuracy after its
top-k neurons are ablated (scale 0) or amplified (``config.amplify``).

The second component type (``config.sae``): a sparse autoencoder trained on the residual
stream after the planted layer (on the model's own chains), whose features every method
ranks again. No feature is planted, so the truth is measured: each feature ablated alone,
exhaustively (:func:`sae_features`); the methods are scored by their rank agreement with
it and by what ablating their top-k features does. Each seed of
``config.seeds`` trains its own planted model on its own data (:func:`run_seed`); the
claims and regime checks read the means over seeds (:func:`over_seeds`), and the report
lists each seed's numbers.

  python -m experiments.ipg --config=configs/ipg.py:default --workdir=/tmp/ipg
"""

from __future__ import annotations

import time

import numpy as np

from configs.ipg import get_config
from lab import launch, outputs
from lab.config import SEEDS, check
from lab.methods import ipg
from lab.methods.ipg.plant import EOS
from lab.nn import fit_sae, sae_stats

METHODS = ("ipg", "ipg_riemann", "activation", "grad_x_act", "integrated_gradients",
           "attribution_patching")
ANSWER_LOGIT = ("activation", "grad_x_act", "integrated_gradients", "attribution_patching")

# Rules of the claims and the regime (fixed before the default run).
PRECISION_MIN = 0.5        # IPG localises: at least half its top-k are planted
PRECISION_MARGIN = 0.25    # IPG above the best answer-logit baseline by this much
ABLATION_DROP = 0.3        # ablating IPG's top-k lowers accuracy by at least this
ABLATION_MARGIN = 0.1      # ... and by this much more than any baseline's top-k
COMPLETENESS_TOL = 0.15    # |sum IPG - (J(1) - J(0))| at most this
PLANT_DROP = 0.5           # regime: ablating the planted set costs this much accuracy
RANDOM_DROP_MAX = 0.1      # regime: no random set of as many other neurons costs more
TASK_MIN = 0.9             # regime: the model solves the task
REWARD_RANGE = (0.05, 0.95)  # regime: the sampled reward is not constant
CHANCE_TOL = 0.1           # regime: the majority answer stays within this of chance
MEDIATED_MIN = 0.9         # regime: with the chain given, the answer survives the ablation
RANK_MARGIN = 0.1          # features: IPG's rank agreement with exhaustive ablation above
                           # the best answer-logit baseline's by this much
SAE_FVE_MIN = 0.9          # regime: the SAE reconstructs the residual stream
TRUTH_DROP = 0.02          # a feature whose single ablation costs this much has an effect
TRUTH_MIN = 2              # regime: at least this many features have one
SAE_PART = "SAE features"  # the part of the report the feature claims and checks belong to


def _checks():
    return {
        "ipg.steps": (lambda v: v >= 1, "an int >= 1"),
        "ipg.samples": (lambda v: v >= 1, "an int >= 1"),
        "ipg.method": (lambda v: v in ipg.METHODS, f"one of {ipg.METHODS}"),
        "riemann_method": (lambda v: v in ipg.METHODS, f"one of {ipg.METHODS}"),
        "seeds": SEEDS,
        "ipg.temperature": (lambda v: v > 0, "> 0"),
        "ipg.n_prompts": (lambda v: v >= 2, "an int >= 2"),
        "plant.plant_layer": (lambda v: v >= 0, "a layer index >= 0"),
        "n_eval": (lambda v: v >= 1, "an int >= 1"),
        "ig_steps": (lambda v: v >= 1, "an int >= 1"),
        "sae.n_features": (lambda v: v >= 2, "an int >= 2"),
        "sae.l1": (lambda v: v >= 0, ">= 0"),
        "sae.steps": (lambda v: v >= 1, "an int >= 1"),
        "sae.n_prompts": (lambda v: v >= 1, "an int >= 1"),
    }


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    check(config, get_config, _checks())
    p = config.plant
    if p.plant_layer >= p.n_layers:
        raise ValueError(f"config.plant.plant_layer={p.plant_layer} is invalid; expected a "
                         f"layer in [0, {p.n_layers})")
    if not 1 <= p.n_planted < p.d_ff:
        raise ValueError(f"config.plant.n_planted={p.n_planted} is invalid; expected in "
                         f"[1, {p.d_ff})")
    return config


def claim_rules(m: dict) -> list[dict]:
    """The claims, decided on the measured ``m`` (one seed's, or the means over seeds):
    ``m["methods"][name]`` with ``precision``, ``ablated_drop``; ``m["completeness"]``
    with ``gap``, ``|sum ipg - (J(1) - J(0))|``."""
    meth = m["methods"]
    p_ipg = meth["ipg"]["precision"]
    best_base = max(ANSWER_LOGIT, key=lambda n: meth[n]["precision"])
    drop = meth["ipg"]["ablated_drop"]
    best_drop = max(ANSWER_LOGIT, key=lambda n: meth[n]["ablated_drop"])
    gap = m["completeness"]["gap"]
    return [
        outputs.claim("IPG localises the components that control the outcome: precision@k "
                      f"on the planted neurons >= {PRECISION_MIN}",
                      "precision@k of ipg", p_ipg, p_ipg >= PRECISION_MIN),
        outputs.claim("Baselines that read only the answer logit miss components whose "
                      "effect is mediated by the trajectory: IPG's precision@k exceeds the "
                      f"best of them by >= {PRECISION_MARGIN}",
                      f"precision@k ipg - {best_base}",
                      p_ipg - meth[best_base]["precision"],
                      p_ipg - meth[best_base]["precision"] >= PRECISION_MARGIN),
        outputs.claim("Ablating IPG's top-k components modulates the reasoning outcome: "
                      f"accuracy falls by >= {ABLATION_DROP}",
                      "accuracy drop, ipg top-k ablated", drop, drop >= ABLATION_DROP),
        outputs.claim("IPG's top-k move the outcome more than any answer-logit baseline's "
                      f"top-k (by >= {ABLATION_MARGIN} accuracy)",
                      f"accuracy drop ipg - {best_drop}", drop - meth[best_drop]["ablated_drop"],
                      drop - meth[best_drop]["ablated_drop"] >= ABLATION_MARGIN),
        outputs.claim("Path integration makes the attributions complete: they sum to the "
                      f"reward difference J(1) - J(0) within {COMPLETENESS_TOL}",
                      "|sum ipg - (J(1) - J(0))|", gap, gap <= COMPLETENESS_TOL),
    ] + (sae_claim_rules(m["sae"]) if m.get("sae") else [])


def sae_claim_rules(f: dict) -> list[dict]:
    """The claims on SAE features, from ``f["methods"][name]`` with ``rank`` (Spearman
    agreement with the exhaustive single-feature ablation) and ``ablated_drop``."""
    meth = f["methods"]
    best_rank = max(ANSWER_LOGIT, key=lambda n: meth[n]["rank"])
    best_drop = max(ANSWER_LOGIT, key=lambda n: meth[n]["ablated_drop"])
    rank = meth["ipg"]["rank"] - meth[best_rank]["rank"]
    drop = meth["ipg"]["ablated_drop"]
    margin = drop - meth[best_drop]["ablated_drop"]
    return [
        outputs.claim("IPG ranks the features by their measured effect on the outcome (each "
                      "ablated alone) better than any answer-logit baseline: Spearman above "
                      f"the best of them by >= {RANK_MARGIN}",
                      f"rank agreement ipg - {best_rank}", rank, rank >= RANK_MARGIN,
                      part=SAE_PART),
        outputs.claim("Ablating IPG's top-k features modulates the outcome: accuracy falls "
                      f"by >= {ABLATION_DROP}", "accuracy drop, ipg top-k features ablated",
                      drop, drop >= ABLATION_DROP, part=SAE_PART),
        outputs.claim("IPG's top-k features move the outcome more than any answer-logit "
                      f"baseline's top-k (by >= {ABLATION_MARGIN} accuracy)",
                      f"accuracy drop ipg - {best_drop} (features)", margin,
                      margin >= ABLATION_MARGIN, part=SAE_PART),
    ]


def regime_rules(m: dict) -> list[dict]:
    """The regime checks on the measured ``m`` (one seed's, or the means over seeds):
    ``plant`` with ``clean`` accuracy, ``drop`` (the planted set ablated) and
    ``worst_random_drop`` (the costliest control set; over seeds, the worst of all);
    ``reward_mean``; ``majority``, ``chance``; ``mediated``."""
    p = m["plant"]
    drop, rdrop = p["drop"], p["worst_random_drop"]
    lo, hi = REWARD_RANGE
    return [
        outputs.regime(f"the plant holds: ablating the planted set costs >= {PLANT_DROP} "
                       "accuracy", drop, drop >= PLANT_DROP),
        outputs.regime(f"random sets of as many other (non-planted) neurons cost <= "
                       f"{RANDOM_DROP_MAX} accuracy (worst set)", rdrop,
                       rdrop <= RANDOM_DROP_MAX),
        outputs.regime(f"the model solves the task (greedy accuracy >= {TASK_MIN})",
                       p["clean"], p["clean"] >= TASK_MIN),
        outputs.regime(f"the sampled reward is neither always 0 nor always 1 (mean over "
                       f"IPG's samples in [{lo}, {hi}])", m["reward_mean"],
                       lo <= m["reward_mean"] <= hi),
        outputs.regime(f"no shortcut: the majority answer is within {CHANCE_TOL} of chance",
                       m["majority"], m["majority"] <= m["chance"] + CHANCE_TOL),
        outputs.regime("the planted effect is mediated by the trajectory: with the clean "
                       f"chain given, the answer survives the planted ablation (>= "
                       f"{MEDIATED_MIN})", m["mediated"], m["mediated"] >= MEDIATED_MIN),
    ] + (sae_regime_rules(m["sae"]) if m.get("sae") else [])


def sae_regime_rules(f: dict) -> list[dict]:
    """The regime of the SAE-feature comparison: ``fve`` of the SAE on held-out chains and
    ``n_effective``, the number of features whose single ablation costs >= TRUTH_DROP
    (over seeds, the fewest)."""
    return [
        outputs.regime(f"the SAE reconstructs the residual stream (fraction of variance "
                       f"explained >= {SAE_FVE_MIN} on held-out chains)", f["fve"],
                       f["fve"] >= SAE_FVE_MIN, part=SAE_PART),
        outputs.regime(f"the measured truth is not degenerate: >= {TRUTH_MIN} features each "
                       f"cost >= {TRUTH_DROP} accuracy when ablated alone (fewest over seeds)",
                       f["n_effective"], f["n_effective"] >= TRUTH_MIN, part=SAE_PART),
    ]


def random_sets(rng, shape, planted, k, n):
    """``n`` random sets of ``k`` (layer, neuron) pairs outside ``planted``, the control of
    the plant check, drawn as the training draws its random ablations: a set that held a
    planted neuron would measure part of the plant (one planted neuron alone can cost
    0.3-0.65 accuracy, docs/ipg.md)."""
    taken = set((planted[:, 0] * shape[1] + planted[:, 1]).tolist())
    others = np.array([i for i in range(shape[0] * shape[1]) if i not in taken])
    out = []
    for _ in range(n):
        flat = rng.choice(others, k, replace=False)
        out.append(np.stack([flat // shape[1], flat % shape[1]], axis=1))
    return out


def _gen(task) -> dict:
    return dict(max_new_tokens=task.completion_len, stop_tokens=(EOS,))


def _reward(task, xs):
    """The outcome reward of completions of ``task.prompts(xs)``."""
    return lambda rows, comp: task.rewards(xs[rows], comp)


def _accuracy(model, task, xs, space=None):
    """``scale -> greedy accuracy`` on ``xs``'s prompts under ``space``'s scale (None:
    the model as it is)."""
    prompts = task.prompts(xs)
    return lambda scale=None: ipg.outcome(model, prompts, _reward(task, xs), scale,
                                          space=space, **_gen(task))


def _ipg(config, seed, model, task, ixs, method, space=None) -> ipg.Attribution:
    """IPG of the answer's correctness on ``ixs``'s prompts, with ``config.ipg``'s path."""
    c = config.ipg
    return ipg.integrated_policy_gradient(
        model, task.prompts(ixs), _reward(task, ixs), method=method, steps=c.steps,
        baseline=c.baseline, temperature=c.temperature, samples=c.samples, seed=seed,
        space=space, **_gen(task))


def _completeness(config, seed, model, task, rxs, att, shape, space=None) -> dict:
    """``|sum IPG - (J(1) - J(baseline))|``, ``J`` sampled at the path's ends on the
    trajectories' prompts ``rxs``."""
    c = config.ipg
    kw = dict(temperature=c.temperature, seed=seed + 7, space=space, **_gen(task))
    prompts, reward = task.prompts(rxs), _reward(task, rxs)
    j1 = ipg.outcome(model, prompts, reward, None, **kw)
    j0 = ipg.outcome(model, prompts, reward, np.full(shape, c.baseline, np.float32), **kw)
    total = float(att.scores.sum())
    return {"sum": total, "delta": j1 - j0, "gap": abs(total - (j1 - j0)), "j1": j1, "j0": j0}


def _answer_logit_scores(config, model, probe, space=None) -> dict:
    """The four answer-logit baselines' scores on the greedy chains of ``probe``."""
    seqs, index, target = probe["seqs"], probe["index"], probe["target"]
    return {
        "activation": ipg.activation_magnitude(model, seqs, space),
        "grad_x_act": ipg.gradient_x_activation(model, seqs, index, target, space),
        "integrated_gradients": ipg.integrated_gradients(
            model, seqs, index, target, steps=config.ig_steps, baseline=config.ipg.baseline,
            space=space),
        "attribution_patching": ipg.attribution_patching(
            model, seqs, probe["cseqs"], index, target, probe["ctarget"], space),
    }


def _top_k_outcomes(config, scores, k, shape, acc, clean) -> dict:
    """Per method: greedy accuracy with its top-``k`` components ablated / amplified."""
    out = {}
    for name, sc in scores.items():
        top = ipg.top_components(sc, k)
        abl = acc(ipg.set_scale(shape, top, 0.0))
        amp = acc(ipg.set_scale(shape, top, config.amplify))
        out[name] = {"ablated": abl, "ablated_drop": clean - abl, "amplified": amp,
                     "amplified_change": amp - clean, "top": top.tolist()}
    return out


def run_seed(config, seed: int) -> tuple[dict, dict]:
    """One seed: trains the planted model, attributes with every method, ablates /
    amplifies their top-k. Returns ``(measured, scores)``: the numbers the claims read,
    and each method's score array (for the plot)."""
    t0 = time.time()
    task = ipg.ChainTask(**config.task)
    pc = ipg.PlantConfig(seed=seed, **config.plant)
    model = ipg.train_planted(task, pc)
    timing = {"train_s": time.time() - t0}
    planted = ipg.planted_neurons(pc)
    shape, k = (pc.n_layers, pc.d_ff), pc.n_planted
    gen = _gen(task)
    xs = task.operands(config.n_eval, seed + 1)
    acc = _accuracy(model, task, xs)
    clean = acc()
    rng = np.random.default_rng([seed, 5])
    plant = {"clean": clean, "planted_ablated": acc(ipg.set_scale(shape, planted, 0.0)),
             "random_ablated": [acc(ipg.set_scale(shape, s, 0.0))
                                for s in random_sets(rng, shape, planted, k,
                                                     config.n_random_sets)]}
    answers = task.answers(xs)
    majority = float(np.max(np.bincount(answers, minlength=task.modulus)) / answers.size)

    # IPG on sampled trajectories.
    t1 = time.time()
    ixs = task.operands(config.ipg.n_prompts, seed + 2)
    att = _ipg(config, seed, model, task, ixs, config.ipg.method)
    timing["ipg_s"] = time.time() - t1
    att_r = _ipg(config, seed, model, task, ixs, config.riemann_method)
    rxs = np.repeat(ixs, config.ipg.samples, axis=0)    # J at the path's ends, as sampled

    # Answer-logit baselines on the model's own greedy chains.
    t2 = time.time()
    axs = task.operands(config.n_attr, seed + 3)
    ap = task.prompts(axs)
    comp, _ = ipg.sample(model, ap, np.ones(shape), temperature=0.0, seed=0, **gen)
    seqs = np.concatenate([ap, comp], axis=1)[:, :-1]
    index = task.prompt_len + task.answer_index - 1     # logits that predict the answer
    target = comp[:, task.answer_index]
    cxs = axs.copy()
    cxs[:, 1] = (cxs[:, 1] + rng.integers(1, task.modulus, len(cxs))) % task.modulus
    ccomp, _ = ipg.sample(model, task.prompts(cxs), np.ones(shape), temperature=0.0, seed=0,
                          **gen)
    cseqs = np.concatenate([task.prompts(cxs), ccomp], axis=1)[:, :-1]
    probe = dict(xs=xs, clean=clean, ixs=ixs, rxs=rxs, seqs=seqs, cseqs=cseqs, index=index,
                 target=target, ctarget=ccomp[:, task.answer_index])
    scores = {"ipg": att.scores, "ipg_riemann": att_r.scores,
              **_answer_logit_scores(config, model, probe)}
    timing["baselines_s"] = time.time() - t2
    # With the clean chain given (teacher forcing), does the answer need the planted set?
    g = ipg.answer_logits(model, seqs, index, ipg.set_scale(shape, planted, 0.0))
    mediated = float(np.mean(np.argmax(g, axis=-1) == target))

    methods = _top_k_outcomes(config, scores, k, shape, acc, clean)
    for name, m in methods.items():
        m["precision"] = ipg.precision_at_k(scores[name], planted, k)
    # The planted neurons IPG left out of its top-k, ablated alone: does the trained model
    # use them at all? (The plant ablates the whole set in training; a model may come to
    # rely on part of it.)
    found = {tuple(t) for t in methods["ipg"]["top"]}
    missed = np.array([p for p in planted.tolist() if tuple(p) not in found], np.int64)
    plant["missed_by_ipg"] = missed.tolist()
    plant["missed_ablated"] = acc(ipg.set_scale(shape, missed, 0.0)) if missed.size else None
    plant["drop"] = clean - plant["planted_ablated"]
    plant["worst_random_drop"] = clean - min(plant["random_ablated"])
    measured = {
        "seed": seed, "methods": methods, "plant": plant, "majority": majority,
        "chance": 1.0 / task.modulus, "mediated": mediated,
        "reward_mean": float(np.mean(np.concatenate([att.rewards, att_r.rewards]))),
        "completeness": _completeness(config, seed, model, task, rxs, att, shape),
        "random_precision": k / (shape[0] * shape[1]), "planted": planted.tolist(), "k": k,
        "path_rewards": att.rewards.tolist(), "path_alphas": att.alphas.tolist(),
    }
    if config.sae.enabled:
        t3 = time.time()
        measured["sae"] = sae_features(config, seed, model, task, probe)
        timing["sae_s"] = time.time() - t3
    timing["total_s"] = time.time() - t0
    measured["timing"] = timing
    measured["claims_held"] = sum(c["holds"] for c in claim_rules(measured))
    return measured, scores


def sae_features(config, seed: int, model, task, probe: dict) -> dict:
    """The SAE-feature comparison of one seed's planted model: trains an SAE
    (:func:`lab.nn.fit_sae`) on the residual stream after the planted layer at every
    position of the model's own greedy chains on ``config.sae.n_prompts`` fresh prompts;
    measures each feature's effect on the outcome by ablating it alone (the truth, on the
    same prompts as the accuracies); runs IPG and the answer-logit baselines on the
    features (the neuron comparison's prompts, ``probe``); returns, per method, the rank
    agreement with the truth, precision@k against its top-k and the accuracy after its
    top-k are ablated / amplified, with the SAE's statistics. ``k``: the number of
    features whose single ablation costs >= TRUTH_DROP, at most the planted set's size
    (at least 1)."""
    sc, layer = config.sae, config.plant.plant_layer
    fx = task.operands(sc.n_prompts, seed + 4)
    comp, _ = ipg.sample(model, task.prompts(fx), None, temperature=0.0, seed=0, **_gen(task))
    chains = np.concatenate([task.prompts(fx), comp], axis=1)[:, :-1]
    acts = ipg.residual_stream(model, chains, layer)
    sae = fit_sae(acts.reshape(-1, acts.shape[-1]), sc.n_features, l1=sc.l1, steps=sc.steps,
                  batch=sc.batch, learning_rate=sc.learning_rate, seed=seed)
    held = ipg.residual_stream(model, probe["seqs"], layer)
    stats = sae_stats(sae, held.reshape(-1, held.shape[-1]))
    space = ipg.SAEFeatures({layer: sae})
    shape = space.shape(model)
    acc = _accuracy(model, task, probe["xs"], space)
    clean = probe["clean"]
    truth = np.array([[clean - acc(ipg.set_scale(shape, np.array([[0, j]]), 0.0))
                       for j in range(shape[1])]])
    n_effective = int(np.sum(truth >= TRUTH_DROP))
    k = max(1, min(config.plant.n_planted, n_effective))
    att = _ipg(config, seed, model, task, probe["ixs"], config.ipg.method, space)
    scores = {"ipg": att.scores, **_answer_logit_scores(config, model, probe, space),
              "exhaustive_ablation": truth}
    true_top = ipg.top_components(truth, k)
    methods = _top_k_outcomes(config, scores, k, shape, acc, clean)
    for name, m in methods.items():
        m.update(rank=ipg.rank_correlation(scores[name], truth),
                 precision=ipg.precision_at_k(scores[name], true_top, k))
    return {"k": k, "layer": layer, "n_features": shape[1], **stats,
            "n_effective": n_effective,
            "all_ablated": acc(np.zeros(shape, np.float32)), "truth_max": float(truth.max()),
            "methods": methods, "random_precision": k / shape[1],
            "completeness": _completeness(config, seed, model, task, probe["rxs"], att, shape,
                                          space),
            "path_rewards": att.rewards.tolist()}


def over_seeds(per_seed: list[dict]) -> dict:
    """The numbers the claims and regime checks read, from each seed's :func:`run_seed`:
    every method's precision@k, accuracies and changes, the plant's accuracy and drop,
    the completeness gap, the sampled reward, the majority share and the mediated
    accuracy are means over seeds; the worst control set's drop is the worst over seeds.
    ``per_seed`` keeps each seed's numbers; ``planted``, ``path_*`` and the methods' top-k
    are the first seed's (the plot's)."""
    first = per_seed[0]
    keys = ("precision", "ablated", "ablated_drop", "amplified", "amplified_change")
    methods = {n: {**outputs.means_over(per_seed, keys, "methods", n),
                   "top": first["methods"][n]["top"]} for n in first["methods"]}
    plant = outputs.means_over(per_seed, ("clean", "planted_ablated", "drop"), "plant")
    plant["worst_random_drop"] = max(s["plant"]["worst_random_drop"] for s in per_seed)
    out = {}
    if first.get("sae"):
        fs = [s["sae"] for s in per_seed]
        fkeys = ("rank", "precision", "ablated", "ablated_drop", "amplified",
                 "amplified_change")
        out["sae"] = {
            **outputs.means_over(fs, ("fve", "l0", "dead", "all_ablated", "truth_max", "k",
                                      "random_precision")),
            "methods": {n: outputs.means_over(fs, fkeys, "methods", n)
                        for n in fs[0]["methods"]},
            "completeness": outputs.means_over(fs, fs[0]["completeness"], "completeness"),
            "n_effective": min(f["n_effective"] for f in fs),
            "layer": fs[0]["layer"], "n_features": fs[0]["n_features"]}
    return {**out, "methods": methods, "plant": plant,
            "completeness": outputs.means_over(per_seed, first["completeness"],
                                               "completeness"),
            **outputs.means_over(per_seed, ("majority", "chance", "mediated", "reward_mean",
                                            "random_precision")),
            "k": first["k"], "planted": first["planted"],
            "path_rewards": first["path_rewards"], "path_alphas": first["path_alphas"],
            "seeds": [s["seed"] for s in per_seed], "per_seed": per_seed}


def run(config, workdir: str) -> dict:
    """Runs every seed of ``config.seeds`` (:func:`run_seed`) and decides the claims and
    regime checks on the means over seeds (:func:`over_seeds`); writes results.json,
    report.md and a plot (the first seed's scores); returns the results."""
    check_config(config)
    t0 = time.time()
    runs = [run_seed(config, seed) for seed in config.seeds]
    measured = over_seeds([m for m, _ in runs])
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing={"total_s": time.time() - t0})
    plots = [_plot(results, runs[0][1], np.asarray(results["planted"]), workdir)]
    return outputs.write_outputs(workdir, name="ipg", config=config, results=results,
                                 report=_report(results), plots=plots)


def main_table(results) -> list[dict]:
    """One row per attribution method (and chance): precision@k, accuracy after ablating
    and after amplifying its top-k, and the changes from the unablated accuracy (means
    over seeds)."""
    rows = []
    for name, m in results["methods"].items():
        rows.append({"method": name, "precision@k": m["precision"],
                     "acc ablated": m["ablated"], "drop": m["ablated_drop"],
                     "acc amplified": m["amplified"], "change": m["amplified_change"]})
    rows.append({"method": "random ranking (chance)", "precision@k": results["random_precision"],
                 "acc ablated": None, "drop": None, "acc amplified": None, "change": None})
    return rows


def sae_table(results) -> list[dict]:
    """One row per method on the SAE features (means over seeds): rank agreement with the
    exhaustive single-feature ablation (Spearman), precision@k against its top-k, the
    accuracy after ablating / amplifying the top-k; ``exhaustive_ablation`` is the truth
    itself, ``random ranking`` chance."""
    f = results["sae"]
    rows = [{"method": name, "rank agreement": m["rank"], "precision@k": m["precision"],
             "acc ablated": m["ablated"], "drop": m["ablated_drop"],
             "acc amplified": m["amplified"], "change": m["amplified_change"]}
            for name, m in f["methods"].items()]
    rows.append({"method": "random ranking (chance)", "rank agreement": 0.0,
                 "precision@k": f["random_precision"], "acc ablated": None, "drop": None,
                 "acc amplified": None, "change": None})
    return rows


def seed_table(results) -> list[dict]:
    """One row per seed: the numbers each claim and the plant check read."""
    rows = []
    for s in results["per_seed"]:
        m, p = s["methods"], s["plant"]
        rows.append({
            "seed": s["seed"], "precision@k ipg": m["ipg"]["precision"],
            "best baseline": max(m[n]["precision"] for n in ANSWER_LOGIT),
            "drop ipg": m["ipg"]["ablated_drop"],
            "best baseline drop": max(m[n]["ablated_drop"] for n in ANSWER_LOGIT),
            "completeness gap": s["completeness"]["gap"], "unablated": p["clean"],
            "planted drop": p["drop"], "worst control drop": p["worst_random_drop"],
            "planted missed by ipg, ablated": p["missed_ablated"],
            "claims held": s["claims_held"], "seconds": s["timing"]["total_s"]})
        if s.get("sae"):
            f = s["sae"]["methods"]
            rows[-1].update({
                "features: fve": s["sae"]["fve"], "k": s["sae"]["k"],
                "rank ipg": f["ipg"]["rank"],
                "best baseline rank": max(f[n]["rank"] for n in ANSWER_LOGIT),
                "feature drop ipg": f["ipg"]["ablated_drop"],
                "best baseline feature drop": max(f[n]["ablated_drop"] for n in ANSWER_LOGIT)})
    return rows


def _report(results) -> str:
    p, c = results["plant"], results["completeness"]
    sae = []
    if results.get("sae"):
        f = results["sae"]
        fc = f["completeness"]
        sae = [f"## SAE features (layer {f['layer']}, {f['n_features']} features; means over "
               "seeds)\n",
               outputs.markdown_table(sae_table(results)), "\n",
               f"SAE on held-out chains: fraction of variance explained {f['fve']:.3f}, "
               f"{f['l0']:.1f} active features per position, {f['dead']:.2f} of them dead. "
               f"k = {f['k']:.1f} (features whose single ablation costs >= {TRUTH_DROP}, at "
               f"most the planted set's size; the fewest over seeds {f['n_effective']}); the "
               f"costliest single feature {f['truth_max']:.3f}; all features ablated: "
               f"accuracy {f['all_ablated']:.3f}. Completeness on features: sum of IPG "
               f"{fc['sum']:.3f}, J(1) - J(0) {fc['delta']:.3f}, gap {fc['gap']:.3f}.\n"]
    return "\n".join([
        f"## Attribution (k = {results['k']} planted neurons; means over seeds "
        f"{results['seeds']})\n",
        outputs.markdown_table(main_table(results)), "\n",
        *sae,
        "## Each seed (its own planted model and data)\n",
        outputs.markdown_table(seed_table(results)), "\n",
        f"Plant (means): unablated {p['clean']:.3f}, planted set ablated "
        f"{p['planted_ablated']:.3f}; the worst control set (as many other neurons) cost "
        f"{p['worst_random_drop']:.3f}. Majority answer (no context) "
        f"{results['majority']:.3f}. Completeness: sum of IPG {c['sum']:.3f}, J(1) - J(0) "
        f"{c['delta']:.3f}, mean gap {c['gap']:.3f}. Total {results['timing']['total_s']:.0f} "
        "s. The plot is the first seed's.\n"])


def _plot(results, scores, planted, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(scores)
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(3 * (len(names) + 1), 2.8))
    axes[0].plot(results["path_alphas"], results["path_rewards"], "o-")
    axes[0].set(title="IPG path: mean reward", xlabel="scale alpha", ylim=(-0.05, 1.05))
    for ax, name in zip(axes[1:], names, strict=True):
        s = np.abs(np.asarray(scores[name])).ravel()
        s = s / (s.max() or 1.0)
        is_p = np.zeros(s.size, bool)
        is_p[planted[:, 0] * np.asarray(scores[name]).shape[1] + planted[:, 1]] = True
        ax.bar(np.nonzero(~is_p)[0], s[~is_p], color="0.6", width=1.0)
        ax.bar(np.nonzero(is_p)[0], s[is_p], color="C3", width=1.0, label="planted")
        ax.set(title=name, xlabel="neuron (layer * d_ff + j)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "ipg.png")


if __name__ == "__main__":
    launch.main(run)
