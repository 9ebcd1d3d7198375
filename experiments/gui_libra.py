"""GUI-Libra experiment: action-aware SFT and KL-constrained online RL (lab.methods.gui_libra)
against their baselines, offline and online, on the synthetic GUI environment.

Arms (every policy starts from the same zoo LM):

* ``sft_action_aware``: reasoning-then-action and direct-action samples of each curated
  step, the action and grounding tokens weighted ``sft.action_weight``; evaluated in the
  reasoning mode;
* ``sft_no_reweight``: the same mixture, every token weight 1;
* ``sft_long_cot``: the long chains of thought only (the paper's "SFT with long CoT");
* ``rl_adaptive``: online RL from ``sft_action_aware`` (states the policy visits; reward 1
  for any valid action), KL to the SFT policy, success-adaptive advantage scaling;
* ``rl_plain``: the same RL without success-adaptive scaling;
* the shortcuts ``first``, ``majority``, ``random`` (they ignore what the goal means).

Offline: step accuracy (any of a state's valid actions counts) and grounding accuracy on
the states of held-out noise-free episodes; online: task success in fresh episodes. The
offline-to-online predictability is the rank correlation of the two over every checkpoint
of every trained arm.

  python -m experiments.gui_libra --config=configs/gui_libra.py:default --workdir=/tmp/gui
"""

from __future__ import annotations

import json
import time

import numpy as np
from flax import nnx

from configs.gui_libra import get_config
from lab import launch, outputs, zoo
from lab.config import check
from lab.methods import gui_libra as gl
from lab.methods.gui_libra import policy as P
from lab.nn import Transformer
from lab.train.rl import RLConfig, RLTrainer, SuccessScaling

SFT_ARMS = {"sft_action_aware": (("reason", "direct"), True),
            "sft_no_reweight": (("reason", "direct"), False),
            "sft_long_cot": (("long",), False)}
RL_ARMS = {"rl_adaptive": True, "rl_plain": False}
ARMS = (*SFT_ARMS, *RL_ARMS)

# Rules of the claims and the regime (fixed before the default run).
SE_MULT = 2.0          # a difference counts when it exceeds this many standard errors
RANK_MIN = 0.6         # offline step accuracy predicts online success: Spearman >= this
ROOM = (0.1, 0.95)     # regime: the SFT policy's step accuracy above the best shortcut by
#                        ROOM[0] and below ROOM[1]
ONLINE_ROOM = (0.05, 0.9)   # regime: the SFT policy's online success leaves RL room
SHORTCUT_TOL = 0.1     # regime: the shortcuts' step accuracy within this of chance
MULTI_MIN = 0.1        # regime: states with several valid actions (partial verifiability)


