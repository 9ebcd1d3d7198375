"""Maze experiment: planning over ordered few-shot exemplars (lab.methods.maze) against
repeated sampling, on in-context rule induction (:class:`lab.methods.maze.RuleTask`).

Methods on held-out queries, with their LM calls per query:

* ``zero_shot`` (1): the query alone (the no-context shortcut baseline);
* ``random`` (1): k random exemplars in random order;
* ``nearest`` (1): the k exemplars most cosine-similar to the query under the encoder,
  the most similar next to the query;
* ``fixed_best`` (1): the one ordering, of ``n_fixed`` random candidates, most accurate
  on the training queries (prompt optimisation);
* ``maze`` (1): beam search under the trained path scorer, one call on the top path;
* ``multimaze`` (m): the top-m paths, majority vote;
* ``best_of_n`` / ``self_consistency`` (N): N random trajectories, an oracle picks any
  correct answer / majority vote; ``best_of_n_zero_shot`` / ``self_consistency_zero_shot``
  (N): N answers sampled at temperature 1 from the query alone.

  python -m experiments.maze --config=configs/maze.py:default --workdir=/tmp/maze
"""

from __future__ import annotations

import time

import numpy as np
from flax import nnx

from configs.maze import get_config
from lab import launch, outputs
from lab.config import SEEDS, check, require
from lab.methods import maze

SINGLE = ("random", "nearest", "fixed_best")
METHODS = ("zero_shot", "random", "nearest", "fixed_best", "maze", "multimaze",
           "best_of_n", "self_consistency", "best_of_n_zero_shot",
           "self_consistency_zero_shot")

# Rules of the claims and the regime (fixed before the default run).
MAZE_MARGIN = 0.1          # single-call Maze above the best single-call baseline by this
RECOVER_MIN = 0.5          # MultiMaze recovers at least this fraction of best-of-N's gain
CALLS_MAX = 0.25           # ... with at most this fraction of its calls
AUC_MIN = 0.6              # the scorer ranks held-out trajectories above chance (0.5)
SPREAD_MIN = 0.15          # regime: best of R random trajectories - median, held out
READER_MIN = 0.9           # regime: the reader applies the rule next to the query
CHANCE_TOL = 0.1           # regime: zero-shot and majority answers near chance


def _checks():
    pos = (lambda v: v >= 1, "an int >= 1")
    return {"n_train": pos, "n_test": pos, "logged": (lambda v: v >= 2, "an int >= 2"),
            "regime_samples": (lambda v: v >= 2, "an int >= 2"), "n_fixed": pos,
            "beam": pos, "m": pos, "n": pos, "pool_size": pos, "task.k": pos,
            "seeds": SEEDS,
            "scorer.steps": pos, "reader.steps": pos}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    check(config, get_config, _checks())
    require(config.task.k <= config.pool_size, "task.k", config.task.k,
            f"<= pool_size={config.pool_size}")
    return config


def claim_rules(m: dict) -> list[dict]:
    """The claims on measured ``m`` (``accuracy[name]``, ``calls[name]``, ``auc``)."""
    acc, calls = m["accuracy"], m["calls"]
    best = max(SINGLE, key=lambda n: acc[n])
    gain = acc["best_of_n"] - acc["random"]
    rec = (acc["multimaze"] - acc["random"]) / gain if gain > 0 else float("nan")
    frac = calls["multimaze"] / calls["best_of_n"]
    return [
        outputs.claim(f"Single-call Maze beats the best single-call baseline by >= "
                      f"{MAZE_MARGIN} accuracy", f"accuracy maze - {best}",
                      acc["maze"] - acc[best], acc["maze"] - acc[best] >= MAZE_MARGIN),
        outputs.claim(f"MultiMaze recovers >= {RECOVER_MIN} of best-of-N's gain over "
                      f"random exemplars with <= {CALLS_MAX} of its calls",
                      "(multimaze - random) / (best_of_n - random); calls fraction",
                      [rec, frac], bool(gain > 0 and rec >= RECOVER_MIN
                                        and frac <= CALLS_MAX)),
        outputs.claim(f"The path scorer ranks held-out trajectories above chance (pairwise "
                      f"AUC >= {AUC_MIN})", "held-out pairwise AUC", m["auc"],
                      bool(m["auc"] >= AUC_MIN)),
    ]


