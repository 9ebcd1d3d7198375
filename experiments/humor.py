"""HUMOR experiment (lab.methods.humor): reward-model pair accuracy under label noise
(pairwise-in-group Bradley-Terry vs pointwise regression), the diversity of reasoning paths
(multi-path vs single-path generation) and the hidden-preference agreement of generated
captions before and after group-wise RL, with image-blind baselines beside.

Stages:

1. perception: the perception VLM (HUMOR's shipped bundle) reads every meme image's scene and intent
   (its posteriors are the reward heads' image features);
2. reward models: for each label-noise level and seed, a BT head and a pointwise head on the
   same noisy labels (early stopping on noisy validation labels, the same rule for both),
   scored on held-out pairs against the hidden preference; image-blind shortcuts beside;
3. SFT: a tiny byte LM learns the hierarchy (intent -> paths -> anchor -> caption) traced
   back from the ground-truth captions of the training groups (multi-path and single-path);
   the two policies are HUMOR's bundle ``humor-sft``, shipped, cached or trained now;
4. RL: the multi-path policy on :class:`lab.train.rl.RLTrainer` with the BT RM's reward
   (standardised, clipped), advantages normalised within template groups
   (``group_by="template"``), the clipped ratio and a k3 KL to the SFT policy.

  python -m experiments.humor --config=configs/humor.py:default --workdir=/tmp/humor
"""

from __future__ import annotations

import collections
import time

import numpy as np
from flax import nnx

from configs.humor import get_config
from lab import infer, launch, outputs
from lab.config import check
from lab.data import ByteTokenizer
from lab.methods import humor as H
from lab.nn import Transformer
from lab.train.rl import RLConfig, RLTrainer

# Rules of the claims and the regime (fixed before the default run).
SE_MULT = 2.0            # a difference counts when it exceeds this many standard errors
SEES_MARGIN = 0.2        # regime: perceived-attribute accuracy above image-blind by this
LEARNABLE = 0.65         # regime: noise-0 RM pair accuracy at least this (chance 0.5)
PERFECT = 0.995          # regime: ... and not both RMs at or above this
CEILING = 0.95           # regime: the pre-RL policy's agreement below this (ceiling 1)
SHORTCUT_TOL = 0.1       # regime: shortcut pair accuracy within this of chance
PARSEABLE = 0.8          # regime: the SFT policies' sampled completions parse at least this
RM_PART = "reward models"        # the parts of the experiment (claims and regime checks)
GEN_PART = "generation"


def _checks():
    pos = (lambda v: v >= 1, "an int >= 1")
    return {"perception.steps": pos,
            "perception.colour_steps": (lambda v: v >= 0, "an int >= 0"),
            "data.n_train": pos, "data.n_val": pos,
            "data.n_test": pos, "data.n_captions": (lambda v: v >= 2, "an int >= 2"),
            "rm.steps": pos, "sft.steps": pos, "sft.batch": pos,
            "sft.n_paths": (lambda v: v >= 2, "an int >= 2"), "rl.steps": pos,
            "rl.prompts_per_step": pos,
            "rl.group_size": (lambda v: v >= 2, "an int >= 2 (group normalisation needs "
                              "two samples per group)"),
            "rl.reward_clip": (lambda v: v > 0, "a number > 0"),
            "diversity.samples": pos, "max_new": pos, "width": pos}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    check(config, get_config, _checks())
    if not config.seeds:
        raise ValueError(f"config.seeds={tuple(config.seeds)!r} is invalid; expected at least "
                         "one seed")
    if not any(n > 0 for n in config.noise_levels) or any(
            not 0 <= n < 0.5 for n in config.noise_levels):
        raise ValueError(f"config.noise_levels={tuple(config.noise_levels)!r} is invalid; "
                         "expected flip probabilities in [0, 0.5), at least one > 0")
    return config


def _policy_config(config):
    from lab.zoo.spec import byte_lm
    p = config.policy
    return byte_lm(p.d_model, p.n_layers, p.n_heads, p.n_heads, p.d_ff, 256)


