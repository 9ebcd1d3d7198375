"""GeLVR / GePO experiment: latent visual reasoning on fine-grained perception at two
resolutions, and the ablation of each component (:mod:`lab.methods.gelvr.training`).

Variants, each fine-tuned from the same zoo VLM on the same rows, per seed:

* ``direct``: the answer after the image (no reasoning steps);
* ``text_cot``: a two-word chain of thought (the target's colour and kind) before it;
* ``latent``: ``num_slots`` latent slots, answer loss only (no geometry loss);
* ``gelvr``: the slots plus GeLVR's Gram alignment with the zoomed target's features;
* ``gepo``: RL from ``gelvr`` with the vMF policy and the geometry regulariser;
* ``gepo_no_reg``: the same RL without the regulariser;
* ``gaussian_rl``: the same RL with a Gaussian policy (regulariser kept, so that the row
  isolates the policy family).

Baselines beside them: the zoo model before fine-tuning, the question alone (the zoo model
fine-tuned as ``direct`` on the same rows with blank images, evaluated on blank images)
and the unbound shortcut (the option that is in the image at all,
from the rows' objects).
Accuracy is reported at the full and at the low resolution; the claims read their mean
(fixed before the default run), paired by seed.

  python -m experiments.gelvr --config=configs/gelvr.py:default --workdir=/tmp/gelvr
"""

from __future__ import annotations

import time

import numpy as np
from flax import nnx

from configs.gelvr import get_config
from lab import launch, outputs, zoo
from lab.config import SEEDS, check, require
from lab.data.synthetic.render import COLOUR_NAMES, KINDS
from lab.methods.gelvr import training as T

SFT_VARIANTS = ("direct", "text_cot", "latent", "gelvr")
RL_VARIANTS = ("gepo", "gepo_no_reg", "gaussian_rl")
VARIANTS = SFT_VARIANTS + RL_VARIANTS

# Rules of the claims and the regime (fixed before the default run).
DIFF_MIN = 0.02          # a claimed gain: at least this much mean accuracy, on every seed > 0
CHANCE_MARGIN = 0.1      # regime: direct fine-tuning is this far above chance
CEILING = 0.9            # regime: ... and at most this at full resolution (room to improve)
RESOLUTION_GAP = 0.05    # regime: full resolution beats low by this much (detail matters)
SHORTCUT_TOL = 0.08      # regime: question-only and unbound shortcuts within this of chance
REWARD_RANGE = (0.1, 0.9)  # regime: GePO's sampled reward is neither always 0 nor always 1


def _checks():
    return {
        "num_slots": (lambda v: v >= 2, "an int >= 2 (a Gram matrix needs two slots)"),
        "seeds": SEEDS,
        "task.low_factor": (lambda v: v >= 2, "an int >= 2"),
        "task.n_eval": (lambda v: v >= 1, "an int >= 1"),
        "sft.steps": (lambda v: v >= 1, "an int >= 1"),
        "rl.steps": (lambda v: v >= 1, "an int >= 1"),
        "rl.group": (lambda v: v >= 2, "an int >= 2"),
        "rl.kappa": (lambda v: v > 0, "> 0"),
        "sft.geometry_coef": (lambda v: v >= 0, ">= 0"),
        "sft.slot_coef": (lambda v: v >= 0, ">= 0"),
        "rl.geometry_coef": (lambda v: v >= 0, ">= 0"),
    }


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    check(config, get_config, _checks())
    t = config.task
    require(t.size % t.low_factor == 0, "task.low_factor", t.low_factor,
            f"a divisor of task.size={t.size}")
    return config


def _paired(acc: dict, a: str, b: str) -> tuple[float, list[float]]:
    """Mean over seeds of ``a - b`` (each the mean of the two resolutions) and the per-seed
    differences."""
    diffs = [float(np.mean([acc[a][s][r] - acc[b][s][r] for r in T.RESOLUTIONS]))
             for s in range(len(acc[a]))]
    return float(np.mean(diffs)), diffs


def claim_rules(m: dict) -> list[dict]:
    """The claims on the measured ``m`` (``m["accuracy"][variant]``: one ``{"high", "low"}``
    per seed). A gain holds when its mean over seeds is at least :data:`DIFF_MIN` and it is
    positive on every seed."""
    acc = m["accuracy"]
    out = []
    for statement, a, b in (
            ("Geometry-consistent SFT (GeLVR) beats latent slots trained without the geometry "
             "loss", "gelvr", "latent"),
            ("GeLVR's latent slots beat a text chain of thought", "gelvr", "text_cot"),
            ("GeLVR beats answering directly (no reasoning steps)", "gelvr", "direct"),
            ("GePO's RL improves on its SFT start", "gepo", "gelvr"),
            ("GePO's vMF policy beats a Gaussian policy (same regulariser)", "gepo",
             "gaussian_rl"),
            ("GePO's geometry regulariser helps: RL with it beats RL without", "gepo",
             "gepo_no_reg")):
        mean, diffs = _paired(acc, a, b)
        out.append(outputs.claim(
            f"{statement}: mean accuracy (both resolutions) higher by >= {DIFF_MIN}, on every "
            "seed", f"accuracy {a} - {b} (mean over seeds; per seed)",
            {"mean": mean, "per_seed": diffs}, mean >= DIFF_MIN and min(diffs) > 0))
    return out