def regime_rules(m: dict) -> list[dict]:
    """Regime checks on ``m`` (``spread``, ``reader``, ``accuracy``, ``majority``,
    ``chance``: the held-out accuracy of the best single rule applied to every query, the
    most a reader that sees the query and no exemplar can score; ``answer_chance``: one
    over the number of values)."""
    ch = m["chance"]
    return [
        outputs.regime(f"exemplar choice and order matter: best of the random trajectories "
                       f"- median, held out, >= {SPREAD_MIN}", m["spread"],
                       m["spread"] >= SPREAD_MIN),
        outputs.regime(f"the reader applies the rule of the exemplar next to the query "
                       f"(accuracy >= {READER_MIN})", m["reader"], m["reader"] >= READER_MIN),
        outputs.regime(f"no shortcut: the query alone is within {CHANCE_TOL} of the best "
                       f"single rule applied to every query ({ch:.3g})",
                       m["accuracy"]["zero_shot"],
                       m["accuracy"]["zero_shot"] <= ch + CHANCE_TOL),
        outputs.regime(f"no shortcut: the majority answer is within {CHANCE_TOL} of chance "
                       f"(1 / values = {m['answer_chance']:.3g})", m["majority"],
                       m["majority"] <= m["answer_chance"] + CHANCE_TOL),
    ]


def _random_paths(rng, n, r, pool, k):
    return np.stack([[rng.permutation(pool)[:k] for _ in range(r)] for _ in range(n)])


def _outcomes(lm, queries, answers, paths):
    n, r, _ = paths.shape
    items = [(q, p) for q, ps in zip(queries, paths, strict=True) for p in ps]
    return (lm(items).reshape(n, r) == np.asarray(answers)[:, None]).astype(np.float32)


