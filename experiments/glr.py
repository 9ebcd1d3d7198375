"""GLR experiment: accuracy, total generation steps and output length vs latent budget.

From a reasoning zoo model (``config.model``), on arithmetic chains of ``config.steps``
two-digit steps:

* ``cot``: the zoo model decoding its chain (explicit CoT, no fine-tuning);
* ``no_cot``: the zoo model fine-tuned to write the answer right after the prompt, for
  as many updates as each latent method gets;
* ``glr`` and ``coconut``: fine-tuned through the curriculum stages ``k = 0..steps``
  (stage ``k`` replaces the first ``k`` chain steps by ``k`` latent steps), evaluated
  after each stage at budget ``k``;
* shortcut rules (majority answer, first operand, the last operation alone, the sum of
  the operands with every sign ``+``) as no-reasoning baselines.

Per method and budget: accuracy (with its standard error), mean explicit output length
(tokens before EOS), total generation steps (latent steps + explicit tokens, EOS
included) and the output's excess over the reference continuation (negative: shorter
than the chain text the budget leaves to write; the shortening without a length
objective).

  python -m experiments.glr --config=configs/glr.py:default --workdir=/tmp/glr
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np
from absl import logging
from flax import nnx

from configs.glr import get_config
from lab import launch, outputs, zoo
from lab.config import check
from lab.data.synthetic.arithmetic import arithmetic, parse_answer
from lab.methods import glr

METHODS = ("cot", "no_cot", "glr", "coconut")
SHORTCUTS = ("majority", "first_operand", "last_operation", "unsigned_sum")

# Rules of the claims and the regime (fixed before the default run).
FEWER_STEPS = 0.75     # "substantially fewer": total steps at most this fraction of CoT's
ACC_TOL = 0.05         # ... at an accuracy no more than this below CoT's
MIN_GAIN = 0.05        # a gain worth the name, and beyond 2 standard errors
SHORTER_BY = 1.0       # emergent shortening: output this many tokens below the reference
COT_GAP = 0.2          # regime: CoT this far above no CoT
COT_RANGE = (0.2, 0.95)  # regime: CoT can do the task, not perfectly
SHORTCUT_MAX = 0.1     # regime: shortcut rules stay under this accuracy


def _checks():
    return {"model": (lambda v: v.startswith("cot-"), "a reasoning zoo model (cot-*)"),
            "steps": (lambda v: 1 <= v <= 6, "an int in [1, 6]"),
            "n_train": (lambda v: v >= 8, ">= 8"), "n_eval": (lambda v: v >= 4, ">= 4"),
            "stage_steps": (lambda v: v >= 1, ">= 1"), "batch_size": (lambda v: v >= 1, ">= 1"),
            "learning_rate": (lambda v: v > 0, "> 0"),
            "warmup_steps": (lambda v: v >= 0, ">= 0"), "margin": (lambda v: v >= 0, ">= 0"),
            "anchor_weight": (lambda v: v >= 0, ">= 0"), "eval_batch": (lambda v: v >= 1, ">= 1"),
            "head_hidden": (lambda v: v >= 1, ">= 1")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def problems(config):
    """``(train, eval)`` datasets: held-out prompts never occur in training."""
    train = arithmetic(config.n_train, config.seed, steps=config.steps, digits=2)
    seen = set(train["prompt"])
    pool = arithmetic(4 * config.n_eval, config.seed + 7919, steps=config.steps, digits=2)
    keep = [i for i, p in enumerate(pool["prompt"]) if p not in seen][:config.n_eval]
    return train, pool.select(keep)


def shortcuts(train, ev) -> dict:
    """Accuracy of the no-reasoning rules on the evaluation problems."""
    majority = collections.Counter(train["answer"]).most_common(1)[0][0]
    rules = {
        "majority": lambda o, p: int(majority),
        "first_operand": lambda o, p: o[0],
        "last_operation": lambda o, p: o[-2] + o[-1] if p[-1] == "+" else o[-2] - o[-1],
        "unsigned_sum": lambda o, p: sum(o),
    }
    truth = np.array([int(a) for a in ev["answer"]])
    out = {}
    for name, rule in rules.items():
        pred = np.array([rule(o, p) for o, p in zip(ev["operands"], ev["ops"], strict=True)])
        out[name] = _acc(pred == truth)
    return out


def _acc(correct) -> dict:
    c = np.asarray(correct, float)
    return {"accuracy": float(c.mean()), "se": float(c.std() / math.sqrt(max(len(c), 1)))}


def evaluate(model, head, tok, ev, *, budget: int, max_budget: int, mode: str,
             batch: int, max_new: int) -> dict:
    """Greedy accuracy, output length, total steps and excess over the reference
    continuation at latent budget ``budget``."""
    ids = np.array([tok.encode(p, add_bos=True) for p in ev["prompt"]], np.int32)
    n = len(ids)
    texts, lengths = [], []
    for s in range(0, n, batch):
        chunk = ids[s:s + batch]
        m = len(chunk)
        if m < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - m, 0)])
        out = glr.latent_generate(model, head, chunk, np.full(batch, chunk.shape[1]),
                                  latent_steps=budget, max_latent_steps=max_budget, mode=mode,
                                  max_new_tokens=max_new, eos_id=tok.eos_id, pad_id=tok.pad_id)
        toks, lens = np.asarray(out.tokens)[:m], np.asarray(out.lengths)[:m]
        for row, ln in zip(toks, lens, strict=True):
            row = row[:ln].tolist()
            ended = bool(row) and row[-1] == tok.eos_id
            texts.append(tok.decode(row[:-1] if ended else row))
            lengths.append(ln)
    lengths = np.asarray(lengths)
    explicit = np.array([len(tok.encode(t)) for t in texts])
    ref = np.array([len(tok.encode(glr.continuation(c, budget))) for c in ev["completion"]])
    truth = [int(a) for a in ev["answer"]]
    correct = [parse_answer(t) == a for t, a in zip(texts, truth, strict=True)]
    diff = explicit - ref
    return {**_acc(correct), "latent": budget, "output_len": float(explicit.mean()),
            "total_steps": float(budget + lengths.mean()),
            "excess": float(diff.mean()),
            "excess_se": float(diff.std() / math.sqrt(max(len(diff), 1))),
            "sample": texts[0]}


def _gap(a: dict, b: dict) -> tuple[float, float]:
    return a["accuracy"] - b["accuracy"], math.hypot(a["se"], b["se"])


def claims(table: dict) -> list:
    """The paper's claims, decided on the measured table (``{method: [row per budget]}``)."""
    cot, no_cot = table["cot"][0], table["no_cot"][0]
    g, c = table["glr"], table["coconut"]
    top = g[-1]
    short = top["total_steps"] <= FEWER_STEPS * cot["total_steps"]
    level = top["accuracy"] >= cot["accuracy"] - ACC_TOL
    gain, se = _gap(top, no_cot)
    diffs = [_gap(a, b) for a, b in zip(g[1:], c[1:], strict=True)]
    mean_d = float(np.mean([d for d, _ in diffs])) if diffs else 0.0
    mean_se = float(math.sqrt(sum(s * s for _, s in diffs)) / max(len(diffs), 1))
    emerg = [r["excess"] for r in g[1:]]
    worst = max(g[1:], key=lambda r: r["excess"]) if len(g) > 1 else top
    emergent = len(g) > 1 and all(r["excess"] <= -SHORTER_BY and r["excess"] < -2 * r["excess_se"]
                                  for r in g[1:])
    return [
        outputs.claim("Replacing early explicit reasoning with latent steps reaches correct "
                      "answers with substantially fewer total generation steps",
                      f"GLR at budget {top['latent']}: total steps / CoT's (<= {FEWER_STEPS}) "
                      f"and accuracy - CoT's (>= -{ACC_TOL})",
                      {"steps_ratio": top["total_steps"] / cot["total_steps"],
                       "accuracy_gap": top["accuracy"] - cot["accuracy"]}, short and level),
        outputs.claim("The continuous latent steps carry reasoning: GLR with every chain step "
                      "latent beats answering directly",
                      f"GLR at budget {top['latent']} - no-CoT accuracy (>= {MIN_GAIN}, "
                      "> 2 SE)", {"gain": gain, "se": se}, gain >= MIN_GAIN and gain > 2 * se),
        outputs.claim("Anchored geometric latents beat Coconut's fed-back hidden states at "
                      "the same latent budget",
                      f"mean GLR - Coconut accuracy over budgets 1..{top['latent']} "
                      f"(>= {MIN_GAIN}, > 2 SE)", {"gain": mean_d, "se": mean_se},
                      mean_d >= MIN_GAIN and mean_d > 2 * mean_se),
        outputs.claim("Geometric latent reasoning shortens generations without a length "
                      "objective (beyond the chain steps it replaces)",
                      f"GLR's output length - the reference continuation's, every budget >= 1 "
                      f"(<= -{SHORTER_BY} tokens, beyond 2 SE)",
                      {"excess_by_budget": emerg, "least_shortened": worst["latent"]},
                      bool(emergent)),
    ]


