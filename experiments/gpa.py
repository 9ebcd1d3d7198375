"""GPA launcher: every sampler at equal oracle budgets; particle scaling; objective variants."""

from __future__ import annotations

import os
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from absl import logging  # noqa: E402

from configs.gpa import get_config  # noqa: E402
from lab import launch, outputs  # noqa: E402
from lab.config import check  # noqa: E402
from lab.methods.gpa import baselines, design, smc  # noqa: E402
from lab.methods.gpa.sampler import GPAConfig, gpa  # noqa: E402

COLUMNS = ["sampler", "objective_mean", "objective_top10", "true_activity_a", "audit_activity_a",
           "motif_fidelity", "prior_loglik_per_base", "diversity", "kmer_js", "max_homopolymer",
           "oracle_calls", "seconds"]


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, {
        "seq_len": (lambda v: v >= 16, "at least 16 bases"),
        "n_train": (lambda v: v >= 64, "at least 64 sequences"),
        "objective": (lambda v: v in design.OBJECTIVES, f"one of {design.OBJECTIVES}"),
        "gpa.num_particles": (lambda v: v >= 2, "at least 2 particles"),
        "gpa.scheme": (lambda v: v in smc.SCHEMES, f"one of {smc.SCHEMES}"),
        "gpa.suffix_max": (lambda v: v >= 1, "at least 1"),
        "gpa.n_mask": (lambda v: v >= 1, "at least 1"),
    })


def _gpa_config(c, num_particles=None) -> GPAConfig:
    g = c.gpa
    return GPAConfig(num_particles=num_particles or g.num_particles, tau=g.tau,
                     target_ess=g.target_ess, resample_threshold=g.resample_threshold,
                     scheme=g.scheme, mutation_steps=g.mutation_steps,
                     final_steps=g.final_steps, mh=g.mh, max_rounds=g.max_rounds)


def compare(c, assets, kind: str, key) -> list[dict]:
    """Every sampler on one objective; GPA's oracle calls set everyone's budget."""
    reward = design.objective(assets, kind, fidelity_weight=c.fidelity_weight)
    n = c.gpa.num_particles
    ar_init, ar_prop = design.ar_moves(assets, c.gpa.suffix_max)
    df_init, df_prop = design.diffusion_moves(assets, c.gpa.n_mask, c.gpa.diffusion_steps)
    keys = jax.random.split(key, 8)
    rows = []

    def add(name, pop):
        rows.append({"sampler": name, **design.metrics(assets, pop, reward)})
        logging.info("gpa %s %s: %s", kind, name, rows[-1])

    pop = gpa(keys[0], ar_init, ar_prop, reward, _gpa_config(c))
    budget = pop.oracle_calls
    add("GPA (AR, MH)", pop)
    add("GPA (diffusion, MH)", gpa(keys[1], df_init, df_prop, reward, _gpa_config(c)))
    add("prior (AR, no search)", baselines.best_of_n(keys[2], ar_init, reward, n, n))
    add("best-of-N (AR)", baselines.best_of_n(keys[3], ar_init, reward, budget, n))
    add("reward-weighted resampling", baselines.reward_weighted(keys[4], ar_init, reward,
                                                                budget, n, c.gpa.tau))
    add("simulated annealing", baselines.simulated_annealing(
        keys[5], ar_init, reward, design.prior_loglik(assets), budget, n, c.gpa.tau))
    add("gradient editing", baselines.gradient_editing(
        keys[6], ar_init, design.onehot_objective(assets, kind), assets.ar, reward, budget, n,
        c.gpa.tau, c.edit_learning_rate))
    add("RL fine-tuned AR", baselines.rl_finetune(
        keys[7], assets.ar, reward, budget, n, c.seq_len,
        baselines.RLConfig(group=c.rl_group, learning_rate=c.rl_learning_rate,
                           kl_coef=c.rl_kl_coef)))
    return rows


def claim_rules(main: list[dict], scaling: list[dict], specificity: list[dict] | None = None
                ) -> list[dict]:
    """The paper's claims decided on the measured rows: ``main`` and ``specificity`` are
    per-sampler rows (``sampler``, ``true_activity_a``, ``objective_mean``, ``kmer_js``,
    ``audit_activity_a``, ``true_specificity``), ``scaling`` the particle-scaling rows."""
    by = {r["sampler"]: r for r in main}
    g, prior, bon = by["GPA (AR, MH)"], by["prior (AR, no search)"], by["best-of-N (AR)"]
    edit, sa = by["gradient editing"], by["simulated annealing"]
    claims = [
        outputs.claim("Annealed SMC from the generator raises oracle activity far above the prior.",
                      "true activity (hidden function), GPA vs prior samples",
                      {"gpa": g["true_activity_a"], "prior": prior["true_activity_a"]},
                      g["true_activity_a"] > prior["true_activity_a"] + 0.5),
        outputs.claim("At equal oracle calls GPA beats best-of-N sampling from the prior.",
                      "mean oracle objective of the final population",
                      {"gpa": g["objective_mean"], "best_of_n": bon["objective_mean"]},
                      g["objective_mean"] > bon["objective_mean"]),
        outputs.claim("GPA's designs stay natural: k-mer spectrum closer to the training data "
                      "than gradient editing and simulated annealing.",
                      "JS divergence of 3-mer spectra (lower is better)",
                      {"gpa": g["kmer_js"], "gradient_editing": edit["kmer_js"],
                       "simulated_annealing": sa["kmer_js"]},
                      g["kmer_js"] < min(edit["kmer_js"], sa["kmer_js"])),
        outputs.claim("GPA's gains are real, not oracle exploitation: a held-out oracle agrees.",
                      "audit-oracle activity, GPA vs prior",
                      {"gpa": g["audit_activity_a"], "prior": prior["audit_activity_a"]},
                      g["audit_activity_a"] > prior["audit_activity_a"] + 0.5),
        outputs.claim("GPA scales to thousands of particles.",
                      "largest particle count run, and its seconds",
                      {"particles": scaling[-1]["particles"], "seconds": scaling[-1]["seconds"]},
                      scaling[-1]["particles"] >= 4096),
    ]
    if specificity is not None:
        sv = {r["sampler"]: r for r in specificity}
        claims.append(outputs.claim(
            "The specificity objective yields cell-type-specific designs.",
            "true specificity (A - B) under the specificity objective vs the activity objective",
            {"specificity_objective": sv["GPA (AR, MH)"]["true_specificity"],
             "activity_objective": g["true_specificity"]},
            sv["GPA (AR, MH)"]["true_specificity"] > g["true_specificity"]))

    return claims