def _policy(config):
    return Transformer(_policy_config(config), rngs=nnx.Rngs(config.seed)), ByteTokenizer()


def _perceive(vlm, groups):
    scene, intent = H.perceive(vlm, groups["images"])
    return {"scene": scene, "intent": intent, "features": H.image_features(scene, intent),
            "words": H.perceived_words(scene, intent)}


def rm_comparison(config, vlm, test, test_p) -> dict:
    """Held-out pair accuracy per noise level, seed and RM kind, and the shortcuts at the
    first noise level of every seed."""
    d, r = config.data, config.rm
    acc, shortcuts, models = {}, {}, {}
    for noise in config.noise_levels:
        for seed in config.seeds:
            tr = H.meme_groups(d.n_train, seed=seed, n_captions=d.n_captions, noise=noise)
            va = H.meme_groups(d.n_val, seed=seed + 500, n_captions=d.n_captions, noise=noise)
            tr_f, va_f = _perceive(vlm, tr)["features"], _perceive(vlm, va)["features"]
            for kind in H.KINDS:
                rm = H.train_reward_model(tr, tr_f, kind, steps=r.steps,
                                          learning_rate=r.learning_rate, hidden=r.hidden,
                                          seed=seed, val=(va, va_f), eval_every=r.eval_every)
                acc[f"{noise:g}/{seed}/{kind}"] = H.held_out_pair_accuracy(
                    rm, test, test_p["features"])
                models[(noise, seed, kind)] = (rm, tr, tr_f)
            if noise == config.noise_levels[0]:
                for s in H.SHORTCUTS:
                    shortcuts.setdefault(s, []).append(H.shortcut_accuracy(
                        s, tr, test, steps=r.steps, seed=seed))
    return {"accuracy": acc, "shortcuts": {k: float(np.mean(v)) for k, v in shortcuts.items()},
            "models": models}


def agreement(captions, groups) -> dict:
    """Hidden-preference agreement of one caption per group: ``score / MAX_SCORE`` (0 for
    a caption outside the grammar), its per-group values, and the malformed fraction."""
    vals, bad = [], 0
    for g, c in enumerate(captions):
        if c is None or H.parse_caption(c) is None:
            vals.append(0.0)
            bad += 1
            continue
        vals.append(H.hidden_score(int(groups["scene"][g]), int(groups["intent"][g]), c)
                    / H.MAX_SCORE)
    return {"agreement": float(np.mean(vals)), "per_group": vals,
            "malformed": bad / max(len(captions), 1)}


def _captions(model, tok, words, config, temperature=0.0, seed=0):
    comps = infer.complete(model, tok, [H.prompt(*w) for w in words],
                           max_new_tokens=config.max_new, width=config.width,
                           temperature=temperature, seed=seed)
    return comps, [H.completion_caption(c) for c in comps]


def _diversity(model, tok, test, test_p, config, seed):
    by_t = collections.defaultdict(list)
    for g, t in enumerate(test["template"]):
        if len(by_t[t]) < config.diversity.samples:
            by_t[t].append(g)
    idx = [g for t in sorted(by_t) for g in by_t[t]]
    comps = infer.complete(model, tok, [H.prompt(*test_p["words"][g]) for g in idx],
                           max_new_tokens=config.max_new, width=config.width,
                           temperature=config.diversity.temperature, seed=seed)
    grouped = collections.defaultdict(list)
    for g, c in zip(idx, comps, strict=True):
        grouped[test["template"][g]].append(c)
    return H.path_diversity(grouped)


def sft_noise(config) -> float:
    """The label-noise level of the SFT and RL stage: the one of ``config.noise_levels``
    nearest ``config.sft.noise`` (its pairwise RM gives the RL reward)."""
    return min(config.noise_levels, key=lambda n: abs(n - config.sft.noise))


