"""GOLD PANNING vs single pass, PSC and information-gain search: real zoo LM and simulated sweep.

  python -m experiments.gold_panning --config=configs/gold_panning.py:default \
      --workdir=/tmp/gold_panning

1. Load the queried LM (``config.model``: a named zoo LM, a Hugging Face checkpoint
   directory via :func:`lab.zoo.load_model`, or ``""`` for the one ``config.zoo``
   describes) and the calibration-mismatch LM (``config.model_mismatch`` /
   ``config.zoo_mismatch``), training and caching zoo LMs on first use.
2. Measure each LM's diagnosticity profile at ``real_n`` documents: prompts
   with the gold document at each position, greedy answers mapped back to the
   document whose value they name. With ``n_near > 0`` the task is multi-document
   QA with near-miss distractors (:func:`lab.data.synthetic.near_miss.kv_near_miss`:
   keys one character off the asked one, with conflicting values).
3. On held-out prompts, query the first LM with every method; target
   identification accuracy and F1, and answer-level F1, against the number of
   model queries; the calibration-mismatch runs use the second LM's profile.
4. Rounds vs N on the real LM at ``real_ns`` documents (each N calibrated), and
   on a simulated model whose profile is the first LM's, resized to N
   (``gold_panning.resize_profile``) over ``sim.ns``; ``a + b log N`` fits.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

from configs.gold_panning import get_config
from lab import launch, zoo
from lab.config import check, require
from lab.data.synthetic import extract_answer, kv_retrieval, render_kv_prompt
from lab.data.synthetic.near_miss import kv_near_miss
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
    """``(model, tokenizer, source)``: the named zoo LM ``name`` (source: its cache key), a
    Hugging Face checkpoint directory (:func:`lab.zoo.load_model`; source: the directory),
    or the ``config.zoo`` block's LM when ``name`` is empty."""
    if name and name not in zoo.NAMED:
        return (*zoo.load_model(name), os.fspath(name))
    spec = zoo.get_spec(name) if name else zoo_spec(z)
    return (*zoo.load_spec(spec), spec.key)


def documents(k: int, seed: int, n: int, n_near: int, gold_position: int | None = None):
    """``k`` problems of ``n`` one-pair documents: near-miss QA (``n_near`` distractors,
    :func:`kv_near_miss`) or, with ``n_near == 0``, :func:`kv_retrieval`'s exact lookup."""
    if n_near > 0:
        return kv_near_miss(k, seed=seed, n_docs=n, n_near=n_near, gold_position=gold_position)
    return kv_retrieval(k, seed=seed, n_docs=n, gold_position=gold_position, pairs_per_doc=1)


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
        self.answers = list(ds["answer"])
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


def calibrate(model, tokenizer, n: int, k: int, batch_size: int, seed: int,
              n_near: int = 0) -> gp.Profile:
    """The LM's measured profile: ``k`` prompts with the gold at each of ``n`` positions."""
    golds, obs = [], []
    for p in range(n):
        ds = documents(k, seed + p, n, n_near, gold_position=p)
        q = LMQuery(model, tokenizer, ds, batch_size)
        obs.append(q(np.arange(k), np.tile(np.arange(n), (k, 1))))
        golds.append(np.full(k, p))
    return gp.measure_profile(np.concatenate(golds), np.concatenate(obs), n)


def _row(budget, queries, pred, gold, values) -> dict:
    row = {"budget": budget, "queries": queries, "accuracy": float(np.mean(pred == gold)),
           "f1": gp.f1(pred, gold)}
    if values is not None:  # answer level: the predicted document's value (abstain: none)
        answers = [v[p] if p >= 0 else None for v, p in zip(values, pred, strict=True)]
        row["answer_f1"] = gp.answer_f1(answers, [v[g] for v, g in zip(values, gold,
                                                                       strict=True)])
    return row


def _gp_curve(res: gp.SearchResult, gold, budgets, values=None) -> list[dict]:
    return [_row(b, float(np.minimum(res.queries, b).mean()), res.trajectory[:, b], gold, values)
            for b in budgets]


def _psc_curve(pred, gold, ms, values=None) -> list[dict]:
    return [_row(m, float(m), pred[:, m - 1], gold, values) for m in ms]


