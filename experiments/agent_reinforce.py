"""Agent-REINFORCE experiment: searching multi-LLM collaboration graphs under a FLOPs budget
(lab.methods.agent_reinforce), against random search, plain REINFORCE on the same
distribution and fixed topologies.

On a dev batch of hard arithmetic chains each search (``agent``, ``reinforce``, ``random``;
``config.seeds`` seeds) evaluates ``config.n_graphs`` sampled graphs; the best feasible one is
scored on held-out problems. Fixed topologies with the largest model (best-of-N, self-refine,
debate; the largest size within the budget) and the cheapest graph (one solver of the smallest
model, the shortcut baseline) are scored beside them. A pilot grid (single-model graphs of
every width and depth) on the hard and an easy level measures the paper's three insights.

  python -m experiments.agent_reinforce --config=configs/agent_reinforce.py:default \
      --workdir=/tmp/agent_reinforce
"""

from __future__ import annotations

import time

import numpy as np

from configs.agent_reinforce import get_config
from lab import launch, outputs
from lab import timing as host_timing
from lab.config import check, require
from lab.data.synthetic.arithmetic import arithmetic
from lab.methods import agent_reinforce as ar

SEARCHES = ("agent", "reinforce", "random")
FIXED = ("best_of_n", "self_refine", "debate")

# Rules of the claims and the regime (fixed before the default run).
MODEL_GAP = 0.1            # regime: largest minus smallest model's single-chain accuracy
COST_RATIO = 1.5           # regime: largest over smallest model's FLOPs per chain
SPREAD_MIN = 0.1           # regime: best minus median accuracy of random graphs
MAJORITY_MAX = 0.1         # regime: the most common gold answer's share (no answer prior)
MIX_MARGIN = 0.02          # insight 1: best graph beats the best largest-model-only graph
KNOB_GAIN = 0.03           # insight 2: width / depth help by at least this ...
SATURATION = 1 / 3         # ... and the last increment is at most this share of the gain
TRANSFER_LOSS = 0.02       # insight 3: an optimum carried to the other level loses this