def _sft_recipe(config, rl_noise: float) -> dict:
    """Everything that determines the SFT policies: the perception VLM (its bundle key,
    which changes with its recipe), the training groups (the RM comparison's first seed at
    ``rl_noise``), the policy and the SFT settings."""
    from lab.zoo import bundle

    d, pc = config.data, config.perception
    spec = H.perception_spec(pc.steps, colour_steps=pc.colour_steps, d_model=pc.d_model,
                             seed=config.seed, n_eval=pc.n_eval)
    return {"seed": config.seed, "perception": bundle.key(spec.name, spec.hashed_fields()),
            "data": {"n_train": d.n_train, "n_captions": d.n_captions,
                     "seed": config.seeds[0], "noise": rl_noise},
            "policy": config.policy.to_dict(), "sft": config.sft.to_dict(), "format": 1}


def load_sft(config, tr, tr_p, rl_noise: float, source: str | None = None):
    """The SFT policies ``{mode: model}`` and their :class:`lab.zoo.bundle.Bundle` (source,
    key, training seconds): the bundle ``humor-sft`` keyed by :func:`_sft_recipe`, shipped
    with Lab, cached on this host, or trained now on the groups ``tr`` (perceived ``tr_p``)."""
    from lab.zoo import bundle
    from lab.zoo.store import abstract_model

    s = config.sft

    def train():
        best = H.noisy_best(tr)
        models, seconds = {}, {}
        for mode in H.MODES:
            t = time.perf_counter()
            model, tok = _policy(config)
            ex = H.sft_examples(tr, tr_p["words"], best, mode, s.n_paths, seed=config.seed)
            models[mode], _ = H.train_sft(model, tok, ex, steps=s.steps, batch_size=s.batch,
                                          learning_rate=s.learning_rate, seq_len=s.seq_len,
                                          warmup_steps=s.warmup_steps, seed=config.seed)
            seconds[mode] = time.perf_counter() - t
        return models, {"seconds": seconds}

    cfg = _policy_config(config)
    got = bundle.load("humor-sft", _sft_recipe(config, rl_noise), train,
                      lambda: {mode: abstract_model(cfg) for mode in H.MODES}, source=source)
    return got.modules, got


def policies(config, vlm, rm_bundle, test, test_p, rl_noise: float) -> dict:
    """SFT (multi-path, single-path; :func:`load_sft`) then RL (multi-path): agreement and
    diversity."""
    rc = config.rl
    rm, tr, tr_f = rm_bundle
    tr_p = _perceive(vlm, tr)
    out, timing = {}, {}
    t = time.perf_counter()
    models, sft = load_sft(config, tr, tr_p, rl_noise)
    timing["sft_s"] = time.perf_counter() - t
    tok = ByteTokenizer()
    # RL from the multi-path SFT policy, the BT reward standardised on its training captions.
    t = time.perf_counter()
    flat = [c for cs in tr["captions"] for c in cs]
    r_train = H.score_captions(rm, np.repeat(tr_f, len(tr["captions"][0]), 0), flat)
    name = H.register_rm_reward(rm, mean=float(r_train.mean()),
                                std=float(max(r_train.std(), 1e-6)), clip=rc.reward_clip)
    rows = [{"prompt": H.prompt(*tr_p["words"][g]), "template": tr["template"][g],
             "features": tr_f[g].tolist()} for g in range(len(tr["template"]))]
    policy, _ = _policy(config)
    nnx.update(policy, nnx.state(models["multi"]))
    cfg = RLConfig(steps=rc.steps, prompts_per_step=rc.prompts_per_step,
                   group_size=rc.group_size, max_new_tokens=config.max_new,
                   temperature=rc.temperature, max_prompt_len=config.width, rewards=(name,),
                   group_by="template", scale_rewards="group", aggregation="token",
                   clip_eps=rc.clip_eps, kl_coef=rc.kl_coef, kl_estimator="k3",
                   learning_rate=rc.learning_rate, seed=config.seed, progress=False)
    trainer = RLTrainer(policy, tok, cfg)
    trainer.fit(rows)
    models["rl"] = policy
    timing["rl_s"] = time.perf_counter() - t
    history = [{k: h[k] for k in ("reward", "kl", "clip_frac", "no_answer") if k in h}
               for h in trainer.history]
    for arm, model in (("sft_multi", models["multi"]), ("sft_single", models["single"]),
                       ("rl_multi", models["rl"])):
        _, caps = _captions(model, tok, test_p["words"], config)
        out[arm] = agreement(caps, test)
    diversity = {mode: _diversity(models[mode], tok, test, test_p, config, config.seed + 1)
                 for mode in H.MODES}
    diversity["temperature"] = config.diversity.temperature
    return {"arms": out, "diversity": diversity, "rl_history": history, "timing": timing,
            "sft": {"source": sft.source, "key": sft.key,
                    "train_seconds": sft.metrics.get("seconds", {})}}


