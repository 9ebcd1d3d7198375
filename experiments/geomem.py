"""Geometric memorization: how small an embedding can memorise N*R random facts.

Measures, per number of entities N, the smallest embedding dimension at which
the closed-form construction and gradient-descent training recall 99% of R
random bijections, and fits both against log N (a positive slope whose 95%
t-interval excludes 0, at least five N, log beating linear in N); compares the
widths with the counting bound ``R log2(N!) / N``; probes the trained solution
(superposition R^2, relation gating); transfers the trained MLP zero-shot to new
bijections beside a random-table baseline; and compares multi-hop recall with and
without chain-of-thought: for the construction against the bound per hop count,
and for trained transformers whose CoT runs inside the model (it emits the hop-1
answer and reads its own emission back). ``regime_checks`` states what the run
must satisfy for the claims to be informative (docs/geomem.md).

  python -m experiments.geomem --config=configs/geomem.py:default --workdir=/tmp/geomem
"""

from __future__ import annotations

import dataclasses
import time

from absl import logging
from tqdm import tqdm

from configs.geomem import get_config
from lab import launch
from lab.config import check
from lab.methods.geomem import capacity, data, sweeps
from lab.methods.geomem import report as geomem_report
from lab.methods.geomem.training import FitConfig
from lab.outputs import write_outputs


