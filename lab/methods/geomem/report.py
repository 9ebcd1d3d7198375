"""Tables and plots of the geometric-memorization experiment (results dict -> markdown, PNG)."""

from __future__ import annotations

import math

import numpy as np

from lab.methods.geomem import capacity
from lab.outputs import markdown_table, save_figure


def _ratio(d, n: int, n_relations: int):
    return None if d is None else d / capacity.bound_dim(n, n_relations, 1.0)


def main_table(res: dict, n_relations: int) -> list[dict]:
    """One row per N: smallest width at 99% for construction and training, the
    counting bound at 1 bit/coordinate and each width over it, bits per coordinate
    used, and (where a model was trained) the superposition R^2, gating selectivity and zero-shot
    accuracy of the search's early-stopped model at ``d_train``."""
    cons = {r["n"]: r["d"] for r in res["construction"]}
    train = {r["n"]: r["d"] for r in res["train"]}
    probe = res.get("probe_per_n", {})
    rows = []
    for n in sorted(set(cons) | set(train)):
        p = probe.get(str(n), {})
        rows.append({
            "n": n,
            "d_construction": cons.get(n),
            "d_train": train.get(n),
            "d_bound_1bit": capacity.bound_dim(n, n_relations, 1.0),
            "construction_over_bound": _ratio(cons.get(n), n, n_relations),
            "train_over_bound": _ratio(train.get(n), n, n_relations),
            "bits_per_coord_construction": capacity.bits_per_coordinate(n, n_relations,
                                                                        cons.get(n)),
            "bits_per_coord_train": capacity.bits_per_coordinate(n, n_relations, train.get(n)),
            "superposition_r2_at_d_train": p.get("superposition", {}).get("r2_heldout"),
            "gating_at_d_train": p.get("gating", {}).get("selectivity"),
            "zero_shot_at_d_train": p.get("zero_shot_accuracy"),
        })
    return rows