def caption_baselines(config, test) -> dict:
    """Image-blind captions: a uniformly random candidate per group, and the one caption
    with the highest pooled win rate over the training labels (at ``sft.noise``)."""
    d = config.data
    tr = H.meme_groups(d.n_train, seed=config.seed, n_captions=d.n_captions,
                       noise=config.sft.noise)
    rates = H.caption_win_rates(tr)
    seen = collections.Counter(c for cs in tr["captions"] for c in cs)
    pool = [c for c in rates if seen[c] >= 3] or list(rates)
    blind = max(pool, key=lambda c: (rates[c], c))
    rng = np.random.default_rng([config.seed, 404])
    random_caps = [H.random_caption(rng) for _ in test["template"]]
    return {"random_caption": agreement(random_caps, test),
            "blind_caption": dict(agreement([blind] * len(test["template"]), test),
                                  caption=blind)}


def claim_rules(m: dict) -> list[dict]:
    """Claims on measured ``m``: ``rm`` (``accuracy["<noise>/<seed>/<kind>"]``),
    ``noise_levels``, ``seeds``, ``arms`` (``agreement``, ``per_group``) and
    ``diversity`` (``anchored_fraction`` and its ``per_template_anchored`` values)."""
    acc, seeds = m["rm"]["accuracy"], m["seeds"]
    diffs, holds = [], True
    for noise in [n for n in m["noise_levels"] if n > 0]:
        pw = [acc[f"{noise:g}/{s}/pairwise"] for s in seeds]
        pt = [acc[f"{noise:g}/{s}/pointwise"] for s in seeds]
        diffs.append(float(np.mean(pw) - np.mean(pt)))
        holds = holds and min(pw) > max(pt)
    out = [outputs.claim(
        "The pairwise-in-group (Bradley-Terry) RM beats the pointwise RM in held-out pair "
        "accuracy at every nonzero label noise, beyond the seed spread (every pairwise seed "
        "above every pointwise seed)",
        "mean pair accuracy pairwise - pointwise, per nonzero noise level", diffs,
        bool(holds), part=RM_PART)]
    a, b = m["arms"]["rl_multi"], m["arms"]["sft_multi"]
    d = a["agreement"] - b["agreement"]
    se = outputs.paired_se(a["per_group"], b["per_group"])
    out.append(outputs.claim(
        f"Group-wise RL with the RM reward raises the hidden-preference agreement of the "
        f"generated captions (by > {SE_MULT:g} paired standard errors)",
        "agreement rl_multi - sft_multi", d, bool(d > SE_MULT * se), part=GEN_PART))
    # Across samples only: the anchored path, one per completion. The pooled fraction also
    # counts pairs within one multi-path completion, which its targets make distinct by
    # construction, so it is reported but decides nothing.
    pm = m["diversity"]["multi"]["per_template_anchored"]
    ps = m["diversity"]["single"]["per_template_anchored"]
    keys = sorted(pm)
    dd = m["diversity"]["multi"]["anchored_fraction"] - m["diversity"]["single"][
        "anchored_fraction"]
    se = outputs.paired_se([pm[k] for k in keys], [ps.get(k, 0.0) for k in keys])
    out.append(outputs.claim(
        f"Multi-path generation gives more distinct anchored reasoning paths across samples "
        f"per template than single-path (by > {SE_MULT:g} paired standard errors over "
        f"templates)", "anchored-path distinct fraction multi - single", dd,
        bool(dd > SE_MULT * se), part=GEN_PART))
    return out


