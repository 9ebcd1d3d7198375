"""CoT trajectory geometry: does the shape of a chain's hidden-state curve tell how hard the
problem is, and whether the chain will be right, beyond what its length says?

  python -m experiments.cot_geometry --config=configs/cot_geometry.py:default --workdir=DIR

1. Problems with difficulty known by construction: held-out arithmetic chains of 1-5 steps
   (level = steps; :func:`lab.data.synthetic.arithmetic`, prompts outside the zoo model's
   training set), or MATH500 levels 1-5 (``config.math500.path``) for a Hugging Face
   checkpoint (``config.model=<dir>``).
2. Greedy chains with every layer's hidden states (:func:`lab.methods.cot_geometry.
   trajectories`); correctness by the final answer.
3. Easy vs hard (``easy_levels`` vs ``hard_levels``): the AUC of ``d_rho`` and the
   participation ratio of the whole chain, beside the length-only baselines (generated
   tokens, prompt tokens) and two length-controlled ``d_rho``: averaged over windows of
   equal token count, and residualised on log length.
4. Correctness from the first 20% of each chain: a logistic regression on the kinematic
   features, fitted on one half of the problems of every level and scored on the other,
   beside the baselines difficulty alone, the model's confidence (mean token log-prob of
   the same prefix) and the prefix's length; within each level (difficulty fixed) too.
5. Transfer: the predictor fitted on ``transfer_source`` levels and scored on
   ``transfer_target`` levels (and the reverse), against one fitted on the target levels
   themselves with the same number of training chains.

Every AUC is exact (Mann-Whitney, ties 1/2) with Hanley-McNeil standard errors.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

from configs.cot_geometry import get_config
from lab import launch, outputs, zoo
from lab.config import check, require
from lab.data import answers_match, last_boxed, load_math500_jsonl
from lab.data.synthetic.arithmetic import arithmetic, check_chain
from lab.methods import cot_geometry as cg
from lab.methods.cot_geometry.functionals import SCALAR_FEATURES, VECTOR_FEATURES

# Rules of the claims and the regime (fixed before the default run).
SEPARATION_MIN = 0.8       # d_rho separates easy from hard: AUC at least this (paper: 0.93)
CONTROLLED_MIN = 0.7       # ... and so does d_rho over equal-size windows
EARLY_MIN = 0.6            # early features predict correctness: AUC at least this, > 2 SE
WITHIN_MIN = 0.6           # ... within one level on average
TRANSFER_MIN = 0.6         # transfer AUC at least this ...
TRANSFER_TOL = 0.05        # ... and not more than this below the in-distribution AUC
MIN_PER_CLASS = 20         # correct and wrong chains in each group compared
MIN_ACC_DROP = 0.15        # accuracy of the easy group minus the hard group
WITHIN_MIN_CLASS = 5       # a level's within-level AUC needs this many of each class


def check_config(config):
    """Validates ``config`` against its preset (:func:`lab.config.check`); returns it."""
    known = set(SCALAR_FEATURES) | set(VECTOR_FEATURES)
    lv = (lambda v: len(v) > 0 and all(isinstance(x, int) and x >= 1 for x in v),
          "a non-empty list of levels >= 1")
    check(config, get_config, {
        "task.n_per_level": (lambda v: v >= 2, "an int >= 2"),
        "math500.n_per_level": (lambda v: v >= 0, "an int >= 0 (0 = every problem)"),
        "task.steps": (lambda v: len(v) == 2 and 1 <= v[0] <= v[1], "[lo, hi] steps, lo >= 1"),
        "geometry.rho": (lambda v: 0 < v <= 1, "a fraction of variance in (0, 1]"),
        "geometry.window": (lambda v: v >= 2, "an int >= 2"),
        "geometry.prefix": (lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
        "geometry.min_prefix": (lambda v: v >= 2, "an int >= 2 (a curve needs 2 points)"),
        "geometry.layers": (_layers_ok, '"all" or comma-separated layer indices'),
        "math500.max_new_tokens": (lambda v: v >= 2, "an int >= 2"),
        "predictor.test_fraction": (lambda v: 0 < v < 1, "a fraction in (0, 1)"),
        "predictor.features": (lambda v: bool(v) and all(f.strip() in known
                                                         for f in v.split(",")),
                               f"comma-separated names out of {sorted(known)}"),
        "generation.max_new_tokens": (lambda v: v >= 2, "an int >= 2"),
        "generation.batch_size": (lambda v: v >= 1, "an int >= 1"),
        "easy_levels": lv, "hard_levels": lv, "transfer_source": lv, "transfer_target": lv,
    })
    for a, b in (("easy_levels", "hard_levels"), ("transfer_source", "transfer_target")):
        require(not set(config[a]) & set(config[b]), b, list(config[b]),
                f"levels disjoint from {a}={list(config[a])}")
    if config.math500.path:
        require(os.path.isfile(config.math500.path), "math500.path", config.math500.path,
                "an existing MATH500-format jsonl file")
    else:
        lo, hi = config.task.steps
        used = set(config.easy_levels) | set(config.hard_levels) | set(
            config.transfer_source) | set(config.transfer_target)
        require(used <= set(range(lo, hi + 1)), "easy_levels", sorted(used),
                f"levels (steps) within task.steps={list(config.task.steps)}")
    return config


def _layers_ok(value: str) -> bool:
    if value == "all":
        return True
    try:
        return all(isinstance(int(v), int) for v in value.split(","))
    except ValueError:
        return False


def measured_layers(config, n_layers: int) -> tuple[tuple[int, ...], int]:
    """``(the layers measured, the claims' layer)`` as indices ``0..n_layers``; ValueError
    naming ``geometry.layer`` when the claims' layer is not among those measured."""
    g = config.geometry
    spec = "all" if g.layers == "all" else [int(v) for v in g.layers.split(",")]
    try:
        layers = cg.resolve_layers(spec, n_layers)
        layer = cg.resolve_layers(g.layer, n_layers)[0]
    except ValueError as e:
        raise ValueError(f"config.geometry.layer(s): {e}") from e
    require(layer in layers, "geometry.layer", g.layer,
            f"one of the measured geometry.layers={g.layers!r} (resolved: {list(layers)})")
    return layers, layer


def feature_names(config) -> tuple[str, ...]:
    return tuple(f.strip() for f in config.predictor.features.split(","))


# --------------------------------------------------------------------------- problems

def training_prompts(name: str) -> set[str]:
    """The prompts a zoo model of one arithmetic task was trained on: its mixture's rows,
    drawn as :func:`lab.data.synthetic.mixture` draws a one-task mixture (task 0's seed
    ``default_rng([seed, 0])``), without building the mixed Dataset."""
    from lab.data.synthetic.mixture import mixture

    d = zoo.get_spec(name).data
    tasks = d["tasks"]
    if list(tasks) != ["arithmetic"]:
        return set(mixture(d["n_train"], d["seed"], tasks)["prompt"])
    kwargs = {k: v for k, v in tasks["arithmetic"].items() if k != "weight"}
    seed = int(np.random.default_rng([d["seed"], 0]).integers(2**31))
    return set(arithmetic(d["n_train"], seed, **kwargs)["prompt"])


def arithmetic_problems(config) -> list[dict]:
    """Held-out problems of every level: ``{"prompt", "level", "operands", "ops"}``."""
    from lab.zoo.reasoning import held_out_levels

    t = config.task
    exclude = (training_prompts(config.model)
               if t.exclude_training and config.model in zoo.NAMED else set())
    sets = held_out_levels({"steps": tuple(t.steps), "digits": (t.digits, t.digits),
                            "ops": t.ops}, t.n_per_level, config.seed, exclude)
    rows = []
    for (steps, _), ds in sets.items():
        rows += [{"prompt": r["prompt"], "level": steps, "operands": r["operands"],
                  "ops": r["ops"], "answer": r["answer"]} for r in ds]
    return rows


def math500_problems(config) -> list[dict]:
    """MATH500 rows as problems: ``{"prompt" (the template), "level", "answer"}``."""
    ds = load_math500_jsonl(config.math500.path)
    rows, seen = [], {}
    for r in ds:
        seen[r["level"]] = seen.get(r["level"], 0) + 1
        if config.math500.n_per_level and seen[r["level"]] > config.math500.n_per_level:
            continue
        rows.append({"prompt": config.math500.template.format(problem=r["problem"]),
                     "level": r["level"], "answer": r["answer"]})
    return rows


def is_correct(text: str, row: dict) -> bool:
    """An arithmetic chain's answer (:func:`check_chain`), or a MATH500 completion's last
    ``\\boxed{}`` (else its last line) against the reference answer."""
    if "operands" in row:
        return check_chain(text, row["operands"], row["ops"]).answer_correct
    got = last_boxed(text)
    if got is None:
        lines = [ln for ln in text.strip().split("\n") if ln.strip()]
        got = lines[-1] if lines else ""
    return answers_match(got, row["answer"])


def split(levels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean test mask holding ``fraction`` of every level's problems (at random)."""
    rng = np.random.default_rng([seed, 77])
    test = np.zeros(len(levels), bool)
    for lv in np.unique(levels):
        idx = rng.permutation(np.flatnonzero(levels == lv))
        test[idx[:int(round(fraction * len(idx)))]] = True
    return test


# --------------------------------------------------------------------------- measures

def residualised(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``values`` minus their least-squares fit on ``[1, log length]``."""
    a = np.stack([np.ones(len(lengths)), np.log(lengths.astype(np.float64))], 1)
    coef, *_ = np.linalg.lstsq(a, values.astype(np.float64), rcond=None)
    return values - a @ coef


def within_level(scores, labels, levels) -> dict:
    """Per level with at least :data:`WITHIN_MIN_CLASS` of each class: its AUC; ``mean``
    over those levels (NaN when none)."""
    per = {}
    for lv in np.unique(levels):
        s = levels == lv
        y = labels[s]
        if y.sum() >= WITHIN_MIN_CLASS and (~y).sum() >= WITHIN_MIN_CLASS:
            per[str(int(lv))] = cg.auc(scores[s], y)
    return {"levels": per, "mean": float(np.mean(list(per.values()))) if per else float("nan")}


def _fit_predict(x, y, train, test, config):
    p = config.predictor
    if train.sum() == 0 or test.sum() == 0:
        return np.full(int(test.sum()), np.nan)
    # 0/1 weights on every row: one compiled fit for every subset
    model = cg.fit_logistic(x, y, weights=train.astype(np.float64), l2=p.l2, steps=p.steps,
                            learning_rate=p.learning_rate)
    return cg.predict_logistic(model, x[test])


def _entry(scores, labels) -> dict:
    scores = np.asarray(scores, np.float64)
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        y = np.asarray(labels, bool)
        return {"auc": float("nan"), "se": float("nan"), "n_pos": int(y.sum()),
                "n_neg": int((~y).sum())}
    return cg.auc_entry(scores, labels)


def layer_measures(x, mask, prefix, data, config) -> dict:
    """Every measure of one layer's trajectories ``x [N, T, d]``."""
    g = config.geometry
    levels, y, lengths = data["levels"], data["correct"], data["lengths"]
    easy, hard = data["easy"], data["hard"]
    sel = easy | hard
    full = cg.features(x, mask, g.rho)
    win, _ = cg.windowed_effective_dimension(x, g.window, g.rho, mask)
    win = np.asarray(win, np.float64)
    d_rho = np.asarray(full["d_rho"], np.float64)
    ok = sel & np.isfinite(win)
    difficulty = {
        "d_rho": _entry(d_rho[sel], hard[sel]),
        "participation_ratio": _entry(np.asarray(full["participation_ratio"])[sel], hard[sel]),
        "d_rho_window": _entry(win[ok], hard[ok]),
        "d_rho_residual": _entry(residualised(d_rho[sel], lengths[sel]), hard[sel]),
        "mean_d_rho": {str(int(k)): float(d_rho[levels == k].mean())
                       for k in np.unique(levels)},
    }
    early = cg.features(x, prefix, g.rho)
    feats = cg.feature_matrix(early, feature_names(config))
    test = data["test"]
    p = _fit_predict(feats, y, ~test, test, config)
    scores = np.full(len(y), np.nan)
    scores[test] = p
    correctness = {"geometry": _entry(p, y[test]),
                   "geometry_within": within_level(scores[test], y[test], levels[test])}
    transfer = {}
    src, tgt = np.isin(levels, config.transfer_source), np.isin(levels, config.transfer_target)
    for name, a, b in (("forward", src, tgt), ("reverse", tgt, src)):
        eval_ = b & test
        n = int(min((a & ~test).sum(), (b & ~test).sum()))
        rng = np.random.default_rng([config.seed, 5])
        train_src = np.zeros(len(y), bool)
        train_src[rng.permutation(np.flatnonzero(a & ~test))[:n]] = True
        train_tgt = np.zeros(len(y), bool)
        train_tgt[rng.permutation(np.flatnonzero(b & ~test))[:n]] = True
        transfer[name] = {"transfer": _entry(_fit_predict(feats, y, train_src, eval_, config),
                                             y[eval_]),
                          "in_distribution": _entry(_fit_predict(feats, y, train_tgt, eval_,
                                                                 config), y[eval_]),
                          "n_train": n}
    return {"difficulty": difficulty, "correctness": correctness, "transfer": transfer,
            "spectrum": _mean_spectra(x, mask, levels)}


def _mean_spectra(x, mask, levels, k: int = 16) -> dict:
    """Per level: the mean of each chain's eigenvalues over their sum (first ``k``)."""
    lam = np.asarray(cg.spectrum(x, mask), np.float64)
    lam = lam / np.maximum(lam.sum(1, keepdims=True), 1e-30)
    return {str(int(lv)): lam[levels == lv, :k].mean(0).tolist() for lv in np.unique(levels)}


def baselines(data) -> dict:
    """The shortcut baselines: length-only for easy vs hard; difficulty, confidence and
    prefix length for correctness (on the same test half as the predictor)."""
    easy, hard, test, y = data["easy"], data["hard"], data["test"], data["correct"]
    sel = easy | hard
    conf = data["confidence"]
    return {
        "difficulty": {"generated_tokens": _entry(data["lengths"][sel], hard[sel]),
                       "prompt_tokens": _entry(data["prompt_lengths"][sel], hard[sel])},
        "correctness": {
            "difficulty": _entry(-data["levels"][test], y[test]),
            "confidence": _entry(conf[test], y[test]),
            "prefix_tokens": _entry(-data["prefix_lengths"][test], y[test]),
            "confidence_within": within_level(conf[test], y[test], data["levels"][test]),
        },
    }


# --------------------------------------------------------------------------- rules

def _auc(e) -> float:
    return float(e["auc"]) if e["auc"] is not None else float("nan")


def _ge(a: float, b: float) -> bool:
    return bool(np.isfinite(a) and np.isfinite(b) and a >= b)


def claim_rules(results) -> list[dict]:
    """The claims, decided at the configured layer (``results["layer"]``)."""
    m = results["layers"][str(results["layer"])]
    d, c, t = m["difficulty"], m["correctness"], m["transfer"]
    bd, bc = results["baselines"]["difficulty"], results["baselines"]["correctness"]
    sep, length = _auc(d["d_rho"]), _auc(bd["generated_tokens"])
    win, res = _auc(d["d_rho_window"]), _auc(d["d_rho_residual"])
    geo, geo_se = _auc(c["geometry"]), c["geometry"]["se"]
    base = {k: _auc(bc[k]) for k in ("difficulty", "confidence", "prefix_tokens")}
    within = c["geometry_within"]["mean"]
    within = float("nan") if within is None else float(within)
    tr = {k: {"transfer": _auc(v["transfer"]), "in_distribution": _auc(v["in_distribution"])}
          for k, v in t.items()}
    se = float("nan") if geo_se is None else float(geo_se)
    return [
        outputs.claim(
            f"d_rho separates easy from hard problems: AUC >= {SEPARATION_MIN} (the paper "
            "reports 0.93 on MATH500).",
            "AUC of the whole chain's d_rho, hard = positive", sep, _ge(sep, SEPARATION_MIN)),
        outputs.claim(
            "d_rho separates easy from hard better than the chain's length alone.",
            "AUC(d_rho) vs AUC(generated tokens)", {"d_rho": sep, "length": length},
            _ge(sep, length) and sep > length),
        outputs.claim(
            f"d_rho separates easy from hard at equal token count: d_rho averaged over "
            f"windows of equal length has AUC >= {CONTROLLED_MIN}.",
            "AUC of windowed d_rho (and of d_rho residualised on log length, reported)",
            {"window": win, "residual": res}, _ge(win, CONTROLLED_MIN)),
        outputs.claim(
            f"Kinematic features of the first 20% of a chain predict its correctness: "
            f"held-out AUC >= {EARLY_MIN} and above 0.5 by 2 SE.",
            "AUC of the logistic predictor on the test half", {"auc": geo, "se": se},
            _ge(geo, EARLY_MIN) and _ge(geo - 2 * se, 0.5) and geo - 2 * se > 0.5),
        outputs.claim(
            "Early geometry predicts correctness better than every baseline: difficulty alone, "
            "the model's confidence on the same prefix, the prefix's length.",
            "AUC(geometry) vs the best baseline AUC", {"geometry": geo, **base},
            all(_ge(geo, b) and geo > b for b in base.values())),
        outputs.claim(
            f"Within one difficulty level, early geometry still predicts correctness: mean "
            f"within-level AUC >= {WITHIN_MIN}.",
            "mean over levels of the test-half AUC within the level",
            {"geometry": within, "confidence": bc["confidence_within"]["mean"]},
            _ge(within, WITHIN_MIN)),
        outputs.claim(
            f"Correctness signatures transfer across difficulty: fitted on one group of levels, "
            f"AUC >= {TRANSFER_MIN} on the other and within {TRANSFER_TOL} of a predictor "
            "fitted on that group (both directions).",
            "transfer vs in-distribution AUC, forward (easy -> hard) and reverse", tr,
            all(_ge(v["transfer"], TRANSFER_MIN)
                and _ge(v["transfer"], v["in_distribution"] - TRANSFER_TOL)
                for v in tr.values())),
    ]


def regime_checks(results) -> list[dict]:
    """Whether the run can show the effect: both outcomes in numbers in each group,
    accuracy falling with difficulty, chains long enough for the windows."""
    g = results["groups"]
    counts = {f"{k}_{w}": g[k][w] for k in ("easy", "hard") for w in ("correct", "wrong")}
    drop = g["easy"]["accuracy"] - g["hard"]["accuracy"]
    out = [
        outputs.regime(f"easy and hard groups each have >= {MIN_PER_CLASS} correct and "
                       f">= {MIN_PER_CLASS} wrong chains", counts,
                       min(counts.values()) >= MIN_PER_CLASS),
        outputs.regime(f"accuracy falls with difficulty: easy minus hard >= {MIN_ACC_DROP}",
                       {"easy": g["easy"]["accuracy"], "hard": g["hard"]["accuracy"],
                        "by_level": results["accuracy_by_level"]}, drop >= MIN_ACC_DROP),
        outputs.regime("every chain spans at least one length-control window and the early "
                       "prefix's minimum", {"min_length": results["min_length"],
                                            "window": results["window"],
                                            "min_prefix": results["min_prefix"]},
                       results["min_length"] >= max(results["window"], results["min_prefix"])),
    ]
    if results.get("zoo_regime_ok") is not None:
        out.append(outputs.regime("the zoo model's stored regime holds (zoo.metrics: easy "
                                  "solved, hard failed, pass@k > pass@1)",
                                  results["zoo_regime_ok"], results["zoo_regime_ok"]))
    return out


# --------------------------------------------------------------------------- run

def run(config, workdir: str) -> dict:
    check_config(config)
    started = time.time()
    model, tok = zoo.load_model(config.model)
    layers, layer = measured_layers(config, model.config.n_layers)
    problems = math500_problems(config) if config.math500.path else arithmetic_problems(config)
    t_gen = time.time()
    tr = cg.trajectories(model, problems, tokenizer=tok, layer=list(layers),
                         max_new_tokens=(config.math500.max_new_tokens if config.math500.path
                                         else config.generation.max_new_tokens),
                         batch_size=config.generation.batch_size)
    t_gen = time.time() - t_gen
    g = config.geometry
    levels = np.array([r["level"] for r in problems])
    correct = np.array([is_correct(t, r) for t, r in zip(tr.texts, problems, strict=True)])
    cut = tr.lengths >= 2
    if not cut.all():
        logging.warning("cot_geometry: %d chains of fewer than 2 tokens left out",
                        int((~cut).sum()))
    prefix = np.asarray(cg.prefix_mask(tr.mask[cut], g.prefix, g.min_prefix))
    conf = (tr.logprobs[cut] * prefix).sum(1) / prefix.sum(1)
    levels, correct = levels[cut], correct[cut]
    data = {"levels": levels, "correct": correct, "lengths": tr.lengths[cut],
            "prompt_lengths": tr.prompt_lengths[cut], "prefix_lengths": prefix.sum(1),
            "confidence": conf, "easy": np.isin(levels, config.easy_levels),
            "hard": np.isin(levels, config.hard_levels),
            "test": split(levels, config.predictor.test_fraction, config.seed)}
    per_layer = {str(lv): layer_measures(tr.at(lv)[cut], tr.mask[cut], prefix, data, config)
                 for lv in tr.layers}
    groups = {k: {"correct": int(correct[data[k]].sum()),
                  "wrong": int((~correct[data[k]]).sum()),
                  "accuracy": float(correct[data[k]].mean()) if data[k].any() else float("nan")}
              for k in ("easy", "hard")}
    zoo_ok = None
    if isinstance(config.model, str) and config.model in zoo.NAMED:
        reg = zoo.metrics(config.model).get("regime")
        zoo_ok = None if reg is None else bool(reg["checks"]["ok"])
    results = {
        "model": config.model, "source": "math500" if config.math500.path else "arithmetic",
        "layer": layer, "layers": per_layer, "baselines": baselines(data), "groups": groups,
        "accuracy_by_level": {str(int(k)): float(correct[levels == k].mean())
                              for k in np.unique(levels)},
        "tokens_by_level": {str(int(k)): float(data["lengths"][levels == k].mean())
                            for k in np.unique(levels)},
        "n_chains": int(cut.sum()), "min_length": int(data["lengths"].min()),
        "window": g.window, "min_prefix": g.min_prefix, "zoo_regime_ok": zoo_ok,
    }
    results["claims"] = claim_rules(results)
    results["regime"] = regime_checks(results)
    results["seconds"] = {"generation": t_gen, "total": time.time() - started}
    plots = [_plot_geometry(tr, cut, levels, layer, data, config, workdir),
             _plot_layers(results, workdir)]
    report = _report(results, config)
    logging.info("cot_geometry: %d chains, %.0f s", results["n_chains"],
                 results["seconds"]["total"])
    return outputs.write_outputs(workdir, name="cot_geometry", config=config, results=results,
                                 report=report, plots=plots)


def main_table(results) -> list[dict]:
    """The results page's table, at the claims' layer: each question's method and baseline
    rows with their AUC and standard error."""
    m = results["layers"][str(results["layer"])]
    bd, bc = results["baselines"]["difficulty"], results["baselines"]["correctness"]
    rows = []

    def add(question, entry, kind, e):
        rows.append({"question": question, "entry": entry, "kind": kind, "auc": e["auc"],
                     "se": e["se"]})

    for name in ("d_rho", "participation_ratio", "d_rho_window", "d_rho_residual"):
        add("easy vs hard", name, "method", m["difficulty"][name])
    for name, e in bd.items():
        add("easy vs hard", name, "baseline (length)", e)
    add("correctness (first 20%)", "geometry", "method", m["correctness"]["geometry"])
    for name in ("difficulty", "confidence", "prefix_tokens"):
        add("correctness (first 20%)", name, "baseline", bc[name])
    for direction, v in m["transfer"].items():
        add(f"transfer ({direction})", "geometry, other levels", "method", v["transfer"])
        add(f"transfer ({direction})", "geometry, same levels", "reference",
            v["in_distribution"])
    return rows


def _report(results, config) -> str:
    layer_rows = []
    for lv, m in results["layers"].items():
        d, c, t = m["difficulty"], m["correctness"], m["transfer"]
        layer_rows.append({
            "layer": int(lv), "d_rho": d["d_rho"]["auc"], "PR": d["participation_ratio"]["auc"],
            "d_rho window": d["d_rho_window"]["auc"], "d_rho resid.": d["d_rho_residual"]["auc"],
            "early": c["geometry"]["auc"], "early within": c["geometry_within"]["mean"],
            "transfer fwd": t["forward"]["transfer"]["auc"],
            "in-dist fwd": t["forward"]["in_distribution"]["auc"],
            "transfer rev": t["reverse"]["transfer"]["auc"],
            "in-dist rev": t["reverse"]["in_distribution"]["auc"]})
    bc = results["baselines"]["correctness"]
    mean_d = results["layers"][str(results["layer"])]["difficulty"]["mean_d_rho"]
    level_rows = [{"level": k, "accuracy": a, "tokens": results["tokens_by_level"][k],
                   "mean d_rho": mean_d[k]} for k, a in results["accuracy_by_level"].items()]
    return "\n".join([
        f"Model `{results['model']}` on {results['source']} problems, {results['n_chains']} "
        f"greedy chains; easy = levels {list(config.easy_levels)}, hard = levels "
        f"{list(config.hard_levels)}; claims at layer {results['layer']} (0 = embeddings). "
        f"rho = {config.geometry.rho}, windows of {config.geometry.window} tokens, early = "
        f"first {config.geometry.prefix:.0%} of each chain (at least "
        f"{config.geometry.min_prefix} tokens); AUCs exact (Mann-Whitney), se by Hanley-McNeil."
        "\n",
        "## Each question, method beside its baselines\n",
        outputs.markdown_table(main_table(results)),
        "## Per layer (AUC)\n",
        "d_rho, PR: whole chain, easy vs hard; window: mean d_rho over equal-size windows; "
        "resid.: d_rho residualised on log length; early: correctness from the first 20%; "
        "within: mean AUC inside each level; transfer: fitted on the other group of levels, "
        "in-dist: fitted on the same levels (equal training size).\n",
        outputs.markdown_table(layer_rows),
        "## Per level\n", outputs.markdown_table(level_rows),
        f"Within-level AUC of the confidence baseline: "
        f"{outputs.format_value(bc['confidence_within']['mean'])}.\n",
        f"Generation {results['seconds']['generation']:.1f} s, total "
        f"{results['seconds']['total']:.1f} s.\n",
    ])


def _plot_geometry(tr, cut, levels, layer, data, config, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, mask = tr.at(layer)[cut], tr.mask[cut]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    spectra = _mean_spectra(x, mask, levels)
    for lv, s in spectra.items():
        axes[0].semilogy(np.arange(1, len(s) + 1), np.maximum(s, 1e-8), "-o", ms=3,
                         label=f"level {lv}")
    axes[0].set_xlabel("principal component")
    axes[0].set_ylabel("fraction of variance (mean over chains)")
    axes[0].set_title(f"covariance spectra, layer {layer}")
    axes[0].legend(fontsize=7)
    pts = x[mask]
    mu = pts.mean(0)
    _, _, vt = np.linalg.svd(pts - mu, full_matrices=False)
    for group, color in (("easy", "tab:blue"), ("hard", "tab:red")):
        for i in np.flatnonzero(data[group])[:config.plot_chains]:
            p = (x[i][mask[i]] - mu) @ vt[:2].T
            axes[1].plot(p[:, 0], p[:, 1], "-", color=color, alpha=0.7, lw=1,
                         label=group if i == np.flatnonzero(data[group])[0] else None)
            axes[1].plot(p[0, 0], p[0, 1], "o", color=color, ms=4)
    axes[1].set_title("chains in the top-2 PCs of all states (dot = start)")
    axes[1].legend(fontsize=7)
    return outputs.save_figure(fig, workdir, "cot_geometry_spectra.png")


def _plot_layers(results, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(results["layers"])
    cols = [("d_rho", lambda m: m["difficulty"]["d_rho"]["auc"]),
            ("d_rho window", lambda m: m["difficulty"]["d_rho_window"]["auc"]),
            ("early (correctness)", lambda m: m["correctness"]["geometry"]["auc"]),
            ("transfer fwd", lambda m: m["transfer"]["forward"]["transfer"]["auc"])]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    w = 0.8 / len(cols)
    for j, (name, get) in enumerate(cols):
        vals = [get(results["layers"][lv]) for lv in layers]
        ax.bar(np.arange(len(layers)) + j * w, [np.nan if v is None else v for v in vals], w,
               label=name)
    ax.axhline(0.5, color="k", lw=0.8)
    length = results["baselines"]["difficulty"]["generated_tokens"]["auc"]
    if length is not None:
        ax.axhline(length, color="k", ls=":", label="length (easy vs hard)")
    conf = results["baselines"]["correctness"]["confidence"]["auc"]
    if conf is not None:
        ax.axhline(conf, color="tab:green", ls="--", lw=1, label="confidence (correctness)")
    ax.set_xticks(np.arange(len(layers)) + 0.4 - w / 2, [f"layer {lv}" for lv in layers])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("AUC")
    ax.legend(fontsize=7)
    return outputs.save_figure(fig, workdir, "cot_geometry_layers.png")


if __name__ == "__main__":
    launch.main(run)