def plots(res: dict, n_relations: int, workdir: str) -> list[str]:
    """Writes dims_vs_logn.png, accuracy_vs_dim.png, multihop.png; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, marker in (("construction", "construction", "o"),
                               ("train", "GD training", "s")):
        pts = [(math.log(r["n"]), r["d"]) for r in res[key] if r["d"] is not None]
        if pts:
            x, y = np.array(pts).T
            ax.plot(x, y, marker, label=f"{label} (99%)")
            fit = res[f"{key}_fit"]
            if np.isfinite(fit["c"]):
                xs = np.linspace(x.min(), x.max(), 20)
                ax.plot(xs, fit["a"] + fit["c"] * xs, "--",
                        label=f"fit {fit['a']:.1f} + {fit['c']:.2f} ln N (R^2 {fit['r2']:.3f})")
    ns = sorted({r["n"] for r in res["construction"]} | {r["n"] for r in res["train"]})
    xs = np.log(ns)
    for bits in (1.0, 4.0):
        ax.plot(xs, [capacity.bound_dim(n, n_relations, bits) for n in ns], ":",
                label=f"counting bound, {bits:g} bit/coord")
    ax.set_xlabel("ln N (entities)")
    ax.set_ylabel("embedding dimension d")
    ax.set_title(f"Smallest d memorising {n_relations} bijections")
    ax.legend(fontsize=7)
    names.append(save_figure(fig, workdir, "dims_vs_logn.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, extra, title in ((axes[0], "construction", n_relations, "construction"),
                                  (axes[1], "train", 0, "GD training")):
        for r in res[key]:
            acc = sorted((int(d) + extra, a) for d, a in r["accuracy_at"].items())
            if acc:
                x, y = np.array(acc).T
                ax.plot(x, y, "o-", label=f"N={r['n']}")
        ax.axhline(0.99, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("embedding dimension d (points visited by the search)")
        ax.set_ylabel("accuracy on all facts")
        ax.set_title(title)
        ax.legend(fontsize=7)
    names.append(save_figure(fig, workdir, "accuracy_vs_dim.png"))

    mh = res["multihop"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    depth = mh["construction"]
    hops = [r["hops"] for r in depth]
    axes[0].plot(hops, [r["d_no_cot"] for r in depth], "o-", label="no CoT (one pass)")
    axes[0].plot(hops, [r["d_cot"] for r in depth], "s-", label="CoT (hop by hop)")
    axes[0].set_xlabel("hops")
    axes[0].set_ylabel("d at 99% (construction)")
    axes[0].set_title(f"capacity-depth, N={mh['n']}")
    axes[0].legend(fontsize=7)
    axes[0].plot(hops, [r["bound_no_cot"] for r in depth], ":", label="bound, R^L tables")
    axes[0].plot(hops, [r["bound_cot"] for r in depth], ":", label="bound, R tables")
    tr = mh["train"]
    axes[1].plot([r["d"] for r in tr], [r["no_cot"] for r in tr], "o-", label="no CoT")
    axes[1].plot([r["d"] for r in tr], [r["cot"] for r in tr], "s-",
                 label="CoT (reads its own emission)")
    axes[1].set_xlabel("embedding dimension d")
    axes[1].set_ylabel("two-hop accuracy")
    axes[1].set_title(f"GD training, N={mh['train_n']}")
    axes[1].legend(fontsize=7)
    names.append(save_figure(fig, workdir, "multihop.png"))
    return names


def markdown(res: dict, cfg) -> str:
    """The report body: main table, fits, probes and transfer, multi-hop, timings."""
    p = res["probe"]
    out = [
        f"R = {cfg.n_relations} random bijections over N entities; accuracy target "
        f"{cfg.target_accuracy}. d = full model width (subject dims + relation dims for "
        "the construction). Bound: R log2(N!) bits must fit in N*d coordinates.\n",
        "## Smallest dimension at 99% recall\n",
        markdown_table(res["table"]),
        "\n## Fits d = a + c ln N (slope with its t-interval; R^2 of the fit linear in N)\n",
        markdown_table([dict(method=k, **res[f"{k}_fit"]) for k in ("construction", "train")]),
        "\n## No-memory shortcuts (accuracy; chance is 1/N)\n",
        markdown_table([dict(facts=k, **v) for k, v in res["shortcuts"].items()]),
        f"\n## Probes and transfer (model trained {cfg.probe.steps} steps with weight decay "
        f"{cfg.probe.weight_decay}, N={p['n']}, d={p['d']})\n",
        markdown_table([
            {"measure": "superposition R^2 held-out (trained)",
             "value": p["superposition"]["r2_heldout"]},
            {"measure": "superposition R^2 held-out (random table)",
             "value": p["superposition_random"]["r2_heldout"]},
            {"measure": "superposition R^2 held-out (construction)",
             "value": p["superposition_construction"]["r2_heldout"]},
            {"measure": "gating selectivity (trained)", "value": p["gating"]["selectivity"]},
            {"measure": "gating selectivity (init)", "value": p["gating_init"]["selectivity"]},
            {"measure": "gating selectivity (construction)",
             "value": p["gating_construction"]["selectivity"]},
            {"measure": "accuracy on the trained facts", "value": p["accuracy_before_transfer"]},
            {"measure": "zero-shot accuracy, new bijections", "value": p["zero_shot_accuracy"]},
            {"measure": "same network, random subject table (baseline)",
             "value": p["random_table_accuracy"]},
            {"measure": f"refit subjects only ({cfg.probe.transfer_steps} steps), trained net",
             "value": p.get("refit_subjects_trained_network")},
            {"measure": f"refit subjects only ({cfg.probe.transfer_steps} steps), random net",
             "value": p.get("refit_subjects_random_network")},
        ]),
        f"\n## Multi-hop: capacity-depth (construction, N={res['multihop']['n']})\n",
        markdown_table(res["multihop"]["construction"]),
        f"\n## Multi-hop: two-hop accuracy under training (N={res['multihop']['train_n']}, "
        f"R={res['multihop'].get('train_relations')}; "
        "CoT evaluated on its own emitted hop-1 answers)\n",
        markdown_table(res["multihop"]["train"]),
        "\n## Time (s)\n",
        markdown_table([res["seconds"]]),
    ]
    return "\n".join(out)