def regime_rules(m: dict) -> list[dict]:
    """The regime checks on the measured ``m`` (``accuracy``; ``question_only``,
    ``shortcut``, ``chance``; ``gepo_reward``: GePO's mean sampled reward)."""
    direct = m["accuracy"]["direct"]
    hi = float(np.mean([s["high"] for s in direct]))
    lo = float(np.mean([s["low"] for s in direct]))
    chance = m["chance"]
    rlo, rhi = REWARD_RANGE
    return [
        outputs.regime(f"the task is learnable but not solved: direct fine-tuning's mean "
                       f"accuracy >= chance + {CHANCE_MARGIN} and <= {CEILING} at full "
                       "resolution", {"mean": (hi + lo) / 2, "high": hi},
                       (hi + lo) / 2 >= chance + CHANCE_MARGIN and hi <= CEILING),
        outputs.regime(f"detail matters: direct fine-tuning is >= {RESOLUTION_GAP} more "
                       "accurate at full than at low resolution", hi - lo,
                       hi - lo >= RESOLUTION_GAP),
        outputs.regime(f"no shortcut from the question: the model fine-tuned on the question "
                       f"alone (blank images) is within {SHORTCUT_TOL} of chance",
                       m["question_only"],
                       abs(m["question_only"] - chance) <= SHORTCUT_TOL),
        outputs.regime(f"no unbound visual shortcut: the option present in the image is "
                       f"within {SHORTCUT_TOL} of chance (lures)", m["shortcut"],
                       m["shortcut"] <= chance + SHORTCUT_TOL),
        outputs.regime(f"GePO's sampled reward is in [{rlo}, {rhi}] (a learning signal)",
                       m["gepo_reward"], rlo <= m["gepo_reward"] <= rhi),
    ]


def unbound_shortcut(data: T.PerceptionData, seed: int) -> float:
    """Accuracy of answering with an option that is in the image at all (its kind for
    ``identify`` and ``match``, its colour for ``colour``), ties broken at random."""
    rng = np.random.default_rng(seed)
    right = []
    for i, objs in enumerate(data.objects):
        qt = data.question_type[i]
        present = ({KINDS[o["kind"]] for o in objs} if qt in ("identify", "match")
                   else {COLOUR_NAMES[o["colour"]] for o in objs})
        ok = [j for j, o in enumerate(data.options[i]) if o in present] or \
            list(range(len(data.options[i])))
        right.append(ok[int(rng.integers(len(ok)))] == data.answer[i])
    return float(np.mean(right))