def _ints(low: int):
    return lambda v: len(v) > 0 and all(isinstance(x, int) and not isinstance(x, bool)
                                        and x >= low for x in v)


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    pos = (lambda v: v > 0, "> 0")
    return check(config, get_config, {
        "n_relations": (lambda v: v >= 2, "an int >= 2 (gating needs two relations)"),
        "target_accuracy": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
        "construction.ns": (_ints(2), "a non-empty list of ints >= 2"),
        "construction.m_grid": (_ints(1), "a non-empty list of positive ints"),
        "construction.seeds": (lambda v: v >= 1, "an int >= 1"),
        "train.ns": (_ints(2), "a non-empty list of ints >= 2"),
        "train.d_grid": (_ints(1), "a non-empty list of positive ints"),
        "train.hidden_mult": (lambda v: v >= 1, "an int >= 1"),
        "train.steps": pos, "train.segment": pos, "train.learning_rate": pos,
        "train.batch_size": pos, "probe.transfer_steps": pos,
        "probe.n": (lambda v: v >= 2, "an int >= 2"),
        "probe.d": (lambda v: v >= 1, "a positive int"),
        "probe.steps": pos, "probe.weight_decay": (lambda v: v >= 0, ">= 0"),
        "multihop.n": (lambda v: v >= 2, "an int >= 2"),
        "multihop.max_hops": (lambda v: v >= 1, "an int >= 1"),
        "multihop.m_grid": (_ints(1), "a non-empty list of positive ints"),
        "multihop.train_n": (lambda v: v >= 2, "an int >= 2"),
        "multihop.d_grid": (_ints(1), "a non-empty list of positive ints"),
        "multihop.steps": pos,
        "multihop.train_relations": (lambda v: v >= 2, "an int >= 2"),
        "claims.min_n_values": (lambda v: v >= 3, "an int >= 3 (a slope interval needs 3)"),
        "claims.slope_level": (lambda v: 0 < v < 1, "a confidence level in (0, 1)"),
        "claims.bound_ratio_spread": (lambda v: v >= 1, "a ratio >= 1"),
        "claims.cot_growth": (lambda v: v >= 1, "a ratio >= 1"),
        "claims.chance_factor": (lambda v: v >= 1, "a factor >= 1"),
        "claims.reads_emission": (lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
    })


def _fit(rows, cfg) -> dict:
    """The log-N rule's fit of one arm's smallest dimensions (:func:`capacity.log_rule`)."""
    th = cfg.claims
    return capacity.log_rule([r["n"] for r in rows], [r["d"] for r in rows],
                             min_points=th.min_n_values, min_r2=th.log_fit_r2,
                             level=th.slope_level)


def _bound_ratios(rows, n_relations: int) -> list[float | None]:
    """Measured width over the counting bound's width at 1 bit/coordinate, per row."""
    return [None if r["d"] is None else r["d"] / capacity.bound_dim(r["n"], n_relations, 1.0)
            for r in rows]


def _spread(values) -> float:
    """max / min of positive values (inf when one is missing or not positive)."""
    if not values or any(v is None or not v > 0 for v in values):
        return float("inf")
    return max(values) / min(values)


def _smallest(rows, key: str, target: float):
    """Smallest ``d`` of ``rows`` whose ``key`` accuracy reaches ``target`` (None: none)."""
    hits = [r["d"] for r in rows if r[key] >= target]
    return min(hits) if hits else None


def regime_checks(res, cfg) -> list[dict]:
    """The regime the claims need (``results["regime"]``):

    1-2. every dimension search brackets its transition: for every N (construction and
       training) the search found a passing ``d`` and it is above the grid's smallest
       point (so a smaller point was evaluated and missed the target);
    3. the same for the multi-hop construction at every hop count, with and without CoT;
    4. the trained one-pass (no-CoT) multi-hop arm is not at ceiling at the grid's smallest
       ``d`` (accuracy < target) and 5. some arm reaches the target at its largest ``d``
       (the task is learnable within the grid); 6. the CoT model reads its emission: with
       it replaced by a random entity ``e`` it answers ``pi_(r_L)(e)`` on at least
       ``reads_emission`` of the queries (else "CoT" would answer from the query alone);
    7. the trained network with a random subject table scores near chance on the new
       bijections (<= ``chance_factor / N``), and a random table has superposition
       R^2 <= ``random_r2``;
    8. the no-memory shortcuts (relation only, copy the subject) stay near chance
       (<= ``chance_factor / N``) on the one-hop and multi-hop facts;
    9. the probed model memorised its facts (accuracy >= target).
    """
    from lab.outputs import regime

    th, target = cfg.claims, cfg.target_accuracy
    out = []
    for key, grid, who in (("construction", cfg.construction.m_grid, "construction"),
                           ("train", cfg.train.d_grid, "GD training")):
        lo = min(grid)
        dims = {r["n"]: r["m"] if key == "construction" else r["d"] for r in res[key]}
        ok = all(v is not None and v > lo for v in dims.values())
        what = "subject dimension m" if key == "construction" else "width d"
        out.append(regime(f"{who}: for every N the grid brackets the {target:g} transition (a "
                          f"passing {what} exists and is above the grid's smallest, {lo})",
                          dims, ok))
    depth = res["multihop"]["construction"]
    lo = min(cfg.multihop.m_grid)
    ms = {f"{r['hops']} hops": {"no_cot": r["m_no_cot"], "cot": r["m_cot"]} for r in depth}
    ok = all(v is not None and v > lo for r in ms.values() for v in r.values())
    out.append(regime(f"multi-hop construction: at every hop count, with and without CoT, the "
                      f"subject-dimension grid brackets the transition (above {lo})", ms, ok))
    tr = sorted(res["multihop"]["train"], key=lambda r: r["d"])
    first, last = tr[0], tr[-1]
    out.append(regime(f"trained multi-hop: one pass (no CoT) is not at ceiling at the grid's "
                      f"smallest d={first['d']} (accuracy < {target:g})", first["no_cot"],
                      first["no_cot"] < target))
    best = max(last["no_cot"], last["cot"])
    out.append(regime(f"trained multi-hop: the task is learnable in the grid (the better arm "
                      f"reaches {target:g} at the largest d={last['d']})",
                      {"no_cot": last["no_cot"], "cot": last["cot"]}, best >= target))
    follows = last["cot_follows_corruption"]
    out.append(regime(f"the trained CoT model reads its own emission: with the hop-1 answer it "
                      f"reads replaced by a random entity e, it answers pi_(r_2)(e) on >= "
                      f"{th.reads_emission:g} of the queries at the largest d={last['d']}",
                      follows, follows >= th.reads_emission))
    p = res["probe"]
    chance = th.chance_factor / p["n"]
    rnd = {"accuracy": p["random_table_accuracy"],
           "superposition_r2": p["superposition_random"]["r2_heldout"]}
    out.append(regime(f"random-table baseline near chance: the trained network with a random "
                      f"subject table scores <= {th.chance_factor:g}/N = {chance:.3g} on the new "
                      f"bijections, and a random table's superposition R^2 <= {th.random_r2:g}",
                      rnd, rnd["accuracy"] <= chance and rnd["superposition_r2"] <= th.random_r2))
    sc = res["shortcuts"]
    best = {name: max(b["relation_only"], b["copy_subject"]) for name, b in sc.items()}
    sets = ", ".join(f"{k}: N={b['n']}" for k, b in sc.items())
    out.append(regime(f"no-memory shortcuts (relation only, copy the subject) stay near chance: "
                      f"the better one scores <= {th.chance_factor:g}/N on every fact set "
                      f"({sets})", best,
                      all(best[k] <= th.chance_factor / b["n"] for k, b in sc.items())))
    acc = p["accuracy_before_transfer"]
    out.append(regime(f"the probed model memorised its facts (accuracy >= {target:g})", acc,
                      acc >= target))
    return out


def _claims(res, cfg) -> list[dict]:
    from lab.outputs import claim

    th, target = cfg.claims, cfg.target_accuracy
    out = []
    for key, who in (("construction", "the closed-form construction"),
                     ("train", "gradient-descent training")):
        rule = _fit(res[key], cfg)
        out.append(claim(
            f"A logarithmic embedding dimension suffices to memorise R random bijections "
            f"({who}): d grows like log N, far slower than N.",
            f"every N reaches {target:g}; >= {th.min_n_values} N values; slope c of "
            f"d = a + c ln N > 0 with its {th.slope_level:g} t-interval excluding 0; R^2 >= "
            f"{th.log_fit_r2} and >= R^2 of d = a + c N",
            {"n_values": rule["n_values"], "c": rule["c"], "c_low": rule["c_low"],
             "c_high": rule["c_high"], "fit_r2_log": rule["r2"],
             "fit_r2_linear_in_n": rule["r2_linear"]},
            rule["holds"]))
    p = res["probe"]
    out.append(claim(
        "Trained subject embeddings are linear superpositions of their attribute vectors.",
        f"held-out R^2 of e_s ~ sum_r W_r u_(pi_r(s)), N={p['n']}, d={p['d']} "
        f"(>= {th.superposition_r2})",
        {"trained": p["superposition"]["r2_heldout"],
         "random_table": p["superposition_random"]["r2_heldout"]},
        p["superposition"]["r2_heldout"] >= th.superposition_r2))
    g, g0 = p["gating"]["selectivity"], p["gating_init"]["selectivity"]
    out.append(claim(
        "The MLP acts as a relation-conditioned selector (ReLU gating by relation).",
        f"mass-weighted relation selectivity of MLP units (>= {th.gating_selectivity} "
        "and above initialisation)",
        {"trained": g, "init": g0, "construction": p["gating_construction"]["selectivity"]},
        g >= th.gating_selectivity and g > g0))
    out.append(claim(
        "The trained MLP transfers zero-shot to new bijections once subject embeddings "
        "are re-initialised (by the superposition rule).",
        f"accuracy on new bijections, no training (>= {th.zero_shot_accuracy}; a random "
        "subject table is the baseline)",
        {"superposition_rule": p["zero_shot_accuracy"],
         "random_table": p["random_table_accuracy"]},
        p["zero_shot_accuracy"] >= th.zero_shot_accuracy))
    gain = p["refit_subjects_trained_network"] - p["refit_subjects_random_network"]
    out.append(claim(
        "The trained MLP is a generic selector: new bijections are learnt by fitting only "
        "fresh subject embeddings through the frozen trained network.",
        f"accuracy after {cfg.probe.transfer_steps} subject-only steps, frozen trained net minus "
        f"frozen random net (>= {th.refit_margin})",
        {"trained_net": p["refit_subjects_trained_network"],
         "random_net": p["refit_subjects_random_network"]}, gain >= th.refit_margin))
    ratios = _bound_ratios(res["construction"], cfg.n_relations)
    spread = _spread(ratios)
    out.append(claim(
        "The construction's width matches the information-theoretic (counting) bound up to a "
        "constant: measured d / bound d stays in a narrow band across N.",
        f"d at {target:g} over the bound's d = R log2(N!) / N (1 bit per coordinate), per N; "
        f"max ratio / min ratio <= {th.bound_ratio_spread:g}",
        {"ratio_per_n": {str(r["n"]): q for r, q in zip(res["construction"], ratios,
                                                         strict=True)},
         "spread": spread}, spread <= th.bound_ratio_spread))
    depth = res["multihop"]["construction"]
    no_cot = [r["ratio_no_cot"] for r in depth]
    cot_growth = (depth[-1]["d_cot"] / depth[0]["d_cot"]
                  if depth[-1]["d_cot"] and depth[0]["d_cot"] else float("inf"))
    ok = len(depth) > 1 and _spread(no_cot) <= th.bound_ratio_spread and \
        cot_growth <= th.cot_growth
    out.append(claim(
        "Capacity-depth trade-off (construction): without chain-of-thought the dimension needed "
        "grows with hops as the bound for R^L chains does; with chain-of-thought it does not.",
        f"N={res['multihop']['n']}, hops 1..{depth[-1]['hops']}: no-CoT d / bound d (R^L "
        f"chain tables, 1 bit per coordinate) within max/min <= {th.bound_ratio_spread:g} "
        f"across hops, and CoT d at {depth[-1]['hops']} hops / at 1 hop <= {th.cot_growth:g}",
        {"ratio_no_cot": {str(r["hops"]): r["ratio_no_cot"] for r in depth},
         "spread_no_cot": _spread(no_cot),
         "d_no_cot": {str(r["hops"]): r["d_no_cot"] for r in depth},
         "d_cot": {str(r["hops"]): r["d_cot"] for r in depth}, "cot_growth": cot_growth}, ok))
    rows = res["multihop"]["train"]
    d_cot, d_no = _smallest(rows, "cot", target), _smallest(rows, "no_cot", target)
    out.append(claim(
        "With chain-of-thought inside the model (it emits the hop-1 answer and reads it back), "
        "a trained transformer reaches two-hop recall at a smaller width than one pass does.",
        f"N={res['multihop']['train_n']}, R={res['multihop'].get('train_relations')}: "
        f"smallest trained d on the grid {[r['d'] for r in rows]} at {target:g} two-hop "
        "accuracy (CoT on its own emissions) < that of one pass (none on the grid counts as "
        "beyond it)",
        {"d_cot": d_cot, "d_no_cot": d_no},
        d_cot is not None and (d_no is None or d_cot < d_no)))
    gain = sum(r["cot"] - r["no_cot"] for r in rows) / len(rows)
    out.append(claim(
        "Chain-of-thought inside the model helps multi-hop recall at a fixed embedding "
        "dimension (training).",
        "mean over the d grid of two-hop accuracy with CoT (own emissions) minus without (> 0)",
        gain, gain > 0))
    return out


def run(config, workdir: str) -> dict:
    """Runs the experiment into ``workdir``; returns the results written to results.json."""
    check_config(config)
    cfg = config
    r, target, seed = cfg.n_relations, cfg.target_accuracy, cfg.seed
    fit_cfg = FitConfig(steps=cfg.train.steps, learning_rate=cfg.train.learning_rate,
                        batch_size=cfg.train.batch_size, segment=cfg.train.segment,
                        target=target, seed=seed)
    res, seconds = {}, {}
    bar = tqdm(total=4, desc="geomem", unit="stage")

    def note(msg):
        logging.info(msg)
        bar.set_postfix_str(msg[:60])

    t0 = time.time()
    res["construction"] = sweeps.construction_dims(cfg.construction.ns, r, cfg.construction.m_grid,
                                                   target=target, seed=seed,
                                                   seeds=cfg.construction.seeds)
    res["construction_fit"] = _fit(res["construction"], cfg)
    seconds["construction"] = time.time() - t0
    bar.update()

    t0 = time.time()
    res["train"], models = sweeps.train_dims(cfg.train.ns, r, cfg.train.d_grid, fit_cfg,
                                             hidden_mult=cfg.train.hidden_mult, seed=seed,
                                             progress=note)
    res["train_fit"] = _fit(res["train"], cfg)
    seconds["train"] = time.time() - t0
    bar.update()

    t0 = time.time()
    per_n = {}
    for n, (model, perms) in models.items():
        per_n[n] = sweeps.probe_and_transfer(model, perms, fit_cfg, transfer_steps=1,
                                             hidden_mult=cfg.train.hidden_mult, seed=seed,
                                             refit=False)
    res["probe_per_n"] = {str(n): v for n, v in per_n.items()}
    probe_cfg = FitConfig(steps=cfg.probe.steps, segment=cfg.train.segment,
                          learning_rate=cfg.train.learning_rate, batch_size=cfg.train.batch_size,
                          target=None, seed=seed, weight_decay=cfg.probe.weight_decay)
    # Padded to the search's width, so that it reuses the search's compiled step.
    model, perms, stats = sweeps.train_probe_model(cfg.probe.n, r, cfg.probe.d, probe_cfg,
                                                   hidden_mult=cfg.train.hidden_mult, seed=seed,
                                                   width=max(cfg.train.d_grid))
    note(f"probe model N={cfg.probe.n} d={cfg.probe.d}: accuracy {stats['accuracy']:.4f}")
    res["probe"] = dict(sweeps.probe_and_transfer(
        model, perms, fit_cfg, transfer_steps=cfg.probe.transfer_steps,
        hidden_mult=cfg.train.hidden_mult, seed=seed), n=cfg.probe.n, train_stats=stats)
    seconds["probe_transfer"] = time.time() - t0
    bar.update()

    t0 = time.time()
    mh = cfg.multihop
    depth = []
    for hops in range(1, mh.max_hops + 1):
        no_cot = sweeps.construction_dims([mh.n], r, mh.m_grid, hops=hops, target=target,
                                          seed=seed, seeds=cfg.construction.seeds)[0]
        cot = sweeps.construction_dims([mh.n], r, mh.m_grid, hops=hops, cot=True,
                                       target=target, seed=seed,
                                       seeds=cfg.construction.seeds)[0]
        # Counting bound at 1 bit/coordinate: one pass stores R^L chain tables, CoT R.
        b_no, b_cot = capacity.bound_dim(mh.n, r ** hops, 1.0), capacity.bound_dim(mh.n, r, 1.0)
        depth.append({"hops": hops, "m_no_cot": no_cot["m"], "m_cot": cot["m"],
                      "d_no_cot": no_cot["d"], "d_cot": cot["d"],
                      "bound_no_cot": b_no, "bound_cot": b_cot,
                      "ratio_no_cot": None if no_cot["d"] is None else no_cot["d"] / b_no,
                      "ratio_cot": None if cot["d"] is None else cot["d"] / b_cot,
                      "bits_per_coord_no_cot": capacity.bits_per_coordinate(
                          mh.n, r ** hops, no_cot["d"]),
                      "bits_per_coord_cot": capacity.bits_per_coordinate(mh.n, r, cot["d"])})
    res["multihop"] = {"n": mh.n, "construction": depth, "train_n": mh.train_n,
                       "train_relations": mh.train_relations,
                       "train": sweeps.multihop(mh.train_n, mh.train_relations, mh.d_grid,
                                                dataclasses.replace(fit_cfg, steps=mh.steps),
                                                hops=2,
                                                hidden_mult=cfg.train.hidden_mult, seed=seed,
                                                progress=note, width=max(cfg.train.d_grid))}
    seconds["multihop"] = time.time() - t0
    bar.update()
    bar.close()

    res["table"] = geomem_report.main_table(res, r)
    res["seconds"] = seconds
    res["shortcuts"] = {
        f"{name}_{hops}hop": dict(data.shortcut_baselines(data.bijections(s, n, r), hops), n=n)
        for name, n, hops, s in (("train", max(cfg.train.ns), 1, seed),
                                 ("probe", cfg.probe.n, 1, seed))}
    res["shortcuts"]["multihop_2hop"] = dict(data.shortcut_baselines(  # sweeps.multihop's facts
        data.bijections(seed + 7, mh.train_n, mh.train_relations), 2), n=mh.train_n)
    res["claims"] = _claims(res, cfg)
    res["regime"] = regime_checks(res, cfg)
    plots = geomem_report.plots(res, r, workdir)
    return write_outputs(workdir, name="geomem", config=cfg, results=res,
                         report=geomem_report.markdown(res, cfg), plots=plots)


if __name__ == "__main__":
    launch.main(run)
