"""GOLD PANNING vs single pass, PSC and uncertainty sampling: real zoo LM and simulated sweep.

  python -m experiments.gold_panning --config=configs/gold_panning.py:default \
      --workdir=/tmp/gold_panning

1. Load the queried LM (``config.model``: a named zoo LM, or ``""`` for the one
   ``config.zoo`` describes) and the calibration-mismatch LM (``config.model_mismatch``
   / ``config.zoo_mismatch``), training and caching them on first use.
2. Measure each LM's diagnosticity profile at ``real_n`` documents: prompts
   with the gold document at each position, greedy answers mapped back to the
   document whose value they name.
3. On held-out prompts, query the first LM with every method; target
   identification accuracy and F1 against the number of model queries; the
   calibration-mismatch run uses the second LM's profile.
4. Sweep N over ``sim.ns`` on a simulated model whose profile is the first
   LM's, resized to N (``gold_panning.resize_profile``); rounds vs N with a
   ``a + b log N`` fit.
"""

from __future__ import annotations

import time

import numpy as np
from absl import logging

from configs.gold_panning import get_config
from lab import launch, zoo
from lab.config import check, require
from lab.data.synthetic import extract_answer, kv_retrieval, render_kv_prompt
from lab.infer import generate
from lab.methods import gold_panning as gp
from lab.outputs import claim, markdown_table, regime, save_figure, to_jsonable, write_outputs

CALIB_SEED, EVAL_SEED = 101, 202
MAX_NEW_TOKENS = 24  # "kwfb=481\nA: 481" + EOS, with room for a wrong key