def _checks():
    pos = (lambda v: v >= 1, "an int >= 1")
    return {"n_dev": pos, "n_test": pos, "rows": pos, "max_width": pos,
            "max_depth": (lambda v: v >= 0, "an int >= 0"), "n_graphs": pos, "batch": pos,
            "seeds": pos, "sweep_width": (lambda v: v >= 2, "an int >= 2"),
            "sweep_depth": pos, "budget": (lambda v: v > 0, "> 0"),
            "latency_weight": (lambda v: v >= 0, ">= 0"),
            "pool": (lambda v: len(v) >= 1, "a non-empty model pool")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    check(config, get_config, _checks())
    require(len(config.pool) >= 2, "pool", config.pool, "at least two models to combine")
    require(config.n_dev <= config.rows and config.n_test <= config.rows, "n_dev",
            config.n_dev, f"<= rows={config.rows} (one batched call per node)")
    return config


# --------------------------------------------------------------------------- rules


def _saturates(curve) -> tuple[float, float, bool]:
    """``(gain, last increment, holds)``: the knob helps (max - first >= KNOB_GAIN) and
    saturates or peaks inside (the last increment <= SATURATION * gain, or argmax < end)."""
    a = np.asarray(curve, float)
    gain, last = float(a.max() - a[0]), float(a[-1] - a[-2])
    holds = gain >= KNOB_GAIN and (last <= SATURATION * gain or int(a.argmax()) < len(a) - 1)
    return gain, last, bool(holds)


def claim_rules(m: dict) -> list[dict]:
    """The claims on measured ``m``: ``auc``, ``test`` (per search, per seed), ``fixed_test``
    (per topology), ``hypervolume`` (per search), ``mix`` (insight 1), ``width_curve``,
    ``depth_curve`` (insight 2), ``levels`` (insight 3)."""
    mean = {s: float(np.mean(m["auc"][s])) for s in SEARCHES}
    test = {s: float(np.mean(m["test"][s])) for s in SEARCHES}
    best_fixed = max(m["fixed_test"], key=m["fixed_test"].get)
    hv = m["hypervolume"]
    mix = m["mix"]
    wg, wl, wh = _saturates(m["width_curve"])
    dg, dl, dh = _saturates(m["depth_curve"])
    lv = m["levels"]
    loss = max(lv["easy_loss"], lv["hard_loss"])
    return [
        outputs.claim("Sample efficiency: Agent-REINFORCE's best-so-far accuracy, averaged over "
                      "the graphs evaluated (area under the curve, mean over seeds), is above "
                      "random search's and plain REINFORCE's",
                      "mean AUC agent / reinforce / random",
                      [mean["agent"], mean["reinforce"], mean["random"]],
                      mean["agent"] > max(mean["reinforce"], mean["random"])),
        outputs.claim("Search performance: the graphs Agent-REINFORCE returns are more accurate "
                      "on held-out problems than random search's and REINFORCE's (mean over "
                      "seeds)", "held-out accuracy agent / reinforce / random",
                      [test["agent"], test["reinforce"], test["random"]],
                      test["agent"] > max(test["reinforce"], test["random"])),
        outputs.claim("Under the same budget Agent-REINFORCE's graphs beat every fixed topology "
                      "of the largest model (best-of-N, self-refine, debate) on held-out "
                      "problems", f"held-out agent (mean) - {best_fixed}",
                      test["agent"] - m["fixed_test"][best_fixed],
                      test["agent"] > m["fixed_test"][best_fixed]),
        outputs.claim("Agent-REINFORCE's accuracy-latency Pareto front dominates more than "
                      "random search's and REINFORCE's (hypervolume)",
                      "hypervolume agent / reinforce / random",
                      [hv["agent"], hv["reinforce"], hv["random"]],
                      hv["agent"] > max(hv["reinforce"], hv["random"])),
        outputs.claim(f"Insight 1: under the budget the best graph is not the largest model "
                      f"alone: it uses another model and beats the best largest-model-only "
                      f"graph by >= {MIX_MARGIN} held out",
                      "held-out best - best largest-only; best uses another model",
                      [mix["test_best"] - mix["test_largest"], mix["other_model"]],
                      bool(mix["other_model"] and mix["test_best"] - mix["test_largest"]
                           >= MIX_MARGIN)),
        outputs.claim(f"Insight 2a: accuracy vs width (largest model, votes) rises by >= "
                      f"{KNOB_GAIN} then saturates (last step <= {SATURATION:.2f} of the gain) "
                      "or peaks inside", "gain, last increment", [wg, wl], wh),
        outputs.claim(f"Insight 2b: accuracy vs depth (largest model, refinement rounds) rises "
                      f"by >= {KNOB_GAIN} then saturates or peaks inside",
                      "gain, last increment", [dg, dl], dh),
        outputs.claim(f"Insight 3: the optimal graph (accuracy - latency weight x latency, "
                      f"within the budget) differs between the easy and the hard level, and "
                      f"carrying one level's optimum to the other loses >= {TRANSFER_LOSS}",
                      "optima differ; largest transfer loss", [lv["differ"], loss],
                      bool(lv["differ"] and loss >= TRANSFER_LOSS)),
    ]


def regime_rules(m: dict) -> list[dict]:
    """Regime checks on ``m``: ``single`` (per model: accuracy, flops), ``spread``,
    ``majority``."""
    acc = [s["accuracy"] for s in m["single"]]
    flops = [s["flops"] for s in m["single"]]
    return [
        outputs.regime(f"the pool's models differ in accuracy: largest - smallest single "
                       f"chain >= {MODEL_GAP}", acc[-1] - acc[0], acc[-1] - acc[0] >= MODEL_GAP),
        outputs.regime(f"the pool's models differ in cost: largest / smallest FLOPs per chain "
                       f">= {COST_RATIO}", flops[-1] / flops[0],
                       flops[-1] / flops[0] >= COST_RATIO),
        outputs.regime(f"graphs differ: best - median accuracy of the random search's graphs "
                       f">= {SPREAD_MIN}", m["spread"], m["spread"] >= SPREAD_MIN),
        outputs.regime(f"no answer prior: the most common gold answer is <= {MAJORITY_MAX} of "
                       "the dev problems", m["majority"], m["majority"] <= MAJORITY_MAX),
    ]


# --------------------------------------------------------------------------- run


def _problems(n, seed, steps):
    return ar.Problems.from_dataset(arithmetic(n, seed=seed, steps=tuple(steps), digits=2))


def _largest_fits(build, sizes, ex, dev, obj):
    """The largest size whose graph is within the budget on dev (None if none is)."""
    best = None
    for k in sizes:
        g = build(k)
        if obj.feasible(ex.run(g, dev)):
            best = (k, g)
    return best


def _only(graph, model) -> bool:
    return graph.models_used() == (model,)


def measure(config, pool, ex) -> tuple[dict, dict]:
    """Every evaluation of the experiment: single models, the searches, their held-out
    scores and Pareto fronts, the fixed topologies, the joint-objective search and the
    pilot grid (each node's latency is its measured wall time). Returns the measurements
    and the seconds of the searches and the grid."""
    timing = {}
    names = pool.names
    s = config.seed
    dev = _problems(config.n_dev, 1000 + s, config.hard_steps)
    test = _problems(config.n_test, 2000 + s, config.hard_steps)
    easy = _problems(config.n_dev, 3000 + s, config.easy_steps)
    obj = ar.Objective(budget=config.budget)
    joint = ar.Objective(budget=config.budget, latency_weight=config.latency_weight)
    big = pool.largest()

    single = []
    for m in range(len(pool)):
        r = ex.run(ar.best_of_n(m, 1), dev)
        single.append({"model": names[m], "params": pool.params[m], "accuracy": r.accuracy,
                       "flops": r.flops, "latency": r.latency})
    _, counts = np.unique(dev.answers, return_counts=True)
    majority = float(counts.max() / len(dev))

    # Searches.
    t = time.time()
    dist = ar.GraphDistribution(len(pool), config.max_width, config.max_depth)
    traces = {name: [] for name in SEARCHES}
    for name in SEARCHES:
        for seed in range(config.seeds):
            traces[name].append(ar.search(
                name, dist, ex, dev, obj, n_graphs=config.n_graphs, batch=config.batch,
                seed=s * 1000 + seed, step=config.agent_step,
                learning_rate=config.reinforce_lr))
    timing["search_s"] = time.time() - t

    curves, auc, test_acc, found = {}, {}, {}, {}
    for name, trs in traces.items():
        c = np.stack([np.nan_to_num(tr.best_so_far(), nan=0.0) for tr in trs])
        curves[name] = {"mean": c.mean(0).tolist(), "std": c.std(0).tolist()}
        auc[name] = c.mean(1).tolist()
        test_acc[name], found[name] = [], []
        for tr in trs:
            b = tr.best()
            g = tr.dist.to_graph(b.choices)
            rt = ex.run(g, test)
            test_acc[name].append(rt.accuracy)
            found[name].append({"graph": g.signature(names), "dev": b.result.accuracy,
                                "test": rt.accuracy, "flops": b.result.flops,
                                "latency": b.result.latency})
    rand_acc = [e.result.accuracy for tr in traces["random"] for e in tr.evaluations]
    spread = float(np.max(rand_acc) - np.median(rand_acc))

    # Pareto fronts (feasible graphs each search evaluated, all seeds).
    pts = {name: [(e.result.accuracy, e.result.latency) for tr in trs for e in tr.evaluations
                  if e.feasible] for name, trs in traces.items()}
    ref = max(t_ for p in pts.values() for _, t_ in p)
    fronts = {n: ar.pareto_front(p) for n, p in pts.items()}
    hv = {n: ar.hypervolume(f, ref) for n, f in fronts.items()}

    # Fixed topologies of the largest model, the largest size within the budget.
    fixed, fixed_test = {}, {}
    builds = {"best_of_n": (lambda k: ar.best_of_n(big, k), range(1, 17)),
              "self_refine": (lambda k: ar.self_refine(big, k), range(0, 9)),
              "debate": (lambda k: ar.debate([big] * k, 1), range(1, 9))}
    for name, (build, sizes) in builds.items():
        fit = _largest_fits(build, sizes, ex, dev, obj)
        if fit is None:
            fixed_test[name] = 0.0
            fixed[name] = {"size": None}
            continue
        k, g = fit
        rd, rt = ex.run(g, dev), ex.run(g, test)
        fixed[name] = {"size": k, "dev": rd.accuracy, "test": rt.accuracy, "flops": rd.flops,
                       "latency": rd.latency}
        fixed_test[name] = rt.accuracy
    cheap = ex.run(ar.best_of_n(pool.smallest(), 1), test)

    # Joint objective: one Agent-REINFORCE search.
    tj = ar.search("agent", dist, ex, dev, joint, n_graphs=config.n_graphs,
                   batch=config.batch, seed=s * 1000 + 99, step=config.agent_step)
    bj = tj.best()
    joint_found = {"graph": tj.dist.to_graph(bj.choices).signature(names),
                   "accuracy": bj.result.accuracy, "latency": bj.result.latency,
                   "value": bj.value}

    # Pilot grid: single-model layered graphs, every width and depth.
    t = time.time()
    grid = {}
    for level, probs in (("hard", dev), ("easy", easy)):
        rows = []
        for m in range(len(pool)):
            for w in range(1, config.sweep_width + 1):
                for d in range(config.sweep_depth + 1):
                    g = ar.layered([[m] * w] * (d + 1), [["refiner"] * w] * d,
                                   [[[False] * w] * w] * d, m)
                    r = ex.run(g, probs)
                    rows.append({"model": m, "width": w, "depth": d, "accuracy": r.accuracy,
                                 "flops": r.flops, "latency": r.latency,
                                 "feasible": obj.feasible(r), "joint": joint.value(r)})
        grid[level] = rows
    timing["grid_s"] = time.time() - t

    def cell(level, m, w, d):
        return next(r for r in grid[level] if (r["model"], r["width"], r["depth"]) == (m, w, d))

    width_curve = [cell("hard", big, w, 0)["accuracy"] for w in range(1, config.sweep_width + 1)]
    depth_curve = [cell("hard", big, 1, d)["accuracy"] for d in range(config.sweep_depth + 1)]

    # Insight 1: the best graph under the budget vs the best largest-model-only graph (dev
    # choice among everything evaluated, both scored held out).
    cands = []
    for trs in traces.values():
        for tr in trs:
            cands += [(e.result.accuracy, tr.dist.to_graph(e.choices)) for e in tr.evaluations
                      if e.feasible]
    for r in grid["hard"]:
        if r["feasible"]:
            w, d, m = r["width"], r["depth"], r["model"]
            cands.append((r["accuracy"], ar.layered([[m] * w] * (d + 1), [["refiner"] * w] * d,
                                                    [[[False] * w] * w] * d, m)))
    for name in FIXED:
        if fixed[name]["size"] is not None:
            cands.append((fixed[name]["dev"], builds[name][0](fixed[name]["size"])))
    best_acc, best_g = max(cands, key=lambda x: x[0])
    only = [c for c in cands if _only(c[1], big)]
    lb_acc, lb_g = max(only, key=lambda x: x[0])
    mix = {"best": best_g.signature(names), "dev_best": best_acc,
           "test_best": ex.run(best_g, test).accuracy, "largest": lb_g.signature(names),
           "dev_largest": lb_acc, "test_largest": ex.run(lb_g, test).accuracy,
           "other_model": not _only(best_g, big)}

    # Insight 3: the grid's optimum under the joint objective, per level, and its transfer.
    opt = {}
    for level in ("hard", "easy"):
        feas = [r for r in grid[level] if r["feasible"]]
        opt[level] = max(feas, key=lambda r: r["joint"])
    key = {lv: (o["model"], o["width"], o["depth"]) for lv, o in opt.items()}
    levels = {"hard": {**opt["hard"], "model": names[opt["hard"]["model"]]},
              "easy": {**opt["easy"], "model": names[opt["easy"]["model"]]},
              "differ": key["hard"] != key["easy"],
              "easy_loss": opt["easy"]["joint"] - cell("easy", *key["hard"])["joint"],
              "hard_loss": opt["hard"]["joint"] - cell("hard", *key["easy"])["joint"]}

    measured = {"single": single, "majority": majority, "spread": spread, "curves": curves,
                "auc": auc, "test": test_acc, "found": found, "fixed": fixed,
                "fixed_test": fixed_test, "cheapest_test": cheap.accuracy,
                "fronts": {n: [list(p) for p in f] for n, f in fronts.items()},
                "hypervolume": hv, "latency_ref": ref, "joint_search": joint_found,
                "width_curve": width_curve, "depth_curve": depth_curve, "mix": mix,
                "levels": levels, "grid": grid, "budget": config.budget,
                "executor": dict(ex.stats)}
    return measured, timing


def run(config, workdir: str) -> dict:
    """Runs the searches, the fixed topologies and the pilot grid; writes results.json,
    report.md and a plot; returns the results."""
    check_config(config)
    t0 = time.time()
    pool = ar.ModelPool.from_zoo(list(config.pool))
    order = np.argsort(pool.params)
    if list(order) != list(range(len(pool))):
        raise ValueError(f"config.pool={config.pool!r} is invalid; expected models from "
                         "smallest to largest")
    ex = ar.Executor(pool, solver_temperature=config.solver_temperature,
                     refiner_temperature=config.refiner_temperature, rows=config.rows,
                     buckets=tuple(tuple(b) for b in config.buckets), seed=config.seed)
    warmup_s = ex.warmup()  # compiles every shape, before the timed section
    with host_timing.alone("each node's latency is its measured wall time"):
        measured, timing = measure(config, pool, ex)
    timing["warmup_s"] = warmup_s
    timing["total_s"] = time.time() - t0
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing=timing)
    return outputs.write_outputs(workdir, name="agent_reinforce", config=config,
                                 results=results, report=_report(results),
                                 plots=[_plot(results, workdir)])


