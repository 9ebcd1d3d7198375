"""CARD experiment: student accuracy in-domain and on longer problems against the number
of distillation samples, for raw, filtered-correct and rewritten teacher trajectories,
over seeds (lab.methods.card).

Pipeline: teacher trajectories (the zoo's larger reasoning model sampled at
``teacher_temperature`` and a scripted verbose solver, never resampled); a rewriter
(copy-SFT start, a :mod:`lab.zoo.bundle` entry shipped, cached or trained now; then GRPO
with the coherence and the student-alignment rewards, KL to the copy model); the student
distilled by token-weighted SFT on each source. Beside it: the student before
distillation, the student distilled on the problems' correct chains (``gold``, an ideal
rewriter's output) and the shortcut answers (majority, first operand, last operand).

  python -m experiments.card --config=configs/card.py:default --workdir=/tmp/card
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from flax import nnx

from configs.card import get_config
from lab import launch, outputs, zoo
from lab.config import check
from lab.methods import card
from lab.nn import Transformer

SOURCES = ("raw", "filtered", "rewritten")
GOLD = "gold"              # reference source: the problems' correct chains (an ideal rewriter)
SETS = ("in_domain", "longer")

# Rules of the claims and the regime (fixed before the default run).
SE_MULT = 2.0              # the rewriter's reward gains count beyond this many paired SEs
ROOM = (0.05, 0.9)         # regime: the student before distillation on every set
INCOHERENT_MIN = 0.05      # regime: raw trajectories' share of wrong/misleading steps
TEACHER_RANGE = (0.3, 0.97)  # regime: teacher accuracy on the pool (something to filter)
TEACHER_MARGIN = 0.1       # regime: ... and this much above the student's in-domain accuracy
GOLD_DROP_MAX = 0.1        # regime: distilled on gold chains, the student loses at most this
RL_MOVED_MIN = 0.1         # regime: RL changes at least this share of the pool's rewrites
COPY_MIN = 0.5             # regime: the copy-SFT start reproduces the trajectory it reads
SHORTCUT_MAX = 0.06        # regime: every shortcut's accuracy on every set


def _checks():
    pos = (lambda v: v >= 1, "an int >= 1")
    prob = (lambda v: 0 <= v <= 1, "a probability in [0, 1]")
    return {"teacher_temperature": (lambda v: v > 0, "> 0"), "verbose.p_fail": prob,
            "verbose.p_detour": prob, "verbose.p_uncorrected": prob, "pool": pos,
            "n_eval": pos, "n_rewriter_eval": pos, "max_new": pos,
            "student_new": pos, "copy.steps": pos, "copy.batch": pos, "rl.steps": pos,
            "rl.prompts_per_step": pos, "rl.group_size": (lambda v: v >= 2, "an int >= 2"),
            "distill.steps": pos, "distill.batch": pos}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _clone(model):
    out = Transformer(model.config, rngs=nnx.Rngs(0))
    nnx.update(out, nnx.state(model))
    return out


def _seed_spread(a, b):
    return {"mean": float(np.mean(a)) - float(np.mean(b)),
            "disjoint": bool(min(a) > max(b))}


def claim_rules(m: dict) -> list[dict]:
    """Claims on ``m``: ``students[source][size][set]`` (a list over seeds) and
    ``rewriter`` (``init``/``rl`` coherence and alignment, ``se`` of the paired gains)."""
    top = str(max(int(k) for k in m["students"]["raw"]))
    out = []
    for s in SETS:
        rw, raw = m["students"]["rewritten"][top][s], m["students"]["raw"][top][s]
        filt = m["students"]["filtered"][top][s]
        d = _seed_spread(rw, raw)
        out.append(outputs.claim(
            f"Rewritten trajectories beat raw ones ({s}, {top} samples; every seed of "
            "rewritten above every seed of raw)", f"{s} accuracy rewritten - raw",
            d["mean"], d["mean"] > 0 and d["disjoint"]))
        f = float(np.mean(rw)) - float(np.mean(filt))
        out.append(outputs.claim(
            f"Rewritten trajectories are no worse than filtered-correct ones ({s}, {top} "
            "samples; mean over seeds)", f"{s} accuracy rewritten - filtered", f, f >= 0))
    r = m["rewriter"]
    for key in ("coherence", "alignment"):
        gain = r["rl"][key] - r["init"][key]
        out.append(outputs.claim(
            f"Rewriter RL raises the {key} reward over the copy start (> {SE_MULT:g} paired "
            "SE, held-out trajectories)", f"{key} RL - copy", gain,
            gain > SE_MULT * r["se"][key]))
    return out


def regime_rules(m: dict) -> list[dict]:
    """Regime checks on ``m``: ``base`` (set -> accuracy), ``students["gold"]`` (one size),
    ``incoherent_raw``, ``teacher_accuracy``, ``copy_rate``, ``rl_changed``, ``shortcuts``
    (name -> set -> accuracy)."""
    lo, hi = ROOM
    base = m["base"]
    worst = max(v for sc in m["shortcuts"].values() for v in sc.values())
    gold_top = str(max(int(k) for k in m["students"][GOLD]))   # gold runs at one size
    gold = float(np.mean(m["students"][GOLD][gold_top]["in_domain"]))
    return [
        outputs.regime(f"the student before distillation is within [{lo}, {hi}] on every "
                       "set", base, all(lo <= base[s] <= hi for s in SETS)),
        outputs.regime(f"raw trajectories have >= {INCOHERENT_MIN} wrong or misleading "
                       "steps", m["incoherent_raw"], m["incoherent_raw"] >= INCOHERENT_MIN),
        outputs.regime(f"teacher accuracy on the pool within {list(TEACHER_RANGE)}",
                       m["teacher_accuracy"],
                       TEACHER_RANGE[0] <= m["teacher_accuracy"] <= TEACHER_RANGE[1]),
        outputs.regime(f"the teacher has something to teach: its accuracy on the pool is >= "
                       f"{TEACHER_MARGIN} above the student's in-domain accuracy",
                       {"teacher": m["teacher_accuracy"], "student": base["in_domain"]},
                       m["teacher_accuracy"] - base["in_domain"] >= TEACHER_MARGIN),
        outputs.regime(f"the distillation recipe does not by itself damage the student: "
                       f"distilled on gold chains it loses <= {GOLD_DROP_MAX} in-domain",
                       {"gold": gold, "student": base["in_domain"]},
                       gold >= base["in_domain"] - GOLD_DROP_MAX),
        outputs.regime(f"the copy-SFT start reproduces >= {COPY_MIN} of trajectories "
                       "(no rewriting)", m["copy_rate"], m["copy_rate"] >= COPY_MIN),
        outputs.regime(f"rewriter RL moved the policy: >= {RL_MOVED_MIN} of the pool's greedy "
                       "rewrites differ from the copy start's", m["rl_changed"],
                       m["rl_changed"] >= RL_MOVED_MIN),
        outputs.regime(f"every shortcut <= {SHORTCUT_MAX} on every set", worst,
                       worst <= SHORTCUT_MAX),
    ]


def copy_recipe(config) -> dict:
    """What determines the copy-SFT rewriter start: the rewriter and teacher zoo models, the
    pool's trajectories and the copy stage (the key of its :mod:`lab.zoo.bundle` entry)."""
    return {"rewriter": zoo.get_spec(config.rewriter).key,
            "teacher": zoo.get_spec(config.teacher).key, "seed": config.seed,
            "pool": config.pool, "in_domain": config.in_domain.to_dict(),
            "teacher_temperature": config.teacher_temperature,
            "verbose": config.verbose.to_dict(), "max_new": config.max_new,
            "rewriter_len": config.rewriter_len, "copy": config.copy.to_dict(), "format": 1}