def _time_note(assets) -> str:
    if assets.source == "trained":
        return "The generators and oracles were trained in this run.\n\n"
    where = "shipped with Lab" if assets.source == "shipped" else "cached on this host"
    return (f"The generators and oracles are {where} (`lab.zoo.bundle`); their training "
            "times below were recorded when they were trained.\n\n")


def run(config, workdir: str) -> dict:
    c = check_config(config)
    os.makedirs(workdir, exist_ok=True)
    start = time.perf_counter()
    assets = design.build_assets(seed=c.seed, seq_len=c.seq_len, n_train=c.n_train,
                                 generator_steps=c.generator_steps, oracle_steps=c.oracle_steps,
                                 d_model=c.d_model, n_layers=c.n_layers)
    assets_s = time.perf_counter() - start
    key = jax.random.key(c.seed)
    main = compare(c, assets, c.objective, jax.random.fold_in(key, 1))
    variants = {kind: compare(c, assets, kind, jax.random.fold_in(key, 2 + i))
                for i, kind in enumerate(c.variant_objectives)}

    reward = design.objective(assets, c.objective)
    ar_init, ar_prop = design.ar_moves(assets, c.gpa.suffix_max)
    scaling = []
    for n in c.scaling_particles:
        pop = gpa(jax.random.fold_in(key, 100 + n), ar_init, ar_prop, reward, _gpa_config(c, n))
        m = design.metrics(assets, pop, reward)
        scaling.append({"particles": n, "objective_mean": m["objective_mean"],
                        "true_activity_a": m["true_activity_a"], "diversity": m["diversity"],
                        "seconds": pop.seconds,
                        "particle_steps_per_s": pop.oracle_calls / max(pop.seconds, 1e-9)})

    claims = claim_rules(main, scaling, variants.get("specificity"))
    g = next(r for r in main if r["sampler"] == "GPA (AR, MH)")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in main:
        axes[0].scatter(r["prior_loglik_per_base"], r["true_activity_a"], label=r["sampler"])
    axes[0].set_xlabel("prior log-likelihood per base")
    axes[0].set_ylabel("true activity (cell A)")
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"equal oracle budget ({g['oracle_calls']} calls)")
    axes[1].plot([s["particles"] for s in scaling], [s["true_activity_a"] for s in scaling], "o-")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("particles")
    axes[1].set_ylabel("true activity (cell A)")
    axes[1].set_title("GPA particle scaling")
    plots = [outputs.save_figure(fig, workdir, "gpa.png")]

    report = [f"Objective `{c.objective}`, sequences of {c.seq_len} bp, {c.gpa.num_particles} "
              f"particles; every sampler spends about {g['oracle_calls']} oracle calls.\n",
              "`true_activity_a` is the hidden activity function (ground truth), "
              "`audit_activity_a` a held-out oracle's prediction.\n\n",
              outputs.markdown_table(main, COLUMNS)]
    for kind, rows in variants.items():
        report += [f"\n### Objective `{kind}`\n\n",
                   outputs.markdown_table(rows, COLUMNS + ["true_specificity"])]
    report += ["\n### Particle scaling (GPA, AR)\n\n", outputs.markdown_table(scaling),
               "\n### Time\n\n", _time_note(assets), outputs.markdown_table(
                   [{"part": f"training: {k}", "seconds": v} for k, v in assets.seconds.items()]
                   + [{"part": "data and frozen models, this run", "seconds": assets_s},
                      {"part": "total, this run", "seconds": time.perf_counter() - start}])]
    results = {"samplers": main, "variants": variants, "scaling": scaling,
               "training_seconds": assets.seconds, "assets_source": assets.source,
               "assets_seconds": assets_s, "claims": claims,
               "seconds": time.perf_counter() - start}
    return outputs.write_outputs(workdir, name="gpa", config=c, results=results,
                                 report="".join(report), plots=plots)


if __name__ == "__main__":
    launch.main(run)