def regime_checks(table: dict, short: dict) -> list:
    """Whether latent steps have something to replace: CoT well above no CoT, CoT below
    perfect, the shortcut rules near chance."""
    cot, no_cot = table["cot"][0]["accuracy"], table["no_cot"][0]["accuracy"]
    best = max(short, key=lambda k: short[k]["accuracy"])
    lo, hi = COT_RANGE
    return [
        outputs.regime(f"explicit CoT is well above no CoT (by >= {COT_GAP})",
                       {"cot": cot, "no_cot": no_cot}, cot - no_cot >= COT_GAP),
        outputs.regime(f"explicit CoT solves the task but not perfectly ({lo} <= acc <= {hi})",
                       cot, lo <= cot <= hi),
        outputs.regime(f"shortcut rules stay under accuracy {SHORTCUT_MAX} (best: {best})",
                       short[best]["accuracy"], short[best]["accuracy"] < SHORTCUT_MAX),
    ]


def _fit(base, config, train, mode: str, *, k_stages, text_len: int, evaluate_at=None):
    """Fine-tunes a copy of ``base`` (and a head) through ``k_stages`` (``(latent steps,
    chain steps dropped from the text)`` pairs), ``stage_steps * (steps + 1)`` updates in
    all, split evenly; returns the rows of ``evaluate_at(model, head, k)`` after each
    stage and the loss history."""
    model = nnx.clone(base)
    head = glr.TransitionHead(base.config.d_model, config.head_hidden, rngs=nnx.Rngs(config.seed))
    total = config.stage_steps * (config.steps + 1)
    per_stage = total // len(k_stages)
    tok = zoo.load(config.model, progress=False)[1]
    rows, history = [], []
    for k, drop in k_stages:
        # a fresh optimizer and schedule per stage, as Coconut resets its optimizer
        opt = glr.make_optimizer(model, head, config.learning_rate, per_stage,
                                 config.warmup_steps)
        data = glr.stage_data(tok, train["prompt"], train["completion"], drop, text_len,
                              n_anchors=config.steps)
        history += glr.train_stage(model, head, opt, data, k=k, max_k=config.steps, mode=mode,
                                   steps=per_stage, batch_size=config.batch_size,
                                   seed=config.seed, anchor_weight=config.anchor_weight,
                                   margin=config.margin)
        if evaluate_at is not None:
            rows.append(evaluate_at(model, head, k))
    return rows, history