def run_seed(config, seed: int) -> dict:
    """One seed's world (its rules, pool and queries), reader, logged outcomes and path
    scorer; every method on its held-out queries. Returns the measured numbers."""
    t0 = time.time()
    task = maze.RuleTask(seed=seed, **config.task)
    k, pool_n = task.k, config.pool_size
    model, rl = maze.train_reader(task, seed=seed, **config.reader)
    rng = np.random.default_rng([seed, 1])
    tok, y = task.reader_batch(rng, 512)
    reader = float(np.mean(np.asarray(model(tok)[:, -1, :task.n_values]).argmax(-1) == y))
    timing = {"reader_train_s": time.time() - t0}

    pool, pi, tags, qa, ans = task.world(pool_n, config.n_train + config.n_test, seed)
    queries = list(zip(tags.tolist(), qa.tolist(), strict=True))
    tr, te = slice(0, config.n_train), slice(config.n_train, None)
    q_tr, q_te, a_tr, a_te = queries[tr], queries[te], ans[tr], ans[te]
    lm = maze.ReaderLM(model, task, pool)
    enc = maze.lm_encoder(model, task.tokenize, layer=config.encoder_layer)
    t1 = time.time()
    pool_emb = enc.encode([task.exemplar_text(e) for e in pool])
    q_emb = enc.encode([task.query_text(*q) for q in queries])
    timing["encode_s"] = time.time() - t1

    # Logged outcomes on training queries; the scorer.
    paths_tr = _random_paths(rng, config.n_train, config.logged, pool_n, k)
    succ_tr = _outcomes(lm, q_tr, a_tr, paths_tr)
    logged_calls = lm.calls
    t2 = time.time()
    scorer = maze.PathScorer(pool_emb.shape[1], k, config.scorer.hidden,
                             rngs=nnx.Rngs(seed))
    losses = maze.train_path_scorer(scorer, q_emb[tr], pool_emb, paths_tr, succ_tr,
                                    steps=config.scorer.steps,
                                    learning_rate=config.scorer.learning_rate,
                                    weight_decay=config.scorer.weight_decay)
    timing["scorer_train_s"] = time.time() - t2

    # Regime and held-out ranking on R random trajectories per held-out query.
    paths_te = _random_paths(rng, config.n_test, config.regime_samples, pool_n, k)
    succ_te = _outcomes(lm, q_te, a_te, paths_te)
    spread = float(np.mean(succ_te.max(1) - np.median(succ_te, 1)))
    auc = maze.ranking_auc(np.asarray(maze.trajectory_scores(scorer, q_emb[te], pool_emb,
                                                             paths_te)), succ_te)

    acc, calls, wall = {}, {}, {}

    def measure(name, fn, n_calls):
        lm.calls, lm.seconds = 0, 0.0
        t = time.time()
        pred = fn()
        acc[name] = float(np.mean(pred))
        calls[name] = lm.calls / config.n_test
        wall[name] = {"lm_s": lm.seconds, "total_s": time.time() - t}
        assert calls[name] == n_calls, (name, calls[name])

    n = config.n
    measure("zero_shot", lambda: lm.logits(q_te, None, zero_shot=True).argmax(-1) == a_te, 1)
    first = paths_te[:, 0]
    measure("random", lambda: lm(list(zip(q_te, first, strict=True))) == a_te, 1)
    qn = q_emb[te] / np.linalg.norm(q_emb[te], axis=1, keepdims=True)
    pn = pool_emb / np.linalg.norm(pool_emb, axis=1, keepdims=True)
    near = np.argsort(-(qn @ pn.T), axis=1)[:, :k]
    measure("nearest", lambda: lm(list(zip(q_te, near, strict=True))) == a_te, 1)
    cands = _random_paths(rng, 1, config.n_fixed, pool_n, k)[0]
    cand_acc = _outcomes(lm, q_tr, a_tr, np.repeat(cands[None], config.n_train, 0)).mean(0)
    fixed = cands[int(np.argmax(cand_acc))]
    measure("fixed_best", lambda: lm([(q, fixed) for q in q_te]) == a_te, 1)

    t3 = time.time()
    planned = [maze.beam_search(maze.scorer_fn(scorer, q_emb[te][i], pool_emb), pool_n, k,
                                beam=config.beam, top=config.m)[0]
               for i in range(config.n_test)]
    planner_s = time.time() - t3
    measure("maze", lambda: np.array([maze.maze_answer(lm, q, p) for q, p in
                                      zip(q_te, planned, strict=True)]) == a_te, 1)
    measure("multimaze", lambda: np.array([maze.multimaze_answer(lm, q, p, config.m) for q, p
                                           in zip(q_te, planned, strict=True)]) == a_te,
            config.m)
    bon = _random_paths(rng, config.n_test, n, pool_n, k)
    items = [(q, p) for q, ps in zip(q_te, bon, strict=True) for p in ps]
    got = {}

    def sampled():
        got["a"] = lm(items).reshape(config.n_test, n)
        return (got["a"] == a_te[:, None]).any(1)

    measure("best_of_n", sampled, n)
    sc = np.array([maze.vote(r) for r in got["a"]]) == a_te
    acc["self_consistency"], calls["self_consistency"] = float(sc.mean()), n
    wall["self_consistency"] = wall["best_of_n"]
    def sampled_zero_shot():
        got["z"] = lm.sample(q_te, None, n, seed, zero_shot=True)
        return (got["z"] == a_te[:, None]).any(1)

    measure("best_of_n_zero_shot", sampled_zero_shot, n)
    acc["self_consistency_zero_shot"] = float(np.mean(
        np.array([maze.vote(r) for r in got["z"]]) == a_te))
    calls["self_consistency_zero_shot"] = n
    wall["self_consistency_zero_shot"] = wall["best_of_n_zero_shot"]
    for name in ("maze", "multimaze"):
        wall[name]["planner_s"] = planner_s
        wall[name]["total_s"] += planner_s

    majority = float(np.max(np.bincount(a_te, minlength=task.n_values)) / len(a_te))
    qa_te = np.array([a for _, a in q_te])
    rule_chance = float(max(np.mean(task.perms()[r, qa_te] == a_te)
                            for r in range(task.n_rules)))
    gain = acc["best_of_n"] - acc["random"]
    measured = {"accuracy": acc, "calls": calls, "wall": wall, "auc": auc, "spread": spread,
                "reader": reader, "majority": majority, "chance": rule_chance,
                "answer_chance": 1.0 / task.n_values,
                "recovered": (acc["multimaze"] - acc["random"]) / gain if gain > 0 else None,
                "calls_fraction": calls["multimaze"] / calls["best_of_n"],
                "planner": {"s_per_query": planner_s / config.n_test,
                            "lm_s_per_call": wall["maze"]["lm_s"] / config.n_test},
                "logged_calls_per_train_query": logged_calls / config.n_train,
                "scorer_loss": {"first": float(losses[0]), "last": float(losses[-1])},
                "reader_loss_last": float(rl[-1]), "fixed_train_acc": float(cand_acc.max())}
    timing["total_s"] = time.time() - t0
    return dict(measured, seed=seed, timing=timing, scorer_losses=losses.tolist())