def copy_start(config, base_rw, tok, pool, *, source=None):
    """The rewriter before RL: ``base_rw`` widened to ``rewriter_len`` and copy-SFT on the
    pool's trajectories; ``(model, bundle source, bundle key)``, shipped, cached or
    trained now (``source`` as :func:`lab.zoo.bundle.load`'s)."""
    from lab.zoo import bundle
    from lab.zoo.store import abstract_model

    cc = config.copy

    def train():
        rw = card.widened(base_rw, config.rewriter_len)
        rw, _ = card.copy_sft(rw, tok, pool, steps=cc.steps, batch_size=cc.batch,
                              learning_rate=cc.learning_rate, seq_len=config.rewriter_len,
                              seed=config.seed)
        return {"rewriter": rw}, {"copy_steps": cc.steps}

    cfg = dataclasses.replace(base_rw.config, max_len=config.rewriter_len)
    b = bundle.load("card-rewriter-copy", copy_recipe(config), train,
                    lambda: {"rewriter": abstract_model(cfg)}, source=source)
    return b.modules["rewriter"], b.source, b.key


def run(config, workdir: str) -> dict:
    """Builds the trajectories, trains the rewriter and the students; writes results.json,
    report.md and a plot; returns the results."""
    check_config(config)
    t0 = time.time()
    student, tok = zoo.load(config.student)
    teacher, _ = zoo.load(config.teacher)
    base_rw, _ = zoo.load(config.rewriter)
    seq = student.config.max_len
    sd = config.seed
    tw = dict(max_new_tokens=config.max_new, temperature=config.teacher_temperature,
              **config.verbose.to_dict())
    pool = card.teacher_rows(card.problems(config.pool, sd, **config.in_domain.to_dict()),
                             teacher, tok, seed=sd, **tw)
    held = card.teacher_rows(card.problems(config.n_rewriter_eval, sd + 1,
                                           **config.in_domain.to_dict()),
                             teacher, tok, seed=sd + 1, **tw)
    evals = {s: card.problems(config.n_eval, sd + 2 + i, **config[s].to_dict())
             for i, s in enumerate(SETS)}
    base = {s: card.accuracy(student, tok, evals[s], max_new_tokens=config.student_new)
            for s in SETS}
    shortcuts = {n: {s: card.shortcut_accuracy(card.shortcut_answers(n, pool), evals[s])
                     for s in SETS} for n in card.SHORTCUTS}
    timing = {"data_s": time.time() - t0}

    align = card.register_alignment(student, tok, seq)
    rw, copy_source, copy_key = copy_start(config, base_rw, tok, pool)
    timing["copy_start_s"] = time.time() - t0 - timing["data_s"]
    init_pool = card.rewrite(rw, tok, pool, max_new_tokens=config.max_new)
    init_texts = card.rewrite(rw, tok, held, max_new_tokens=config.max_new)
    copy_rate = float(np.mean([t == r["teacher"] for t, r in zip(init_texts, held,
                                                                 strict=True)]))
    init = card.reward_means(init_texts, held, student, tok, seq)
    width = max(len(tok.encode(card.rewriter.prompt(r["problem"], r["teacher"]),
                               add_bos=True)) for r in pool + held)
    rc = config.rl
    rw, hist = card.train_rl(rw, tok, pool, steps=rc.steps,
                             prompts_per_step=rc.prompts_per_step, group_size=rc.group_size,
                             max_new_tokens=config.max_new, max_prompt_len=width,
                             learning_rate=rc.learning_rate, kl_coef=rc.kl_coef,
                             weights=(rc.coherence_weight, rc.alignment_weight), seed=sd,
                             alignment=align)
    rl_texts = card.rewrite(rw, tok, held, max_new_tokens=config.max_new)
    after = card.reward_means(rl_texts, held, student, tok, seq)
    rewriter = {"init": {k: init[k] for k in ("coherence", "alignment")},
                "rl": {k: after[k] for k in ("coherence", "alignment")},
                "se": {k: outputs.paired_se(after[f"{k}_rows"], init[f"{k}_rows"])
                       for k in ("coherence", "alignment")},
                "history": [{k: h[k] for k in ("reward", "reward/card_coherence",
                                               f"reward/{align}", "kl") if k in h}
                            for h in hist]}
    rewrites = card.rewrite(rw, tok, pool, max_new_tokens=config.max_new)
    timing["rewriter_s"] = time.time() - t0 - timing["data_s"] - timing["copy_start_s"]

    correct = [r for r in pool if r["teacher_correct"]]
    sources = {"raw": [(r["problem"], r["teacher"]) for r in pool],
               "filtered": [(r["problem"], r["teacher"]) for r in correct],
               "rewritten": [(r["problem"], t) for r, t in zip(pool, rewrites, strict=True)],
               GOLD: [(r["problem"], r["reference"]) for r in pool]}
    students, used = {s: {} for s in sources}, {s: {} for s in sources}
    dc = config.distill
    top = max(config.sizes)
    for n in config.sizes:
        for src in SOURCES + ((GOLD,) if n == top else ()):
            pairs = [p for p in sources[src][:n] if len(tok.encode(p[0], add_bos=True))
                     + len(tok.encode(p[1])) + 1 <= seq + 1]
            used[src][str(n)] = len(pairs)
            accs = {s: [] for s in SETS}
            for seed in config.seeds:
                m, _ = card.train_sft(_clone(student), tok, pairs, steps=dc.steps,
                                      batch_size=dc.batch, learning_rate=dc.learning_rate,
                                      seq_len=seq, seed=int(seed))
                for s in SETS:
                    accs[s].append(card.accuracy(m, tok, evals[s],
                                                 max_new_tokens=config.student_new))
            students[src][str(n)] = accs
    timing["students_s"] = (time.time() - t0 - timing["data_s"] - timing["copy_start_s"]
                            - timing["rewriter_s"])
    measured = {
        "base": base, "shortcuts": shortcuts, "students": students, "samples_used": used,
        "rewriter": rewriter, "copy_rate": copy_rate,
        "copy_start": {"source": copy_source, "key": copy_key},
        "rl_changed": float(np.mean([a != b for a, b in zip(init_pool, rewrites,
                                                             strict=True)])),
        "teacher_accuracy": float(np.mean([r["teacher_correct"] for r in pool])),
        "teacher_accuracy_by_source": {
            s: float(np.mean([r["teacher_correct"] for r in pool if r["source"] == s]))
            for s in ("model", "verbose")},
        "incoherent_raw": card.incoherent_fraction([r["teacher"] for r in pool],
                                                   [r["problem"] for r in pool]),
        "incoherent_rewritten": card.incoherent_fraction(rewrites,
                                                         [r["problem"] for r in pool]),
        "rewritten_correct": float(np.mean([
            card.coherence_for_prompt(t, r["problem"]) > card.FLOOR
            for t, r in zip(rewrites, pool, strict=True)])),
        "n_eval": config.n_eval,
        "examples": [{"teacher": r["teacher"], "rewrite": t}
                     for r, t in list(zip(pool, rewrites, strict=True))[:4]],
    }
    timing["total_s"] = time.time() - t0
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing=timing)
    return outputs.write_outputs(workdir, name="card", config=config, results=results,
                                 report=_report(results), plots=[_plot(results, workdir)])