def zoo_spec(z) -> zoo.ZooSpec:
    """The :class:`lab.zoo.ZooSpec` of a ``config.zoo`` block: multi-document QA, with copy and
    associative recall mixed in (copy grows induction heads; docs/zoo.md has what MQAR was
    measured to do)."""
    tasks = {"kv_retrieval": {"weight": 2, "n_docs": list(z.n_docs), "pairs_per_doc": 1},
             "copy": {"weight": 1, "length": [8, 32]},
             "associative_recall": {"weight": 1, "n_pairs": [4, 12], "n_queries": [1, 3]}}
    return zoo.spec_from_config(z, tasks, seed=z.seed, warmup_steps=max(1, z.steps // 10),
                                log_every=50, checkpoint_every=0,
                                description="GOLD PANNING: multi-document key-value QA")


def load_lm(name: str, z):
    """``(model, tokenizer, cache key)``: the named zoo LM ``name``, or the ``config.zoo``
    block's when ``name`` is empty."""
    spec = zoo.get_spec(name) if name else zoo_spec(z)
    return (*zoo.load_spec(spec), spec.key)


class LMQuery:
    """A :data:`gold_panning.Query` backed by a zoo LM on kv_retrieval problems.

    ``query(rows, orders)`` renders problem ``rows[k]`` with its documents in
    ``orders[k]``, decodes greedily, and returns the position of the document
    whose value the answer names (-1 when it names none). Counts the queries.
    """

    def __init__(self, model, tokenizer, ds, batch_size: int):
        self.model, self.tok, self.bs = model, tokenizer, batch_size
        self.docs, self.questions = list(ds["documents"]), list(ds["question"])
        # pairs_per_doc=1: document d holds exactly one value, candidates[d]
        self.values = [list(c) for c in ds["candidates"]]
        n = len(self.docs[0])
        self.width = max(len(self.tok.encode(render_kv_prompt(d, q), add_bos=True))
                         for d, q in zip(self.docs, self.questions, strict=True))
        if self.width + MAX_NEW_TOKENS > model.config.max_len:
            raise ValueError(f"{n}-document prompts need {self.width + MAX_NEW_TOKENS} tokens; "
                             f"the LM's max_len is {model.config.max_len}")
        self.calls = 0

    def __call__(self, rows: np.ndarray, orders: np.ndarray) -> np.ndarray:
        out = np.full(len(rows), -1, np.int64)
        for s in range(0, len(rows), self.bs):
            r, o = rows[s:s + self.bs], orders[s:s + self.bs]
            toks = np.full((self.bs, self.width), self.tok.pad_id, np.int32)
            lens = np.ones(self.bs, np.int32)
            for k, (i, order) in enumerate(zip(r, o, strict=True)):
                ids = self.tok.encode(render_kv_prompt([self.docs[i][d] for d in order],
                                                       self.questions[i]), add_bos=True)
                toks[k, :len(ids)], lens[k] = ids, len(ids)
            gen = generate(self.model, toks, lengths=lens, max_new_tokens=MAX_NEW_TOKENS,
                           stop_tokens=(self.tok.eos_id,), pad_id=self.tok.pad_id)
            tokens = np.asarray(gen.tokens)
            for k, (i, order) in enumerate(zip(r, o, strict=True)):
                ans = extract_answer(self.tok.decode(tokens[k].tolist()))
                if ans in self.values[i]:
                    doc = self.values[i].index(ans)
                    out[s + k] = int(np.flatnonzero(order == doc)[0])
        self.calls += len(rows)
        return out


def calibrate(model, tokenizer, n: int, k: int, batch_size: int, seed: int) -> gp.Profile:
    """The LM's measured profile: ``k`` prompts with the gold at each of ``n`` positions."""
    golds, obs = [], []
    for p in range(n):
        ds = kv_retrieval(k, seed=seed + p, n_docs=n, gold_position=p, pairs_per_doc=1)
        q = LMQuery(model, tokenizer, ds, batch_size)
        obs.append(q(np.arange(k), np.tile(np.arange(n), (k, 1))))
        golds.append(np.full(k, p))
    return gp.measure_profile(np.concatenate(golds), np.concatenate(obs), n)


def _gp_curve(res: gp.SearchResult, gold, budgets) -> list[dict]:
    return [{"budget": b, "queries": float(np.minimum(res.queries, b).mean()),
             "accuracy": float(np.mean(res.trajectory[:, b] == gold)),
             "f1": gp.f1(res.trajectory[:, b], gold)} for b in budgets]


def _psc_curve(pred, gold, ms) -> list[dict]:
    return [{"budget": m, "queries": float(m), "accuracy": float(np.mean(pred[:, m - 1] == gold)),
             "f1": gp.f1(pred[:, m - 1], gold)} for m in ms]


def reference_profile(n: int, false_mass: float = 0.1) -> gp.Profile:
    """An assumed U-shaped profile (strong primacy, weaker recency, weak middle; the shape
    reported by Liu et al. 2023, "Lost in the Middle"): TPR 0.25 .. 0.85, FPR summing to
    ``false_mass``. Used only when the measured profile carries no signal."""
    x = np.linspace(0.0, 1.0, n)
    return gp.make_profile(0.25 + 0.6 * (1 - x) ** 4 + 0.3 * x ** 4, np.full(n, false_mass / n))


def compare(query_fn, n, gold, profile, mismatch, c, budgets, ms, seed) -> dict:
    """Every method on one query source; curves of accuracy/F1 vs queries per method."""
    b = len(gold)
    clip = gp.clip_profile
    kw = dict(threshold=c.gp.threshold, budget=max(budgets), seed=seed)
    out = {"single_pass": _psc_curve(gp.single_pass(query_fn, n, b)[:, None], gold, [1]),
           "psc": _psc_curve(gp.psc(query_fn, n, b, max(ms), seed=seed), gold, ms)}
    runs = {"gold_panning": ("anchor", profile), "uncertainty": ("uncertainty", profile),
            "bayes_random_order": ("random", profile), "gold_panning_mismatch": ("anchor",
                                                                                  mismatch)}
    for name, (rule, prof) in runs.items():
        res = gp.search(query_fn, n, b, clip(prof, c.gp.floor), rule=rule, **kw)
        out[name] = _gp_curve(res, gold, budgets)
        out[name + "_rounds"] = float(res.queries.mean())
    return out


def queries_to_match(curves: dict, m: int, tol: float = 0.0) -> dict:
    """PSC's F1 with ``m`` shuffles, and the fewest GOLD PANNING queries reaching it
    (within ``tol``) on its budget curve."""
    target = next(r for r in curves["psc"] if r["budget"] == m)
    hit = [r for r in curves["gold_panning"] if r["f1"] >= target["f1"] - tol]
    q = hit[0]["queries"] if hit else None
    return {"psc_f1": target["f1"], "psc_queries": target["queries"], "gp_queries": q,
            "saving": None if q is None else 1 - q / target["queries"]}


def fit_log(ns, rounds) -> dict:
    """Least squares ``rounds = a + b ln N``; returns a, b and R^2."""
    x, y = np.log(np.asarray(ns, float)), np.asarray(rounds, float)
    b, a = np.polyfit(x, y, 1)
    ss = np.sum((y - y.mean()) ** 2)
    r2 = 1 - np.sum((y - (a + b * x)) ** 2) / ss if ss > 0 else 0.0
    return {"a": float(a), "b": float(b), "r2": float(r2)}


# The regime GOLD PANNING needs: a position bias to exploit, and room above one pass.
REGIME_MIN_SPREAD = 0.1
REGIME_MAX_SINGLE_PASS = 0.9


def regime_checks(results, min_spread=REGIME_MIN_SPREAD,
                  max_single=REGIME_MAX_SINGLE_PASS) -> list[dict]:
    """GOLD PANNING's regime (``results["regime"]``), from the measured profile and the
    real LM's single-pass row: the reader's diagnosticity (TPR - FPR per position,
    :func:`lab.methods.gold_panning.diagnosticity`) differs across positions by at least
    ``min_spread`` (max - min), else there is no position bias for the ordering to
    exploit; and one pass in the given order answers at most ``max_single`` of the prompts,
    else there is nothing for more queries to recover. Both bounds are inclusive (to 1e-9:
    the rates are fractions of prompts, and ``0.5 - 0.4`` is not quite ``0.1`` in floats)."""
    prof = gp.Profile(np.asarray(results["profile"]["tpr"], float),
                      np.asarray(results["profile"]["fpr"], float))
    d = gp.diagnosticity(prof)
    spread = float(d.max() - d.min())
    single = float(results["real"]["single_pass"][0]["accuracy"])
    return [
        regime(f"the reader has a position bias: its diagnosticity (TPR - FPR) over the "
               f"{prof.n} positions spans max - min >= {min_spread:g}", spread,
               spread >= min_spread - 1e-9),
        regime(f"one pass in the given order is not near-perfect: its accuracy on the real "
               f"LM <= {max_single:g}", single, single <= max_single + 1e-9),
    ]


def main_table(results) -> list[dict]:
    """Accuracy, F1 and mean queries per method and budget on the real LM (the report's
    main table), from ``results["real"]``."""
    return _rows(results["real"])


CHECKS = {
    "real_n": (lambda v: v >= 2, "an int >= 2"),
    "n_calib": (lambda v: v >= 1, "a positive int"),
    "n_eval": (lambda v: v >= 1, "a positive int"),
    "batch_size": (lambda v: v >= 1, "a positive int"),
    "gp.threshold": (lambda v: 0 < v < 1, "a probability in (0, 1)"),
    "gp.floor": (lambda v: 0 < v < 0.5, "a number in (0, 0.5)"),
    "psc_m": (lambda v: len(v) > 0 and all(isinstance(m, int) and m >= 1 for m in v),
              "a non-empty list of positive ints"),
    "budgets": (lambda v: len(v) > 0 and all(isinstance(m, int) and m >= 1 for m in v),
                "a non-empty list of positive ints"),
    "sim.ns": (lambda v: len(v) >= 2 and all(isinstance(m, int) and m >= 2 for m in v),
               "a list of at least two ints >= 2"),
    "sim.n_trials": (lambda v: v >= 1, "a positive int"),
    "sim.budget": (lambda v: v >= 1, "a positive int"),
    "sim.min_signal": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "claims.log_r2": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "claims.mismatch_gap": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "claims.f1_tol": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "claims.min_saving": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
}


def check_config(config):
    """Validates ``config`` against its preset (:data:`CHECKS`, and ``claims.psc_m`` among
    ``psc_m``); raises ValueError naming the key."""
    check(config, get_config, CHECKS)
    require(config.claims.psc_m in config.psc_m, "claims.psc_m", config.claims.psc_m,
            f"one of psc_m={list(config.psc_m)}")
    return config


def claim_rules(c, n: int, match_real: dict, match_sim: dict, fit: dict, acc: dict
                ) -> list[dict]:
    """The paper's claims decided on the measured numbers: ``match_*`` from
    :func:`queries_to_match` (real LM at ``n`` documents; simulated LM per N), ``fit`` the
    log-law fit of rounds, ``acc`` the matched / mismatched accuracies at the top budget
    and ``mismatch_profile_signal``; thresholds from ``c.claims`` and ``c.sim``."""
    m_ref, tol, top = c.claims.psc_m, c.claims.f1_tol, max(c.budgets)

    def above_chance(value, n_docs, trials):  # two binomial standard errors above 1/N
        p = 1.0 / n_docs
        return value > p + 2 * np.sqrt(p * (1 - p) / trials)

    def beats(m, n_docs, trials):  # testable only when PSC is clearly better than guessing
        return (above_chance(m["psc_f1"], n_docs, trials) and m["gp_queries"] is not None
                and m["saving"] >= c.claims.min_saving)

    claims = [
        claim(f"GOLD PANNING reaches PSC's F1 (m={m_ref}, within {tol}) with at least "
              f"{c.claims.min_saving:.0%} fewer queries on the real LM at N={n} (PSC must "
              "beat chance 1/N by 2 standard errors)",
              "queries to reach PSC's F1", match_real, beats(match_real, n, c.n_eval)),
        claim("... and on the simulated LM (profile resized to N) at every N",
              "queries to reach PSC's F1 per N", match_sim,
              all(beats(m, ns, c.sim.n_trials) for ns, m in match_sim.items())),
        claim(f"rounds grow like log N (fit a + b ln N, b > 0, R^2 >= {c.claims.log_r2})",
              "fit", fit, fit["b"] > 0 and fit["r2"] >= c.claims.log_r2),
        claim(f"calibration mismatch: accuracy with the other LM's profile within "
              f"{c.claims.mismatch_gap} of the matched profile (real LM, budget {top}; the "
              f"matched accuracy must beat chance 1/N by 2 standard errors, and the other "
              f"profile carry signal, max TPR - FPR >= {c.sim.min_signal})",
              "accuracy matched / mismatched", acc,
              above_chance(acc["gold_panning"], n, c.n_eval)
              and acc["mismatch_profile_signal"] >= c.sim.min_signal
              and acc["gold_panning_mismatch"] >= acc["gold_panning"] - c.claims.mismatch_gap),
    ]
    return claims


def run(config, workdir: str) -> dict:
    """Runs the experiment; writes ``results.json``, ``report.md`` and plots; returns results."""
    c = check_config(config)
    t0 = time.time()
    model, tok, key = load_lm(c.model, c.zoo)
    other, tok_mm, key_mm = load_lm(c.model_mismatch, c.zoo_mismatch)
    t_train = time.time() - t0
    logging.info("gold_panning: models %s and %s ready (%.0f s)", key, key_mm, t_train)
    n = c.real_n
    prof = calibrate(model, tok, n, c.n_calib, c.batch_size, CALIB_SEED)
    prof_mm = calibrate(other, tok_mm, n, c.n_calib, c.batch_size, CALIB_SEED)
    t_cal = time.time() - t0 - t_train
    logging.info("gold_panning: profile tpr=%s fpr=%s", prof.tpr.round(2), prof.fpr.round(2))

    ds = kv_retrieval(c.n_eval, seed=EVAL_SEED, n_docs=n, pairs_per_doc=1)
    gold = np.asarray(ds["gold_doc"])
    lm = LMQuery(model, tok, ds, c.batch_size)
    real = compare(lm, n, gold, prof, prof_mm, c, list(c.budgets), list(c.psc_m), c.seed)
    real["model_queries"] = lm.calls
    t_real = time.time() - t0 - t_train - t_cal

    signal = float(gp.diagnosticity(prof).max())
    base = prof if signal >= c.sim.min_signal else reference_profile(n)
    source = ("measured on the queried LM" if base is prof else
              f"ASSUMED (reference_profile): the measured profile has no signal "
              f"(max TPR - FPR = {signal:.3f} < {c.sim.min_signal})")
    sim, rounds = {}, []
    rng = np.random.default_rng(c.seed)
    for ns in c.sim.ns:
        p, pm = gp.resize_profile(base, ns), gp.resize_profile(prof_mm, ns)
        g = rng.integers(0, ns, c.sim.n_trials)
        q = gp.simulated_query(p, g, seed=c.seed + ns)
        budgets = sorted(set(list(c.budgets) + [c.sim.budget]))
        sim[ns] = compare(q, ns, g, p, pm, c, budgets, list(c.psc_m), c.seed + ns)
        rounds.append(sim[ns]["gold_panning_rounds"])
    fit = fit_log(c.sim.ns, rounds)

    m_ref, tol = c.claims.psc_m, c.claims.f1_tol
    match_real = queries_to_match(real, m_ref, tol)
    match_sim = {ns: queries_to_match(sim[ns], m_ref, tol) for ns in c.sim.ns}
    acc = {k: real[k][-1]["accuracy"] for k in ("gold_panning", "gold_panning_mismatch")}
    acc["mismatch_profile_signal"] = float(gp.diagnosticity(prof_mm).max())
    claims = claim_rules(c, n, match_real, match_sim, fit, acc)
    results = {
        "profile": {"tpr": prof.tpr, "fpr": prof.fpr},
        "profile_mismatch": {"tpr": prof_mm.tpr, "fpr": prof_mm.fpr},
        "real": real, "sim": {str(k): v for k, v in sim.items()},
        "sim_profile": {"source": source, "max_signal_measured": signal,
                        "tpr": base.tpr, "fpr": base.fpr},
        "sim_rounds": dict(zip([str(v) for v in c.sim.ns], rounds, strict=True)),
        "rounds_fit": fit, "zoo": {"model": key, "mismatch": key_mm},
        "seconds": {"train_or_load": t_train, "calibrate": t_cal, "real": t_real,
                    "total": time.time() - t0},
        "claims": claims,
    }
    results["regime"] = regime_checks(results)
    report = _report(c, results)
    plots = _plots(workdir, c, results)
    results = to_jsonable(results)
    write_outputs(workdir, name="gold_panning", config=c, results=results, report=report,
                  plots=plots)
    return results


def _rows(curves: dict) -> list[dict]:
    rows = []
    for name in ("single_pass", "psc", "gold_panning", "uncertainty", "bayes_random_order",
                 "gold_panning_mismatch"):
        for r in curves[name]:
            rows.append({"method": name, "budget": r["budget"], "mean queries": r["queries"],
                         "accuracy": r["accuracy"], "F1": r["f1"]})
    return rows


def _report(c, res) -> str:
    prof = [{"position": p, "TPR": t, "FPR": f, "TPR (mismatch LM)": tm, "FPR (mismatch LM)": fm}
            for p, (t, f, tm, fm) in enumerate(zip(res["profile"]["tpr"], res["profile"]["fpr"],
                                                   res["profile_mismatch"]["tpr"],
                                                   res["profile_mismatch"]["fpr"], strict=True))]
    sim_rows = [{"N": ns, **{m: res["sim"][str(ns)][m + "_rounds"] for m in
                             ("gold_panning", "uncertainty", "bayes_random_order",
                              "gold_panning_mismatch")},
                 "GP acc": res["sim"][str(ns)]["gold_panning"][-1]["accuracy"],
                 "GP mismatch acc": res["sim"][str(ns)]["gold_panning_mismatch"][-1]["accuracy"],
                 f"PSC acc (m={max(c.psc_m)})": res["sim"][str(ns)]["psc"][-1]["accuracy"],
                 "single acc": res["sim"][str(ns)]["single_pass"][0]["accuracy"]}
                for ns in c.sim.ns]
    fit = res["rounds_fit"]
    return (
        f"Zoo LMs: `{res['zoo']['model']}` (queried) and `{res['zoo']['mismatch']}` (its "
        f"profile is the calibration-mismatch run's).\n\n"
        f"## Diagnosticity profile at N={c.real_n} ({c.n_calib} prompts per position)\n\n"
        + markdown_table(prof) +
        f"\n## Real LM, N={c.real_n}, {c.n_eval} held-out prompts "
        f"({res['real']['model_queries']} model queries in all)\n\n"
        "Budget = queries allowed (GOLD PANNING stops earlier at belief "
        f"{c.gp.threshold}; mean queries counts what it used); PSC: budget = m shuffles.\n\n"
        + markdown_table(_rows(res["real"])) +
        f"\n## Simulated LM with the real profile resized to N ({c.sim.n_trials} trials, "
        f"budget {c.sim.budget})\n\nThese numbers are not from an LM reading N documents: the "
        f"simulated model's profile is {res['sim_profile']['source']}, interpolated over "
        "relative position (FPR scaled to keep the total false-follow mass); the mismatch "
        "run searches with the other LM's measured profile.\n\nMean rounds per method:\n\n"
        + markdown_table(sim_rows) +
        f"\nFit rounds = a + b ln N: a={fit['a']:.3f}, b={fit['b']:.3f}, R^2={fit['r2']:.3f}.\n"
    )


def _plots(workdir, c, res) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in ("psc", "gold_panning", "uncertainty", "bayes_random_order",
                 "gold_panning_mismatch", "single_pass"):
        rows = res["real"][name]
        axes[0].plot([r["queries"] for r in rows], [r["f1"] for r in rows], "o-", label=name)
    axes[0].set(xlabel="mean model queries", ylabel="F1", title=f"real LM, N={c.real_n}")
    axes[0].legend(fontsize=7)
    ns = list(c.sim.ns)
    axes[1].plot(ns, [res["sim_rounds"][str(v)] for v in ns], "o-", label="GOLD PANNING")
    fit = res["rounds_fit"]
    xs = np.linspace(min(ns), max(ns), 50)
    axes[1].plot(xs, fit["a"] + fit["b"] * np.log(xs), "--", label=f"a+b ln N, R2={fit['r2']:.2f}")
    axes[1].set(xscale="log", xlabel="N", ylabel="mean rounds", title="simulated (real profile)")
    axes[1].legend(fontsize=7)
    pos = np.arange(c.real_n)
    axes[2].plot(pos, res["profile"]["tpr"], "o-", label="TPR")
    axes[2].plot(pos, res["profile"]["fpr"], "o-", label="FPR")
    axes[2].plot(pos, res["profile_mismatch"]["tpr"], "x--", label="TPR (mismatch LM)")
    axes[2].set(xlabel="position", ylabel="rate", title="diagnosticity profile")
    axes[2].legend(fontsize=7)
    name = save_figure(fig, workdir, "gold_panning.png")
    plt.close(fig)
    return [name]


if __name__ == "__main__":
    launch.main(run)