def regime_rules(m: dict) -> list[dict]:
    """Regime checks on ``m`` (``perception``, ``blind_perception``, ``rm``,
    ``noise_levels``, ``seeds``, ``arms``, ``diversity`` with each mode's sampled
    ``malformed`` fraction and ``temperature``). The perception check speaks for every
    claim; the others for the reward-model part or the generation part."""
    acc, seeds = m["rm"]["accuracy"], m["seeds"]
    n0 = min(m["noise_levels"])
    zero = {k: float(np.mean([acc[f"{n0:g}/{s}/{k}"] for s in seeds])) for k in H.KINDS}
    worst = max(abs(v - 0.5) for v in m["rm"]["shortcuts"].values())
    pre = m["arms"]["sft_multi"]["agreement"]
    parsed = [1.0 - m["diversity"][mode]["malformed"] for mode in H.MODES]
    return [
        outputs.regime(f"the VLM sees the image: perceived-attribute accuracy >= image-blind "
                       f"+ {SEES_MARGIN}", [m["perception"]["mean"],
                                            m["blind_perception"]["mean"]],
                       m["perception"]["mean"] >= m["blind_perception"]["mean"] + SEES_MARGIN),
        outputs.regime(f"labels at the lowest noise ({n0:g}) are learnable (both RMs >= "
                       f"{LEARNABLE}) and not trivially perfect (not both >= {PERFECT})",
                       [zero["pairwise"], zero["pointwise"]],
                       min(zero.values()) >= LEARNABLE and min(zero.values()) < PERFECT,
                       part=RM_PART),
        outputs.regime(f"no shortcut: every image-blind shortcut RM within {SHORTCUT_TOL} of "
                       "chance (0.5)", worst, worst <= SHORTCUT_TOL, part=RM_PART),
        outputs.regime(f"the pre-RL policy is below the hidden preference's ceiling "
                       f"(agreement < {CEILING})", pre, pre < CEILING, part=GEN_PART),
        outputs.regime(f"the SFT policies write the hierarchy when sampled (temperature "
                       f"{m['diversity']['temperature']:g}): >= {PARSEABLE} of completions "
                       f"parse, {' and '.join(H.MODES)}-path (else RL's reward and the "
                       f"path diversity measure the format, not the captions)", parsed,
                       min(parsed) >= PARSEABLE, part=GEN_PART),
    ]


def run(config, workdir: str) -> dict:
    """Runs every stage; writes results.json, report.md and a plot; returns the results."""
    check_config(config)
    t0 = time.time()
    d = config.data
    pc = config.perception
    vlm, _ = H.load_perception(pc.steps, colour_steps=pc.colour_steps, d_model=pc.d_model,
                               seed=config.seed, n_eval=pc.n_eval)
    timing = {"perception_s": time.time() - t0}
    test = H.meme_groups(d.n_test, seed=config.seed + 9_000, n_captions=d.n_captions)
    test_p = _perceive(vlm, test)
    train0 = H.meme_groups(d.n_train, seed=config.seed, n_captions=d.n_captions)
    perception = H.attribute_accuracy(test_p["scene"], test_p["intent"], test)
    blind = H.blind_attribute_accuracy(train0, test)
    t = time.time()
    rm = rm_comparison(config, vlm, test, test_p)
    timing["reward_models_s"] = time.time() - t
    rl_noise = sft_noise(config)
    pol = policies(config, vlm, rm["models"][(rl_noise, config.seeds[0], "pairwise")],
                   test, test_p, rl_noise)
    timing.update(pol["timing"])
    baselines = caption_baselines(config, test)
    timing["total_s"] = time.time() - t0
    measured = {"perception": perception, "blind_perception": blind,
                "rm": {"accuracy": rm["accuracy"], "shortcuts": rm["shortcuts"]},
                "noise_levels": list(config.noise_levels), "seeds": list(config.seeds),
                "rl_noise": rl_noise, "arms": pol["arms"], "baselines": baselines,
                "diversity": pol["diversity"], "rl_history": pol["rl_history"],
                "sft_policies": pol["sft"],
                "n_test": d.n_test}
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing=timing)
    return outputs.write_outputs(workdir, name="humor", config=config, results=results,
                                 report=_report(results), plots=[_plot(results, workdir)])