def reference_profile(n: int, false_mass: float = 0.1) -> gp.Profile:
    """An assumed U-shaped profile (strong primacy, weaker recency, weak middle; the shape
    reported by Liu et al. 2023, "Lost in the Middle"): TPR 0.25 .. 0.85, FPR summing to
    ``false_mass``. Used only when the measured profile carries no signal."""
    x = np.linspace(0.0, 1.0, n)
    return gp.make_profile(0.25 + 0.6 * (1 - x) ** 4 + 0.3 * x ** 4, np.full(n, false_mass / n))


SEARCHES = {  # method -> (assignment rule, profile: the queried LM's or the mismatch LM's)
    "gold_panning": ("anchor", "matched"), "info_gain": ("info_gain", "matched"),
    "bayes_random_order": ("random", "matched"),
    "gold_panning_mismatch": ("anchor", "mismatch"),
    "bayes_random_order_mismatch": ("random", "mismatch"),
}
METHODS = ("single_pass", "psc", *SEARCHES)


def compare(query_fn, n, gold, profile, mismatch, c, budgets, ms, seed, values=None) -> dict:
    """Every method on one query source; curves of accuracy/F1 (and, given each problem's
    document ``values``, answer-level F1) vs queries per method."""
    b = len(gold)
    clip = gp.clip_profile
    kw = dict(threshold=c.gp.threshold, budget=max(budgets), seed=seed)
    out = {"single_pass": _psc_curve(gp.single_pass(query_fn, n, b)[:, None], gold, [1], values),
           "psc": _psc_curve(gp.psc(query_fn, n, b, max(ms), seed=seed), gold, ms, values)}
    profiles = {"matched": profile, "mismatch": mismatch}
    for name, (rule, which) in SEARCHES.items():
        res = gp.search(query_fn, n, b, clip(profiles[which], c.gp.floor), rule=rule, **kw)
        out[name] = _gp_curve(res, gold, budgets, values)
        out[name + "_rounds"] = float(res.queries.mean())
    return out


def real_rounds(model, tok, c, prof_top) -> dict:
    """GOLD PANNING's rounds and accuracy on the real LM at each N of ``c.real_ns``: the
    profile measured at that N (``c.sweep.n_calib`` prompts per position; at ``real_n``
    the main run's), ``c.sweep.n_eval`` held-out problems, budget ``max(c.budgets)``."""
    out = {}
    for i, n in enumerate(c.real_ns):
        prof = prof_top if n == c.real_n else calibrate(
            model, tok, n, c.sweep.n_calib, c.batch_size, CALIB_SEED + 1000 * (i + 1), c.n_near)
        ds = documents(c.sweep.n_eval, EVAL_SEED + 1000 * (i + 1), n, c.n_near)
        gold = np.asarray(ds["gold_doc"])
        res = gp.search(LMQuery(model, tok, ds, c.batch_size), n, len(gold),
                        gp.clip_profile(prof, c.gp.floor), threshold=c.gp.threshold,
                        budget=max(c.budgets), seed=c.seed + n)
        out[str(n)] = {"rounds": float(res.queries.mean()),
                       "accuracy": float(np.mean(res.prediction == gold)),
                       "stopped": float(np.mean(res.max_belief >= c.gp.threshold)),
                       "max_tpr_minus_fpr": float(gp.diagnosticity(prof).max())}
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


# The regime GOLD PANNING needs (issue 24, fixed before measuring): a position bias to exploit,
# and room above one pass that re-ordering recovers.
REGIME_MIN_SPREAD = 0.2      # TPR best - worst position
REGIME_MAX_SINGLE_PASS = 0.9
REGIME_MIN_PSC_GAP = 0.1     # PSC at REGIME_PSC_M shuffles minus one pass
REGIME_PSC_M = 8
REGIME_GROUPS = 4            # contiguous position groups for the spread beyond sampling noise