def _checks():
    pos = (lambda v: v >= 1, "an int >= 1")
    return {"data.episodes": pos, "offline_episodes": pos, "online_episodes": pos,
            "checkpoint_online": pos, "sft.steps": pos, "sft.batch": pos,
            "sft.checkpoints": pos, "rl.steps": pos, "rl.prompts_per_step": pos,
            "rl.group_size": (lambda v: v >= 2, "an int >= 2"), "rl.episodes": pos,
            "rl.checkpoints": pos, "max_new": pos, "long_max_new": pos, "width": pos,
            "sft.action_weight": (lambda v: v > 0, "a number > 0")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _base_model(config):
    if config.init:
        return zoo.load(config.init)
    from lab.data import ByteTokenizer
    from lab.zoo.spec import byte_lm
    return Transformer(byte_lm(32, 1, 2, 1, 64, 512), rngs=nnx.Rngs(config.seed)), \
        ByteTokenizer()


def _mode(arm: str) -> str:
    return "long" if arm == "sft_long_cot" else "reason"


def _act(model, tok, arm, config, batch=64):
    mode = _mode(arm)
    return P.as_actions(P.lm_policy(
        model, tok, mode, max_new_tokens=config.long_max_new if mode == "long"
        else config.max_new, width=config.width, batch=batch))


def _evaluate(act, test_rows, episodes, seed) -> dict:
    return {**P.offline_eval(act, test_rows), **P.online_eval(act, episodes, seed)}


def _curve_fn(config, tok, test_rows, curves, arm, offset=0):
    """An ``eval_fn`` that evaluates a checkpoint offline and online into ``curves``."""
    def ev(model, step):
        r = _evaluate(_act(model, tok, arm, config), test_rows, config.checkpoint_online,
                      10_000 + config.seed)
        curves.setdefault(arm, []).append({"step": offset + step, **r})
        return {"step_accuracy": r["step_accuracy"], "success": r["success"]}
    return ev


def _fresh(config, state=None):
    model, tok = _base_model(config)
    if state is not None:
        nnx.update(model, state)
    return model, tok


def _train_sft(config, rows, test_rows):
    """Trains the SFT arms; returns ``(models, metrics)`` with the checkpoint evaluations
    (offline on the held-out states, online on ``checkpoint_online`` episodes)."""
    sc, models, curves, seconds = config.sft, {}, {}, {}
    for arm, (modes, reweight) in SFT_ARMS.items():
        t = time.perf_counter()
        model, tok = _fresh(config)
        model, _ = P.train_sft(
            model, tok, P.sft_examples(rows, modes), steps=sc.steps, batch_size=sc.batch,
            learning_rate=sc.learning_rate,
            seq_len=sc.long_seq_len if "long" in modes else sc.seq_len,
            action_weight=sc.action_weight if reweight else 1.0,
            warmup_steps=sc.warmup_steps, seed=config.seed,
            eval_every=max(sc.steps // sc.checkpoints, 1),
            eval_fn=_curve_fn(config, tok, test_rows, curves, arm))
        models[arm], seconds[arm] = model, time.perf_counter() - t
    return models, {"curves": curves, "seconds": seconds}


def _train_rl(config, init_state, test_rows):
    """Online RL from the action-aware SFT policy, with and without success-adaptive
    scaling; returns ``(models, metrics)`` as :func:`_train_sft`, plus the RL history."""
    rc, models, curves, seconds, history = config.rl, {}, {}, {}, {}
    for arm, adaptive in RL_ARMS.items():
        t = time.perf_counter()
        model, tok = _fresh(config, init_state)
        cfg = RLConfig(steps=rc.steps, prompts_per_step=rc.prompts_per_step,
                       group_size=rc.group_size, max_new_tokens=config.max_new,
                       temperature=rc.temperature, max_prompt_len=config.width,
                       rewards=("gui_valid",), group_by="prompt", aggregation="token",
                       clip_eps=rc.clip_eps, clip_eps_high=rc.clip_eps_high,
                       kl_coef=rc.kl_coef, kl_estimator="k3", learning_rate=rc.learning_rate,
                       eval_every=max(rc.steps // rc.checkpoints, 1), seed=config.seed,
                       progress=False)
        source = P.online_source(tok, "reason", episodes=rc.episodes,
                                 prompts_per_step=rc.prompts_per_step,
                                 max_new_tokens=config.max_new, width=config.width,
                                 seed=config.seed)
        trainer = RLTrainer(model, tok, cfg, success_hook=SuccessScaling(mode="advantage")
                            if adaptive else None)
        trainer.fit(source, eval_fn=_curve_fn(config, tok, test_rows, curves, arm,
                                              offset=config.sft.steps))
        history[arm] = [{k: h[k] for k in ("reward", "kl", "clip_frac") if k in h}
                        for h in trainer.history]
        models[arm], seconds[arm] = model, time.perf_counter() - t
    return models, {"curves": curves, "seconds": seconds, "rl_history": history}


def _sft_recipe(config) -> dict:
    return {"init": config.init, "seed": config.seed, "data": config.data.to_dict(),
            "sft": config.sft.to_dict(), "offline_episodes": config.offline_episodes,
            "checkpoint_online": config.checkpoint_online, "max_new": config.max_new,
            "long_max_new": config.long_max_new, "width": config.width, "format": 1}


def load_policies(config, rows, test_rows, source=None):
    """The trained arms: ``(modules, metrics, sources)`` from two :mod:`lab.zoo.bundle`
    entries, the SFT arms and the RL arms (keyed by the SFT recipe and the RL one), each
    shipped, cached or trained now."""
    from lab.zoo import bundle
    from lab.zoo.store import abstract_model

    def template(names):
        cfg = _base_model(config)[0].config
        return lambda: {arm: abstract_model(cfg) for arm in names}

    sft_recipe = _sft_recipe(config)
    sft = bundle.load("gui-libra-sft", sft_recipe,
                      lambda: _train_sft(config, rows, test_rows), template(SFT_ARMS),
                      source=source)
    init = nnx.split(sft.modules["sft_action_aware"])[1]
    rl = bundle.load("gui-libra-rl", {"sft": sft_recipe, "rl": config.rl.to_dict()},
                     lambda: _train_rl(config, init, test_rows), template(RL_ARMS),
                     source=source)
    metrics = {"curves": {**sft.metrics["curves"], **rl.metrics["curves"]},
               "rl_history": rl.metrics["rl_history"],
               "seconds": {**sft.metrics["seconds"], **rl.metrics["seconds"]}}
    return ({**sft.modules, **rl.modules}, metrics,
            {"sft": [sft.source, sft.key], "rl": [rl.source, rl.key]})


def distinct_checkpoints(curve: list[dict]) -> list[dict]:
    """The checkpoints of one arm without repeats: the trainer evaluates the final model
    again when the run does not end on an evaluation step; the same model gives the same
    greedy metrics, and one point must not count twice in the rank correlation."""
    out = []
    for c in curve:
        if out and {k: v for k, v in c.items() if k != "step"} == \
                {k: v for k, v in out[-1].items() if k != "step"}:
            continue
        out.append(c)
    return out


def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when one side is constant."""
    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for u in np.unique(v):
            r[v == u] = r[v == u].mean()
        return r
    a, b = ranks(x), ranks(y)
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _se(p1, n1, p2, n2) -> float:
    return float(np.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2))


def claim_rules(m: dict) -> list[dict]:
    """The claims on measured ``m``: ``arms[name]`` (``step_accuracy``,
    ``grounding_accuracy``, ``success``), ``n_offline``, ``n_online`` and ``spearman``."""
    a, no, nn_ = m["arms"], m["n_offline"], m["n_online"]

    def better(x, y, key, n):
        d = a[x][key] - a[y][key]
        se = _se(a[x][key], n, a[y][key], n)
        return d, bool(d > SE_MULT * se)

    out = []
    for x, y, key, n, text in (
            ("sft_action_aware", "sft_no_reweight", "success", nn_,
             "Action-aware token reweighting raises online success over SFT without it"),
            ("sft_action_aware", "sft_no_reweight", "step_accuracy", no,
             "Action-aware token reweighting raises offline step accuracy"),
            ("sft_action_aware", "sft_long_cot", "grounding_accuracy", no,
             "SFT with long CoT only grounds worse than action-aware SFT"),
            ("rl_adaptive", "sft_action_aware", "success", nn_,
             "KL-constrained RL with success-adaptive scaling raises online success over "
             "its SFT initialisation"),
            ("rl_adaptive", "rl_plain", "success", nn_,
             "Success-adaptive scaling beats RL without it online")):
        d, holds = better(x, y, key, n)
        out.append(outputs.claim(f"{text} (by > {SE_MULT:g} standard errors)",
                                 f"{key} {x} - {y}", d, holds))
    rho = m["spearman"]
    out.append(outputs.claim(
        f"Offline step accuracy predicts online success across checkpoints (Spearman >= "
        f"{RANK_MIN})", "Spearman rho over every checkpoint of every trained arm", rho,
        bool(np.isfinite(rho) and rho >= RANK_MIN)))
    return out


def regime_rules(m: dict) -> list[dict]:
    """Regime checks on ``m`` (``arms``, ``shortcuts``, ``chance``, ``multi_valid``)."""
    sft = m["arms"]["sft_action_aware"]
    best = max(v["step_accuracy"] for v in m["shortcuts"].values())
    worst_gap = max(abs(v["step_accuracy"] - m["chance"]) for v in m["shortcuts"].values())
    return [
        outputs.regime(f"the action-aware SFT policy is above the best shortcut by >= "
                       f"{ROOM[0]} step accuracy and below {ROOM[1]}",
                       [sft["step_accuracy"], best],
                       sft["step_accuracy"] >= best + ROOM[0]
                       and sft["step_accuracy"] <= ROOM[1]),
        outputs.regime(f"its online success leaves RL room ({ONLINE_ROOM[0]}-"
                       f"{ONLINE_ROOM[1]})", sft["success"],
                       ONLINE_ROOM[0] <= sft["success"] <= ONLINE_ROOM[1]),
        outputs.regime(f"no shortcut: every shortcut's step accuracy within {SHORTCUT_TOL} "
                       "of the random action's chance", worst_gap, worst_gap <= SHORTCUT_TOL),
        outputs.regime(f"partial verifiability: >= {MULTI_MIN} of held-out states have "
                       "several valid actions", m["multi_valid"],
                       m["multi_valid"] >= MULTI_MIN),
    ]


def run(config, workdir: str) -> dict:
    """Loads or trains the arms, evaluates every arm and shortcut offline and online;
    writes results.json, report.md and a plot; returns the results."""
    check_config(config)
    t0 = time.time()
    d = config.data
    rows, counts = gl.curate(gl.demonstrations(d.episodes, seed=config.seed,
                                               p_wrong=d.p_wrong, p_mismatch=d.p_mismatch),
                             max_per_key=d.max_per_key)
    test_rows = gl.demonstrations(config.offline_episodes, seed=config.seed + 7_000,
                                  p_wrong=0, p_mismatch=0)
    modules, metrics, sources = load_policies(config, rows, test_rows)
    _, tok = _base_model(config)
    timing = {"policies_s": time.time() - t0}
    online_seed = 20_000 + config.seed
    arms = {}
    for arm in ARMS:
        arms[arm] = _evaluate(_act(modules[arm], tok, arm, config), test_rows,
                              config.online_episodes, online_seed)
    shortcuts = {s: _evaluate(gl.shortcut_policy(s, config.seed), test_rows,
                              config.online_episodes, online_seed) for s in gl.SHORTCUTS}
    timing["evaluate_s"] = time.time() - t0 - timing["policies_s"]
    points = [c for arm in ARMS for c in distinct_checkpoints(metrics["curves"].get(arm, []))]
    rho = spearman([p["step_accuracy"] for p in points], [p["success"] for p in points])
    multi = float(np.mean([len(json.loads(r["valid"])) > 1 for r in test_rows]))
    measured = {"arms": arms, "shortcuts": shortcuts, "chance": gl.random_step_chance(test_rows),
                "multi_valid": multi, "spearman": rho, "n_offline": len(test_rows),
                "n_online": config.online_episodes, "data": counts,
                "curves": metrics["curves"], "rl_history": metrics["rl_history"],
                "policies": {**sources, "train_seconds": metrics["seconds"]}}
    timing["total_s"] = time.time() - t0
    results = dict(measured, claims=claim_rules(measured), regime=regime_rules(measured),
                   timing=timing)
    return outputs.write_outputs(workdir, name="gui_libra", config=config, results=results,
                                 report=_report(results), plots=[_plot(results, workdir)])


def main_table(r) -> list[dict]:
    """One row per arm and shortcut: offline step and grounding accuracy, online success."""
    rows = []
    for name, v in [*r["arms"].items(), *r["shortcuts"].items()]:
        rows.append({"policy": name, "step accuracy": v["step_accuracy"],
                     "grounding": v["grounding_accuracy"], "malformed": v["malformed"],
                     "online success": v["success"],
                     **{k.split("/")[1]: v[k] for k in sorted(v) if k.startswith("success/")}})
    return rows


def _report(r) -> str:
    curve_rows = [{"arm": arm, **c} for arm, cs in r["curves"].items()
                  for c in distinct_checkpoints(cs)]
    cols = ["arm", "step", "step_accuracy", "grounding_accuracy", "success"]
    return "\n".join([
        f"Policies: SFT arms {' '.join(r['policies']['sft'])}, RL arms "
        f"{' '.join(r['policies']['rl'])}. Data: "
        f"{r['data']['raw']} raw steps, {r['data']['after_consistency']} consistent, "
        f"{r['data']['after_redundancy']} curated. Offline: {r['n_offline']} held-out states "
        f"({r['multi_valid']:.2f} with several valid actions; a random action is valid "
        f"with probability {r['chance']:.3f}); online: {r['n_online']} fresh episodes.\n",
        "## Offline and online, per policy\n", outputs.markdown_table(main_table(r)), "\n",
        "## Checkpoints (measured when trained)\n",
        outputs.markdown_table(curve_rows, cols), "\n",
        f"Offline-to-online rank correlation over the checkpoints: Spearman "
        f"{outputs.format_value(r['spearman'])}.\n",
        "Timing: " + ", ".join(f"{n} {v:.1f}" for n, v in r["timing"].items()) + "\n"])


def _plot(r, workdir) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for arm, cs in r["curves"].items():
        ax.plot([c["step_accuracy"] for c in cs], [c["success"] for c in cs], "o-",
                label=arm, ms=4)
    ax.set(xlabel="offline step accuracy", ylabel="online success", xlim=(0, 1),
           ylim=(-0.02, 1.02), title=f"checkpoints (Spearman {r['spearman']:.2f})")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return outputs.save_figure(fig, workdir, "gui_libra.png")


if __name__ == "__main__":
    launch.main(run)