def run(config, workdir: str) -> dict:
    """Fine-tunes and evaluates every method; writes results.json, report.md and a plot."""
    check_config(config)
    started = time.time()
    base, tok = zoo.load(config.model, progress=False)
    train, ev = problems(config)
    n = config.steps
    text_len = max(len(tok.encode(c, add_eos=True)) for c in train["completion"]) + 1
    max_new = min(text_len + 8, base.config.max_len - len(tok.encode(ev["prompt"][0], True))
                  - n - 1)
    dummy = glr.TransitionHead(base.config.d_model, config.head_hidden, rngs=nnx.Rngs(0))

    def at(mode):
        return lambda model, head, k: evaluate(model, head, tok, ev, budget=k, max_budget=n,
                                               mode=mode, batch=config.eval_batch,
                                               max_new=max_new)

    table, seconds, histories = {}, {}, {}
    t0 = time.time()
    table["cot"] = [at("coconut")(base, dummy, 0)]
    seconds["cot"] = time.time() - t0
    stages = [(k, k) for k in range(n + 1)]
    for mode in ("glr", "coconut"):
        t0 = time.time()
        table[mode], histories[mode] = _fit(base, config, train, mode, k_stages=stages,
                                            text_len=text_len, evaluate_at=at(mode))
        seconds[mode] = time.time() - t0
        logging.info("glr %s: accuracy by budget %s (%.0f s)", mode,
                     [round(r["accuracy"], 3) for r in table[mode]], seconds[mode])
    t0 = time.time()
    table["no_cot"], histories["no_cot"] = _no_cot(base, config, train, tok, ev, text_len,
                                                   max_new)
    seconds["no_cot"] = time.time() - t0
    short = shortcuts(train, ev)
    results = {"table": table, "shortcuts": short, "claims": claims(table),
               "regime": regime_checks(table, short), "seconds": seconds,
               "final_loss": {m: h[-1] for m, h in histories.items() if h},
               "total_seconds": time.time() - started}
    plots = [_plot(table, workdir)]
    report = ("## Accuracy, total generation steps and output length by latent budget\n\n"
              f"{config.model} on {n}-step two-digit chains ({config.n_eval} held-out "
              f"problems, greedy). latent: latent steps before the text; output_len: explicit "
              "tokens before EOS; total_steps: latent steps + explicit tokens (EOS included); "
              "excess: output_len minus the reference continuation's length at that budget "
              "(negative = shorter than the chain text left to write). GLR and Coconut get "
              f"{config.stage_steps} updates per curriculum stage, no CoT "
              f"{config.stage_steps * (n + 1)} updates, CoT none.\n\n"
              + outputs.markdown_table(main_table(results),
                                       ["method", "latent", "accuracy", "se", "output_len",
                                        "total_steps", "excess"])
              + "\n## Shortcut rules\n\n"
              + outputs.markdown_table([{"rule": k, **v} for k, v in short.items()])
              + f"\nPreset `{config.preset}`, total {results['total_seconds']:.0f} s "
              f"(per method: {', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}).\n")
    return outputs.write_outputs(workdir, name="glr", config=config, results=results,
                                 report=report, plots=plots)