def over_seeds(per_seed: list[dict]) -> dict:
    """The numbers the claims and regime checks read, from each seed's :func:`run_seed`:
    every accuracy, wall time, AUC, spread, reader accuracy, majority share and chance
    level is the mean over seeds (calls per query are the same on every seed); MultiMaze's
    share of best-of-N's gain is computed from the mean accuracies. ``per_seed`` keeps
    each seed's numbers."""
    first = per_seed[0]
    acc = outputs.means_over(per_seed, METHODS, "accuracy")
    wall = {n: outputs.means_over(per_seed, first["wall"][n], "wall", n) for n in METHODS}
    gain = acc["best_of_n"] - acc["random"]
    keys = ("auc", "spread", "reader", "majority", "chance", "answer_chance",
            "logged_calls_per_train_query", "reader_loss_last", "fixed_train_acc")
    return {"accuracy": acc, "calls": first["calls"], "wall": wall,
            **outputs.means_over(per_seed, keys),
            "recovered": (acc["multimaze"] - acc["random"]) / gain if gain > 0 else None,
            "calls_fraction": first["calls_fraction"],
            "planner": outputs.means_over(per_seed, first["planner"], "planner"),
            "scorer_loss": outputs.means_over(per_seed, first["scorer_loss"], "scorer_loss"),
            "seeds": [s["seed"] for s in per_seed], "per_seed": per_seed}


def run(config, workdir: str) -> dict:
    """Runs every seed of ``config.seeds`` (:func:`run_seed`) and decides the claims and
    regime checks on the means over seeds (:func:`over_seeds`); writes results.json,
    report.md and a plot; returns the results."""
    check_config(config)
    t0 = time.time()
    measured = over_seeds([run_seed(config, seed) for seed in config.seeds])
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing={"total_s": time.time() - t0})
    return outputs.write_outputs(workdir, name="maze", config=config, results=results,
                                 report=_report(results), plots=[_plot(results, workdir)])


def main_table(results) -> list[dict]:
    """The calls-vs-accuracy table: one row per method (means over seeds)."""
    return [{"method": n, "LM calls / query": results["calls"][n],
             "accuracy": results["accuracy"][n], "LM s": results["wall"][n]["lm_s"],
             "planner s": results["wall"][n].get("planner_s", 0.0),
             "total s": results["wall"][n]["total_s"]} for n in METHODS]


def _report(r) -> str:
    return "\n".join([
        "## Held-out accuracy vs LM calls (means over seeds)\n",
        outputs.markdown_table(main_table(r)), "\n",
        f"MultiMaze recovers {outputs.format_value(r['recovered'])} of best-of-N's gain "
        f"over random exemplars with {r['calls_fraction']:.3f} of its calls. Planner: "
        f"{r['planner']['s_per_query'] * 1e3:.2f} ms per query (beam search, no LM) beside "
        f"{r['planner']['lm_s_per_call'] * 1e3:.2f} ms per LM call. Path scorer: held-out "
        f"pairwise AUC {r['auc']:.3f}, ranking loss {r['scorer_loss']['first']:.3f} -> "
        f"{r['scorer_loss']['last']:.3f}; logged {r['logged_calls_per_train_query']:.0f} "
        "calls per training query.\n",
        f"Means over seeds {r['seeds']}; each seed draws its own rules, pool, queries, "
        "reader and scorer:\n", outputs.markdown_table(seed_table(r)), "\n",
        f"Total {r['timing']['total_s']:.0f} s.\n"])


def seed_table(r) -> list[dict]:
    """One row per seed: the numbers each claim reads."""
    rows = []
    for s in r["per_seed"]:
        a = s["accuracy"]
        rows.append({"seed": s["seed"], "maze": a["maze"], "multimaze": a["multimaze"],
                     "best single call": max(a[n] for n in SINGLE), "random": a["random"],
                     "best_of_n": a["best_of_n"], "recovered": s["recovered"],
                     "scorer AUC": s["auc"], "query alone": a["zero_shot"],
                     "best single rule": s["chance"], "seconds": s["timing"]["total_s"]})
    return rows


def _plot(r, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for n in METHODS:
        ax.scatter(r["calls"][n], r["accuracy"][n], label=n)
    ax.set(xscale="log", xlabel="LM calls per query", ylabel="held-out accuracy",
           ylim=(-0.02, 1.02))
    ax.legend(fontsize=6)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "maze.png")


if __name__ == "__main__":
    launch.main(run)