def regime_checks(results, min_spread=REGIME_MIN_SPREAD,
                  max_single=REGIME_MAX_SINGLE_PASS, min_gap=REGIME_MIN_PSC_GAP) -> list[dict]:
    """GOLD PANNING's regime (``results["regime"]``), from the measured profile and the real
    LM's single-pass and PSC rows:

    1. the reader's TPR differs by at least ``min_spread`` between its best and worst
       positions (else there is no position bias for the ordering to exploit);
    2. the same spread over the TPRs averaged in :data:`REGIME_GROUPS` contiguous groups
       of positions: with k prompts per position the max - min of N per-position rates is
       inflated by sampling noise (about 3.5 binomial standard errors for N = 16-32), and
       averaging over N / 4 positions shrinks that noise by ``sqrt(N / 4)``;
    3. one pass in the given order answers at most ``max_single`` of the prompts;
    4. PSC at :data:`REGIME_PSC_M` shuffles answers at least ``min_gap`` more than one pass
       (one pass is clearly below it: there is something for more queries to recover).

    Bounds are inclusive (to 1e-9: the rates are fractions of prompts). Check 4 is left
    out when the run has no PSC row at m = 8 (the ``test`` preset)."""
    tpr = np.asarray(results["profile"]["tpr"], float)
    spread = float(tpr.max() - tpr.min())
    groups = [g.mean() for g in np.array_split(tpr, min(REGIME_GROUPS, tpr.size))]
    g_spread = float(max(groups) - min(groups))
    real = results["real"]
    single = float(real["single_pass"][0]["accuracy"])
    checks = [
        regime(f"the reader has a position bias: its TPR over the {tpr.size} positions spans "
               f"best - worst >= {min_spread:g}", spread, spread >= min_spread - 1e-9),
        regime(f"... beyond sampling noise: the TPR averaged over {len(groups)} contiguous "
               f"groups of positions spans >= {min_spread:g}", g_spread,
               g_spread >= min_spread - 1e-9),
        regime(f"one pass in the given order is not near-perfect: its accuracy on the real "
               f"LM <= {max_single:g}", single, single <= max_single + 1e-9),
    ]
    psc = [r for r in real["psc"] if r["budget"] == REGIME_PSC_M]
    if psc:
        gap = float(psc[0]["accuracy"]) - single
        checks.append(regime(f"one pass is clearly below PSC at {REGIME_PSC_M} shuffles: PSC's "
                             f"accuracy - one pass's >= {min_gap:g}", gap, gap >= min_gap - 1e-9))
    return checks


def main_table(results) -> list[dict]:
    """Accuracy, F1 and mean queries per method and budget on the real LM (the report's
    main table), from ``results["real"]``."""
    return _rows(results["real"])