def _no_cot(base, config, train, tok, ev, text_len, max_new):
    """Fine-tunes a copy of ``base`` to answer right after the prompt (the text drops every
    chain step, no latent step) for as many updates as a latent method, and evaluates it;
    its reference continuation is the answer line alone. Returns ``([row], history)``."""
    def at(model, head, k):
        row = evaluate(model, head, tok, ev, budget=0, max_budget=config.steps,
                       mode="coconut", batch=config.eval_batch, max_new=max_new)
        ref = [len(tok.encode(glr.continuation(c, config.steps))) for c in ev["completion"]]
        return dict(row, excess=float(row["output_len"] - np.mean(ref)))

    return _fit(base, config, train, "coconut", k_stages=[(0, config.steps)],
                text_len=text_len, evaluate_at=at)


def main_table(results) -> list[dict]:
    """One row per method and latent budget: accuracy (SE), output length, total steps."""
    rows = []
    for method in METHODS:
        for r in results["table"].get(method, []):
            rows.append({"method": method, "latent": r["latent"], "accuracy": r["accuracy"],
                         "se": r["se"], "output_len": r["output_len"],
                         "total_steps": r["total_steps"], "excess": r["excess"]})
    return rows


def _plot(table: dict, workdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for method in METHODS:
        rows = table.get(method, [])
        steps = [r["total_steps"] for r in rows]
        acc = [r["accuracy"] for r in rows]
        style = "o-" if len(rows) > 1 else "s"
        axes[0].plot(steps, acc, style, label=method)
        axes[1].plot([r["latent"] for r in rows], [r["output_len"] for r in rows], style,
                     label=method)
    axes[0].set_xlabel("total generation steps")
    axes[0].set_ylabel("accuracy")
    axes[1].set_xlabel("latent budget")
    axes[1].set_ylabel("explicit output length")
    axes[0].legend(fontsize=7)
    return outputs.save_figure(fig, workdir, "glr.png")


if __name__ == "__main__":
    launch.main(run)