def main_table(r) -> list[dict]:
    """One row per source and sample count (the gold reference at the largest): accuracy
    per set, mean ± half-range over seeds; then the student before distillation and the
    shortcuts."""
    rows = []
    for src in (*SOURCES, GOLD):
        for n, accs in r["students"][src].items():
            rows.append({"source": src, "samples": int(n),
                         "used": r["samples_used"][src][n],
                         **{s: f"{np.mean(v):.3f} ± {np.ptp(v) / 2:.3f}"
                            for s, v in accs.items()}})
    rows.append({"source": "no distillation", "samples": 0, "used": 0,
                 **{s: f"{r['base'][s]:.3f}" for s in SETS}})
    for name, v in r["shortcuts"].items():
        rows.append({"source": f"shortcut: {name}", "samples": 0, "used": 0,
                     **{s: f"{v[s]:.3f}" for s in SETS}})
    return rows


def _report(r) -> str:
    rw = r["rewriter"]
    return "\n".join([
        f"Teacher accuracy on the pool {r['teacher_accuracy']:.3f} (by source "
        f"{outputs.format_value(r['teacher_accuracy_by_source'])}); wrong or misleading "
        f"steps: raw {r['incoherent_raw']:.3f}, rewritten {r['incoherent_rewritten']:.3f}; "
        f"rewrites with the right answer {r['rewritten_correct']:.3f}; rewrites RL changed "
        f"{r['rl_changed']:.3f}. Rewriter copy start: {r['copy_start']['source']} "
        f"(`{r['copy_start']['key']}`). Evaluation: "
        f"{r['n_eval']} problems per set.\n",
        "## Student accuracy (mean ± half-range over seeds)\n",
        "`gold`: distilled on the problems' correct chains (what an ideal rewriter would "
        "write), at the largest sample count only.\n",
        outputs.markdown_table(main_table(r)), "\n",
        "## Rewriter rewards on held-out trajectories\n",
        outputs.markdown_table([{"rewriter": k, **rw[k]} for k in ("init", "rl")]), "\n",
        "Timing: " + ", ".join(f"{n} {v:.1f}" for n, v in r["timing"].items()) + "\n"])


def _plot(r, workdir) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(SETS), figsize=(3.6 * len(SETS), 3.2), sharey=True)
    for ax, s in zip(axes, SETS, strict=True):
        for src in (*SOURCES, GOLD):
            ns = sorted(int(n) for n in r["students"][src])
            v = [r["students"][src][str(n)][s] for n in ns]
            ax.errorbar(ns, [np.mean(x) for x in v], yerr=[np.ptp(x) / 2 for x in v],
                        marker="o", label=src, capsize=3)
        ax.axhline(r["base"][s], color="gray", ls="--", lw=1, label="no distillation")
        ax.set(xscale="log", xlabel="distillation samples", title=s)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "card.png")


if __name__ == "__main__":
    launch.main(run)