def search_table(r) -> list[dict]:
    """Best dev accuracy found after k graphs (mean +- std over seeds), held-out accuracy."""
    n = len(r["curves"]["agent"]["mean"])
    marks = sorted({max(1, n // 4), max(1, n // 2), n})
    rows = []
    for name in SEARCHES:
        c = r["curves"][name]
        row = {"search": name}
        for k in marks:
            row[f"best after {k}"] = f"{c['mean'][k - 1]:.3f} ± {c['std'][k - 1]:.3f}"
        row["AUC"] = float(np.mean(r["auc"][name]))
        row["held-out"] = f"{np.mean(r['test'][name]):.3f} ± {np.std(r['test'][name]):.3f}"
        row["hypervolume"] = r["hypervolume"][name]
        rows.append(row)
    return rows


def main_table(r) -> list[dict]:
    """The report's main table (``experiments.results_doc``): the searches compared."""
    return search_table(r)


def fixed_table(r) -> list[dict]:
    rows = [{"topology": n, "size": f["size"], "dev": f.get("dev"), "held-out": f.get("test"),
             "MFLOPs": f.get("flops", 0) / 1e6, "latency s": f.get("latency")}
            for n, f in r["fixed"].items()]
    rows.append({"topology": "cheapest (1 chain, smallest model)", "size": 1, "dev": None,
                 "held-out": r["cheapest_test"], "MFLOPs": None, "latency s": None})
    return rows


def _report(r) -> str:
    mix, lv = r["mix"], r["levels"]
    single = outputs.markdown_table([{k: v for k, v in s.items()} for s in r["single"]])
    return "\n".join([
        f"Budget: {r['budget'] / 1e6:.0f} MFLOPs per problem.\n",
        "## Pool (one sampled chain each, dev)\n", single, "\n",
        "## Search efficiency (dev accuracy of the best graph found)\n",
        outputs.markdown_table(search_table(r)), "\n",
        "Graphs returned: " + "; ".join(f"{n}: " + ", ".join(f"`{f['graph']}` ({f['test']:.3f})"
                                                              for f in r["found"][n])
                                        for n in SEARCHES) + "\n",
        "## Fixed topologies of the largest model within the budget\n",
        outputs.markdown_table(fixed_table(r)), "\n",
        f"Joint objective (accuracy - latency weight x latency) search: "
        f"`{r['joint_search']['graph']}`, accuracy {r['joint_search']['accuracy']:.3f}, "
        f"latency {r['joint_search']['latency']:.3f} s.\n",
        "## Pilot insights\n",
        f"1. best graph `{mix['best']}` held-out {mix['test_best']:.3f} vs best largest-only "
        f"`{mix['largest']}` {mix['test_largest']:.3f}.",
        f"2. accuracy vs width: {np.round(r['width_curve'], 3).tolist()}; vs depth: "
        f"{np.round(r['depth_curve'], 3).tolist()}.",
        f"3. joint optimum, hard: {lv['hard']['model']} w={lv['hard']['width']} "
        f"d={lv['hard']['depth']}; easy: {lv['easy']['model']} w={lv['easy']['width']} "
        f"d={lv['easy']['depth']}; transfer losses easy {lv['easy_loss']:.3f}, hard "
        f"{lv['hard_loss']:.3f}.\n",
        "Timing: " + ", ".join(f"{n} {v:.1f}" for n, v in r["timing"].items()) + "\n"])


def _plot(r, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name in SEARCHES:
        c = r["curves"][name]
        x = np.arange(1, len(c["mean"]) + 1)
        m, s = np.array(c["mean"]), np.array(c["std"])
        a1.plot(x, m, label=name)
        a1.fill_between(x, m - s, m + s, alpha=0.2)
        f = np.array(r["fronts"][name])
        a2.step(f[:, 1], f[:, 0], where="post", label=name)
    a1.set(xlabel="graphs evaluated", ylabel="best dev accuracy (budget)")
    a2.set(xlabel="latency (s)", ylabel="accuracy", title="Pareto fronts")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "agent_reinforce.png")


if __name__ == "__main__":
    launch.main(run)