CHECKS = {
    "real_n": (lambda v: v >= 2, "an int >= 2"),
    "n_near": (lambda v: isinstance(v, int) and v >= 0, "an int >= 0"),
    "n_calib": (lambda v: v >= 1, "a positive int"),
    "n_eval": (lambda v: v >= 1, "a positive int"),
    "batch_size": (lambda v: v >= 1, "a positive int"),
    "gp.threshold": (lambda v: 0 < v < 1, "a probability in (0, 1)"),
    "gp.floor": (lambda v: 0 < v < 0.5, "a number in (0, 0.5)"),
    "psc_m": (lambda v: len(v) > 0 and all(isinstance(m, int) and m >= 1 for m in v),
              "a non-empty list of positive ints"),
    "budgets": (lambda v: len(v) > 0 and all(isinstance(m, int) and m >= 1 for m in v),
                "a non-empty list of positive ints"),
    "real_ns": (lambda v: len(v) >= 2 and all(isinstance(m, int) and m >= 2 for m in v),
                "a list of at least two ints >= 2"),
    "sweep.n_calib": (lambda v: v >= 1, "a positive int"),
    "sweep.n_eval": (lambda v: v >= 1, "a positive int"),
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
    """Validates ``config`` against its preset (:data:`CHECKS`, ``claims.psc_m`` among
    ``psc_m``, ``real_n`` among ``real_ns``, ``n_near < real_n``); raises ValueError naming
    the key."""
    check(config, get_config, CHECKS)
    require(config.claims.psc_m in config.psc_m, "claims.psc_m", config.claims.psc_m,
            f"one of psc_m={list(config.psc_m)}")
    require(config.real_n in config.real_ns, "real_ns", list(config.real_ns),
            f"a list holding real_n={config.real_n}")
    require(config.n_near < min(config.real_ns), "n_near", config.n_near,
            f"fewer than the smallest N in real_ns={list(config.real_ns)}")
    return config


def _above_chance(value, n_docs, trials):
    """``value`` exceeds chance ``1/N`` by two binomial standard errors over ``trials``."""
    p = 1.0 / n_docs
    return value > p + 2 * np.sqrt(p * (1 - p) / trials)


def _beats_accuracy(a, b, trials):
    """Accuracy ``a`` exceeds ``b`` by two standard errors of a difference of two
    proportions over ``trials`` prompts each (pooled rate)."""
    p = (a + b) / 2
    return a - b > 2 * np.sqrt(2 * p * (1 - p) / trials)


def claim_rules(c, results: dict) -> list[dict]:
    """The paper's claims decided on a results dict (a pure function: the thresholds from
    ``c.claims`` / ``c.sim``, the numbers from ``results``, which needs ``"real"`` (the
    real LM's curves per method at ``c.real_n``), ``"sim"`` (curves per str(N) of
    ``c.sim.ns``), ``"rounds_fit"`` (simulated), ``"real_rounds_fit"`` and
    ``"mismatch_profile_signal"`` (max TPR - FPR of the mismatch LM's profile)).

    "Beats" on accuracies means by two standard errors (:func:`_beats_accuracy`); PSC and
    the matched search must beat chance 1/N by two standard errors before a claim about
    them is testable."""
    m_ref, tol, top, n = c.claims.psc_m, c.claims.f1_tol, max(c.budgets), c.real_n
    real = results["real"]
    match_real = queries_to_match(real, m_ref, tol)
    match_sim = {ns: queries_to_match(results["sim"][str(ns)], m_ref, tol) for ns in c.sim.ns}

    def beats(m, n_docs, trials):  # testable only when PSC is clearly better than guessing
        return (_above_chance(m["psc_f1"], n_docs, trials) and m["gp_queries"] is not None
                and m["saving"] >= c.claims.min_saving)

    acc = {k: real[k][-1]["accuracy"] for k in ("gold_panning", "gold_panning_mismatch",
                                                "bayes_random_order_mismatch")}
    acc["single_pass"] = real["single_pass"][0]["accuracy"]
    acc["mismatch_profile_signal"] = float(results["mismatch_profile_signal"])
    fit, real_fit = results["rounds_fit"], results["real_rounds_fit"]
    mm, ne = acc["gold_panning_mismatch"], c.n_eval
    return [
        claim(f"GOLD PANNING reaches PSC's F1 (m={m_ref}, within {tol}) with at least "
              f"{c.claims.min_saving:.0%} fewer queries on the real LM at N={n} (PSC must "
              "beat chance 1/N by 2 standard errors)",
              "queries to reach PSC's F1", match_real, beats(match_real, n, ne)),
        claim("... and on the simulated LM (profile resized to N) at every N",
              "queries to reach PSC's F1 per N", match_sim,
              all(beats(m, ns, c.sim.n_trials) for ns, m in match_sim.items())),
        claim(f"rounds grow like log N on the simulated LM (fit a + b ln N, b > 0, R^2 >= "
              f"{c.claims.log_r2})", "fit", fit, fit["b"] > 0 and fit["r2"] >= c.claims.log_r2),
        claim(f"... and on the real LM at N in {list(c.real_ns)} (each N calibrated)",
              "fit", real_fit, real_fit["b"] > 0 and real_fit["r2"] >= c.claims.log_r2),
        claim(f"calibration mismatch: with the other LM's profile GOLD PANNING stays within "
              f"{c.claims.mismatch_gap} of the matched profile's accuracy and beats, under the "
              f"same mismatched profile, the random-order Bayesian search and the single pass "
              f"(by 2 standard errors; real LM, budget {top}; the matched accuracy must beat "
              f"chance 1/N by 2 standard errors, and the other profile carry signal, max "
              f"TPR - FPR >= {c.sim.min_signal})",
              "accuracies", acc,
              bool(_above_chance(acc["gold_panning"], n, ne)
                   and acc["mismatch_profile_signal"] >= c.sim.min_signal
                   and mm >= acc["gold_panning"] - c.claims.mismatch_gap
                   and _beats_accuracy(mm, acc["bayes_random_order_mismatch"], ne)
                   and _beats_accuracy(mm, acc["single_pass"], ne))),
    ]


def run(config, workdir: str) -> dict:
    """Runs the experiment; writes ``results.json``, ``report.md`` and plots; returns results."""
    c = check_config(config)
    t0 = time.time()
    model, tok, key = load_lm(c.model, c.zoo)
    other, tok_mm, key_mm = load_lm(c.model_mismatch, c.zoo_mismatch)
    t_train = time.time() - t0
    logging.info("gold_panning: models %s and %s ready (%.0f s)", key, key_mm, t_train)
    n = c.real_n
    prof = calibrate(model, tok, n, c.n_calib, c.batch_size, CALIB_SEED, c.n_near)
    prof_mm = calibrate(other, tok_mm, n, c.n_calib, c.batch_size, CALIB_SEED, c.n_near)
    t_cal = time.time() - t0 - t_train
    logging.info("gold_panning: profile tpr=%s fpr=%s", prof.tpr.round(2), prof.fpr.round(2))

    ds = documents(c.n_eval, EVAL_SEED, n, c.n_near)
    gold = np.asarray(ds["gold_doc"])
    lm = LMQuery(model, tok, ds, c.batch_size)
    real = compare(lm, n, gold, prof, prof_mm, c, list(c.budgets), list(c.psc_m), c.seed,
                   values=lm.values)
    real["model_queries"] = lm.calls
    t_real = time.time() - t0 - t_train - t_cal
    by_n = real_rounds(model, tok, c, prof)
    real_fit = fit_log(c.real_ns, [by_n[str(v)]["rounds"] for v in c.real_ns])
    t_by_n = time.time() - t0 - t_train - t_cal - t_real

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
        sim[str(ns)] = compare(q, ns, g, p, pm, c, budgets, list(c.psc_m), c.seed + ns)
        rounds.append(sim[str(ns)]["gold_panning_rounds"])
    fit = fit_log(c.sim.ns, rounds)

    results = {
        "task": {"n_docs": n, "n_near": c.n_near,
                 "generator": "kv_near_miss" if c.n_near else "kv_retrieval"},
        "profile": {"tpr": prof.tpr, "fpr": prof.fpr},
        "profile_mismatch": {"tpr": prof_mm.tpr, "fpr": prof_mm.fpr},
        "mismatch_profile_signal": float(gp.diagnosticity(prof_mm).max()),
        "real": real, "real_by_n": by_n, "real_rounds_fit": real_fit,
        "sim": sim,
        "sim_profile": {"source": source, "max_signal_measured": signal,
                        "tpr": base.tpr, "fpr": base.fpr},
        "sim_rounds": dict(zip([str(v) for v in c.sim.ns], rounds, strict=True)),
        "rounds_fit": fit, "zoo": {"model": key, "mismatch": key_mm},
        "seconds": {"train_or_load": t_train, "calibrate": t_cal, "real": t_real,
                    "real_by_n": t_by_n, "total": time.time() - t0},
    }
    results["claims"] = claim_rules(c, results)
    results["regime"] = regime_checks(results)
    report = _report(c, results)
    plots = _plots(workdir, c, results)
    results = to_jsonable(results)
    write_outputs(workdir, name="gold_panning", config=c, results=results, report=report,
                  plots=plots)
    return results


def _rows(curves: dict) -> list[dict]:
    rows = []
    for name in METHODS:
        for r in curves[name]:
            row = {"method": name, "budget": r["budget"], "mean queries": r["queries"],
                   "accuracy": r["accuracy"], "F1": r["f1"]}
            if "answer_f1" in r:
                row["answer F1"] = r["answer_f1"]
            rows.append(row)
    return rows


def _report(c, res) -> str:
    prof = [{"position": p, "TPR": t, "FPR": f, "TPR (mismatch LM)": tm, "FPR (mismatch LM)": fm}
            for p, (t, f, tm, fm) in enumerate(zip(res["profile"]["tpr"], res["profile"]["fpr"],
                                                   res["profile_mismatch"]["tpr"],
                                                   res["profile_mismatch"]["fpr"], strict=True))]
    searches = ("gold_panning", "info_gain", "bayes_random_order", "gold_panning_mismatch",
                "bayes_random_order_mismatch")
    sim_rows = [{"N": ns, **{m: res["sim"][str(ns)][m + "_rounds"] for m in searches},
                 "GP acc": res["sim"][str(ns)]["gold_panning"][-1]["accuracy"],
                 "GP mismatch acc": res["sim"][str(ns)]["gold_panning_mismatch"][-1]["accuracy"],
                 f"PSC acc (m={max(c.psc_m)})": res["sim"][str(ns)]["psc"][-1]["accuracy"],
                 "single acc": res["sim"][str(ns)]["single_pass"][0]["accuracy"]}
                for ns in c.sim.ns]
    by_n = [{"N": ns, **res["real_by_n"][str(ns)]} for ns in c.real_ns]
    fit, rfit = res["rounds_fit"], res["real_rounds_fit"]
    task = (f"multi-document QA with {c.n_near} near-miss distractors per prompt (keys one "
            "character off the asked key, conflicting values; `kv_near_miss`)" if c.n_near
            else "multi-document key-value QA (`kv_retrieval`, exact lookup)")
    return (
        f"Zoo LMs: `{res['zoo']['model']}` (queried) and `{res['zoo']['mismatch']}` (its "
        f"profile is the calibration-mismatch runs'). Task: {task}.\n\n"
        f"## Diagnosticity profile at N={c.real_n} ({c.n_calib} prompts per position)\n\n"
        + markdown_table(prof) +
        f"\n## Real LM, N={c.real_n}, {c.n_eval} held-out prompts "
        f"({res['real']['model_queries']} model queries in all)\n\n"
        "Budget = queries allowed (the Bayesian searches stop earlier at belief "
        f"{c.gp.threshold}; mean queries counts what they used); PSC: budget = m shuffles. "
        "F1: target identification (abstaining when no document is named); answer F1: "
        "SQuAD token F1 of the answer (the named document's value) with the answer's "
        "characters as tokens.\n\n"
        + markdown_table(_rows(res["real"])) +
        f"\n## Rounds vs N on the real LM ({c.sweep.n_eval} prompts per N, "
        f"{c.sweep.n_calib} calibration prompts per position; budget {max(c.budgets)})\n\n"
        + markdown_table(by_n) +
        f"\nFit rounds = a + b ln N: a={rfit['a']:.3f}, b={rfit['b']:.3f}, "
        f"R^2={rfit['r2']:.3f}.\n"
        f"\n## Simulated LM with the real profile resized to N ({c.sim.n_trials} trials, "
        f"budget {c.sim.budget})\n\nThese numbers are not from an LM reading N documents: the "
        f"simulated model's profile is {res['sim_profile']['source']}, interpolated over "
        "relative position (FPR scaled to keep the total false-follow mass); the mismatch "
        "runs search with the other LM's measured profile.\n\nMean rounds per method:\n\n"
        + markdown_table(sim_rows) +
        f"\nFit rounds = a + b ln N: a={fit['a']:.3f}, b={fit['b']:.3f}, R^2={fit['r2']:.3f}.\n"
    )


def _plots(workdir, c, res) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in METHODS:
        rows = res["real"][name]
        axes[0].plot([r["queries"] for r in rows], [r["f1"] for r in rows], "o-", label=name)
    axes[0].set(xlabel="mean model queries", ylabel="F1", title=f"real LM, N={c.real_n}")
    axes[0].legend(fontsize=7)
    ns = list(c.sim.ns)
    axes[1].plot(ns, [res["sim_rounds"][str(v)] for v in ns], "o-", label="simulated")
    axes[1].plot(list(c.real_ns), [res["real_by_n"][str(v)]["rounds"] for v in c.real_ns],
                 "s-", label="real LM")
    fit = res["rounds_fit"]
    xs = np.linspace(min(ns), max(ns), 50)
    axes[1].plot(xs, fit["a"] + fit["b"] * np.log(xs), "--", label=f"a+b ln N, R2={fit['r2']:.2f}")
    axes[1].set(xscale="log", xlabel="N", ylabel="mean rounds", title="GOLD PANNING rounds vs N")
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