def run(config, workdir: str) -> dict:
    """Every variant on every seed; writes results.json, report.md and a plot."""
    check_config(config)
    t0 = time.time()
    base, _ = zoo.load(config.model, source=config.source)
    t = config.task
    kw = dict(size=t.size, low_factor=t.low_factor, object_size=t.object_size,
              distractors=t.distractors, question_types=tuple(t.question_types))
    timing = {"model_s": time.time() - t0}
    acc = {v: [] for v in VARIANTS}
    acc["zoo model"] = []
    curves, rewards = {}, []
    s = config.sft
    sft = dict(steps=s.steps, batch=s.batch, learning_rate=s.learning_rate,
               num_steps=config.num_slots, cot_weight=s.cot_weight)
    sft_cfg = {"direct": T.SFTConfig(mode="direct", **sft),
               "text_cot": T.SFTConfig(mode="text", **sft),
               "latent": T.SFTConfig(mode="latent", geometry_coef=0.0,
                                     slot_coef=s.slot_coef, **sft),
               "gelvr": T.SFTConfig(mode="latent", geometry_coef=s.geometry_coef,
                                    slot_coef=s.slot_coef, **sft)}
    r = config.rl
    rl = dict(kappa=r.kappa, num_steps=config.num_slots, steps=r.steps, prompts=r.prompts,
              group=r.group, learning_rate=r.learning_rate)
    rl_cfg = {"gepo": T.GePOConfig(family="vmf", geometry_coef=r.geometry_coef, **rl),
              "gepo_no_reg": T.GePOConfig(family="vmf", geometry_coef=0.0, **rl),
              "gaussian_rl": T.GePOConfig(family="gaussian", geometry_coef=r.geometry_coef,
                                          **rl)}
    question_only, shortcut = [], []
    for seed in config.seeds:
        ts = time.time()
        train = T.perception_data(base, t.n_train, seed * 100 + 1, **kw)
        test = T.perception_data(base, t.n_eval, seed * 100 + 2, targets=False, **kw)
        direct0 = T.SFTConfig(mode="direct", num_steps=config.num_slots)
        acc["zoo model"].append({r: float(T.evaluate(base, test, direct0, r).mean())
                                 for r in T.RESOLUTIONS})
        # the question-only baseline: the zoo model fine-tuned as "direct" on blank images
        text_only = nnx.clone(base)
        T.train_sft(text_only, T.blank_images(train), sft_cfg["direct"], seed=seed)
        question_only.append(float(T.question_only(text_only, test).mean()))
        shortcut.append(unbound_shortcut(test, seed))
        models = {}
        for name, cfg in sft_cfg.items():
            model = nnx.clone(base)
            curves[f"{name}/{seed}"] = T.train_sft(model, train, cfg, seed=seed)
            acc[name].append({r: float(T.evaluate(model, test, cfg, r).mean())
                              for r in T.RESOLUTIONS})
            models[name] = model
        for name, cfg in rl_cfg.items():
            model = nnx.clone(models["gelvr"])
            curve = T.train_gepo(model, train, cfg, seed=seed)
            curves[f"{name}/{seed}"] = curve
            if name == "gepo":
                rewards.append(float(np.mean([c["reward"] for c in curve])))
            acc[name].append({r: float(T.evaluate(model, test, sft_cfg["gelvr"], r).mean())
                              for r in T.RESOLUTIONS})
        timing[f"seed_{seed}_s"] = time.time() - ts
    measured = {"accuracy": acc, "question_only": float(np.mean(question_only)),
                "shortcut": float(np.mean(shortcut)), "chance": 0.25,
                "gepo_reward": float(np.mean(rewards))}
    timing["total_s"] = time.time() - t0
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   table=main_table(measured), curves=curves, timing=timing,
                   model=config.model, seeds=list(config.seeds))
    report = _report(results)
    plots = [_plot(results, workdir)]
    return outputs.write_outputs(workdir, name="gelvr", config=config, results=results,
                                 report=report, plots=plots)


def main_table(m: dict) -> list[dict]:
    """One row per variant and baseline: accuracy at full and low resolution and their mean,
    each the mean over seeds with the seeds' standard deviation."""
    rows = []
    for name, per_seed in m["accuracy"].items():
        hi = np.array([s["high"] for s in per_seed])
        lo = np.array([s["low"] for s in per_seed])
        both = (hi + lo) / 2
        rows.append({"variant": name, "full res": float(hi.mean()), "sd full": float(hi.std()),
                     "low res": float(lo.mean()), "sd low": float(lo.std()),
                     "mean": float(both.mean()), "sd mean": float(both.std())})
    for name, v in (("question only (fine-tuned on blank images)", m["question_only"]),
                    ("unbound shortcut (an option in the image)", m["shortcut"]),
                    ("chance", m["chance"])):
        rows.append({"variant": name, "full res": v, "sd full": None, "low res": None,
                     "sd low": None, "mean": v, "sd mean": None})
    return rows


def _report(results) -> str:
    n = len(results["seeds"])
    return "\n".join([
        f"## Accuracy on image_qa (model `{results['model']}`, {n} seed(s), mean and sd over "
        "seeds)\n", outputs.markdown_table(results["table"], floatfmt=".3f"), "\n",
        f"GePO's mean sampled reward: {results['gepo_reward']:.3f}. Timing: "
        f"{', '.join(f'{k} {v:.0f}' for k, v in results['timing'].items())}.\n"])


def _plot(results, workdir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    names = [r["variant"] for r in results["table"] if r["variant"] in VARIANTS + ("zoo model",)]
    rows = {r["variant"]: r for r in results["table"]}
    xs = np.arange(len(names))
    for off, key, sd in ((-0.2, "full res", "sd full"), (0.2, "low res", "sd low")):
        axes[0].bar(xs + off, [rows[n][key] for n in names], 0.4,
                    yerr=[rows[n][sd] for n in names], label=key)
    axes[0].axhline(results["chance"], color="0.5", ls=":", label="chance")
    axes[0].set_xticks(xs, names, rotation=30, ha="right")
    axes[0].set(ylabel="accuracy", title="accuracy by variant (mean, sd over seeds)")
    axes[0].legend(fontsize=7)
    for name in RL_VARIANTS:
        c = results["curves"][f"{name}/{results['seeds'][0]}"]
        axes[1].plot([r["step"] for r in c], [r["reward"] for r in c], "o-", label=name)
    axes[1].set(xlabel="RL step", ylabel="mean sampled reward", title="RL (first seed)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "gelvr.png")


if __name__ == "__main__":
    launch.main(run)