def rm_table(r) -> list[dict]:
    """One row per noise level: mean (and per-seed) pair accuracy of each RM kind."""
    rows = []
    for noise in r["noise_levels"]:
        row = {"label noise": noise}
        for kind in H.KINDS:
            vals = [r["rm"]["accuracy"][f"{noise:g}/{s}/{kind}"] for s in r["seeds"]]
            row[kind] = float(np.mean(vals))
            row[f"{kind} seeds"] = " / ".join(f"{v:.3f}" for v in vals)
        rows.append(row)
    return rows


def policy_table(r) -> list[dict]:
    """Agreement and malformed fraction (greedy), the malformed fraction of the sampled
    completions and path diversity of each policy and baseline."""
    rows = []
    div = {"sft_multi": r["diversity"]["multi"], "sft_single": r["diversity"]["single"]}
    for name, v in [*r["arms"].items(), *r["baselines"].items()]:
        rows.append({"policy": name, "agreement": v["agreement"], "malformed": v["malformed"],
                     "sampled malformed": div[name]["malformed"] if name in div else None,
                     "distinct-path fraction": div[name]["distinct_fraction"]
                     if name in div else None,
                     "distinct paths / template": div[name]["distinct"]
                     if name in div else None,
                     "anchored-path fraction": div[name]["anchored_fraction"]
                     if name in div else None})
    return rows


def main_table(r) -> list[dict]:
    """The report's main table (``experiments.results_doc``): the policies and caption
    baselines (the RM comparison is ``rm_table``)."""
    return policy_table(r)


def _report(r) -> str:
    sc = ", ".join(f"{k} {v:.3f}" for k, v in r["rm"]["shortcuts"].items())
    return "\n".join([
        f"Perception (held-out images): scene {r['perception']['scene']:.3f}, intent "
        f"{r['perception']['intent']:.3f} (image-blind {r['blind_perception']['mean']:.3f}). "
        f"{r['n_test']} held-out groups.\n",
        "## Reward-model pair accuracy against the hidden preference\n",
        outputs.markdown_table(rm_table(r)), "\n",
        f"Image-blind shortcut RMs (noise {min(r['noise_levels']):g}): {sc}.\n",
        f"## Generated captions (hidden-preference agreement, ceiling 1; RL with the "
        f"pairwise RM at noise {r['rl_noise']:g})\n",
        outputs.markdown_table(policy_table(r)), "\n",
        f"SFT policies: bundle {r['sft_policies']['key']} ({r['sft_policies']['source']}; "
        "trained in " + ", ".join(f"{m} {v:.0f} s" for m, v in
                                  r["sft_policies"]["train_seconds"].items()) + ").\n",
        "Timing: " + ", ".join(f"{n} {v:.1f}" for n, v in r["timing"].items()) + "\n"])


def _plot(r, workdir) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for kind in H.KINDS:
        for s in r["seeds"]:
            ax.plot(r["noise_levels"], [r["rm"]["accuracy"][f"{n:g}/{s}/{kind}"]
                                        for n in r["noise_levels"]],
                    "o-" if kind == "pairwise" else "s--",
                    color="C0" if kind == "pairwise" else "C1", alpha=0.7,
                    label=kind if s == r["seeds"][0] else None)
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set(xlabel="label noise", ylabel="held-out pair accuracy", ylim=(0.4, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "humor.png")


if __name__ == "__main__":
    launch.main(run)
