"""TCR experiment: accuracy per question type of TCR-Agent, TCR-Former, the same-size plain
Transformer and the same-size Transformer with CoT on TempoCausal stories, beside the
shortcut heuristics and chance, with regime checks and the paper's claims.

- TCR-Agent (:mod:`lab.methods.tcr.agent`): strict parse, symbolic do() / truncation;
  answers "unparsed" on stories it cannot read (counted wrong in its accuracy; its
  coverage and its accuracy on what it parses are reported beside it);
- TCR-Former (:mod:`lab.methods.tcr.former`): causal-topological layout and mask,
  learned temporal-span bias;
- plain: the same Transformer on the narrative as told, no mask or bias;
- cot: the same Transformer trained to write the trace (the causes of X, its effects,
  the options' start times, or the events truncated with X) before the answer,
  decoded greedily.

The three neural models are one :mod:`lab.zoo.bundle` (``tcr-models``, keyed by the
data, model and training settings): shipped with Lab for the ``default`` preset, else
cached, else trained here. Scores carry standard errors over evaluation stories
(``sqrt(p (1 - p) / n)``); a difference's SE is ``sqrt(se_a^2 + se_b^2)``.

  python -m experiments.tcr --config=configs/tcr.py:default --workdir=/tmp/tcr
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np
from absl import logging
from flax import nnx

from configs.tcr import get_config
from lab import launch, outputs
from lab.config import check
from lab.data.synthetic.tempocausal import SHORTCUTS, TEMPOCAUSAL_TYPES, shortcut_baselines
from lab.data.synthetic.tempocausal import tempocausal as generate
from lab.methods.tcr import agent, training
from lab.methods.tcr.former import TCRFormer, WordVocab, encode
from lab.nn import TransformerConfig

MODELS = ("agent", "former", "plain", "cot")
NEURAL = ("former", "plain", "cot")
DEEP = ("intervention", "counterfactual")  # the "deep causal deduction" question types

# Rules of the claims and the regime (fixed before the default run).
MIN_GAIN = 0.03          # a gain worth the name, and beyond 2 standard errors
AGENT_EXACT = 0.999      # the agent is exact on what it parses
MIN_COVERAGE = 0.5       # the agent parses most stories
AGENT_OVER_SHORTCUT = 0.2
CEILING = 0.95           # the plain model leaves room on some type
SHORTCUT_TOL = 0.12      # every shortcut within this of chance


def _checks():
    pos = (lambda v: v > 0, "a positive number")
    return {"impl": (lambda v: v in ("", "xla", "pallas"), '"", "xla" or "pallas"'),
            "data.n_train": (lambda v: v >= 8, "an int >= 8"),
            "data.n_eval": (lambda v: v >= 10, "an int >= 10"),
            "data.paraphrase": (lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
            "data.n_shortcut": (lambda v: v >= 8, "an int >= 8"),
            "model.d_model": pos, "model.n_layers": pos, "model.n_heads": pos,
            "model.length": (lambda v: v >= 16, "an int >= 16 (tokens per story)"),
            "model.head_dim": (lambda v: v > 0 and v % 2 == 0, "a positive even int"),
            "model.d_ff": pos, "model.span_clip": pos, "train.steps": pos, "train.batch": pos,
            "first.steps": (lambda v: v >= 0, "an int >= 0 (0: no easy stage)"),
            "first.question_types": (lambda v: len(v) > 0 and set(v) <= set(TEMPOCAUSAL_TYPES),
                                     f"a non-empty subset of {TEMPOCAUSAL_TYPES}"),
            "train.learning_rate": pos, "cot_max_trace": pos}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _score(hits) -> dict:
    hits = np.asarray(hits, float)
    p = float(hits.mean()) if hits.size else float("nan")
    return {"score": p, "se": math.sqrt(max(p * (1 - p), 0.0) / max(hits.size, 1)),
            "n": int(hits.size)}


def _per_type(hits, qtypes) -> dict:
    out = {qt: _score(hits[qtypes == qt]) for qt in TEMPOCAUSAL_TYPES if (qtypes == qt).any()}
    out["all"] = _score(hits)
    out["deep"] = _score(hits[np.isin(qtypes, DEEP)])
    return out


def _model_config(config, vocab_size: int) -> TransformerConfig:
    m = config.model
    return TransformerConfig(vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers,
                             n_heads=m.n_heads, n_kv_heads=m.n_heads, head_dim=m.head_dim,
                             d_ff=m.d_ff, max_len=m.length, attention_impl=config.impl or None)


def _model(config, kind: str, seed: int = 0) -> TCRFormer:
    return TCRFormer(_model_config(config, len(WordVocab())), former=kind == "former",
                     span_clip=config.model.span_clip, rngs=nnx.Rngs(seed))


def _stories(config, n: int, seed: int, d=None) -> list[dict]:
    d = d or config.data
    kw = {"question_types": tuple(d.question_types)} if "question_types" in d else {}
    return generate(n, seed=seed, n_events=tuple(d.n_events), n_links=tuple(d.n_links),
                    n_distractors=tuple(d.n_distractors), paraphrase=d.paraphrase,
                    **kw).to_list()


def _encode(config, rows, vocab, kind: str):
    return encode(rows, vocab, length=config.model.length,
                  layout="topological" if kind == "former" else "narrative",
                  cot=kind == "cot", former=kind == "former",
                  span_clip=config.model.span_clip)


def _stories_sha256(config, n: int = 64) -> str:
    """SHA-256 of the first ``n`` training and easy-stage stories (their prompts and
    completions): a changed story generator changes the bundle's key, so shipped models
    trained on the old stories are not used for the new ones (generating all
    ``data.n_train`` stories only to key them would cost minutes)."""
    h = hashlib.sha256()
    rows = _stories(config, min(n, config.data.n_train), config.seed)
    if config.first.steps:
        rows += _stories(config, n, config.seed + 3000, config.first)
    for r in rows:
        h.update((r["prompt"] + r["completion"] + "\0").encode())
    return h.hexdigest()[:16]


def _recipe(config) -> dict:
    """Everything that decides the trained models (the bundle's key)."""
    return {"seed": config.seed, "data": config.data.to_dict(), "model": config.model.to_dict(),
            "first": config.first.to_dict(), "train": config.train.to_dict(),
            "vocab": WordVocab().words, "stories_sha256": _stories_sha256(config), "format": 1}


def _train_models(config):
    """Trains TCR-Former, plain and CoT on the same stories, steps, batch and learning rate:
    first ``first.steps`` on the easy stage (``first``: its own question types and story
    sizes, one story per example), then ``train.steps`` on ``data.n_train`` training
    stories (seed ``config.seed``); ``(modules, metrics)``."""
    vocab = WordVocab()
    t0 = time.time()
    train = _stories(config, config.data.n_train, config.seed)
    first = config.first
    easy = (_stories(config, first.steps * config.train.batch, config.seed + 3000, first)
            if first.steps else [])
    metrics = {"losses": {}, "seconds": {"data": time.time() - t0}}
    modules = {}
    for kind in NEURAL:
        t0 = time.time()
        model = _model(config, kind, config.seed)
        fit = dict(batch=config.train.batch, learning_rate=config.train.learning_rate)
        if easy:
            training.fit(model, _encode(config, easy, vocab, kind), steps=first.steps,
                         seed=config.seed + 1, **fit)
        hist = training.fit(model, _encode(config, train, vocab, kind),
                            steps=config.train.steps, seed=config.seed, **fit)
        modules[kind] = model
        metrics["losses"][kind] = {"first": float(np.mean(hist[:10])),
                                   "last": float(np.mean(hist[-10:]))}
        metrics["seconds"][kind] = time.time() - t0
        logging.info("tcr: trained %s in %.0f s (loss %.3f -> %.3f)", kind,
                     metrics["seconds"][kind], metrics["losses"][kind]["first"],
                     metrics["losses"][kind]["last"])
    return modules, metrics


def load_models(config, source: str | None = None):
    """The three trained Transformers as a :class:`lab.zoo.bundle.Bundle` (shipped, cached
    or trained now)."""
    from lab.zoo import bundle

    return bundle.load("tcr-models", _recipe(config), lambda: _train_models(config),
                       lambda: {k: _model(config, k) for k in NEURAL}, source=source)


def run(config, workdir: str) -> dict:
    """Runs the agent, loads (or trains) the three Transformers, evaluates everything per
    question type; writes results.json, report.md and a plot to ``workdir``; returns the
    results."""
    check_config(config)
    started = time.time()
    evals = _stories(config, config.data.n_eval, config.seed + 1000)
    qtypes = np.array([r["question_type"] for r in evals])
    vocab = WordVocab()
    table, seconds = {}, {}

    t0 = time.time()
    said = np.array([agent.answer(r["prompt"]) for r in evals])
    answers = np.array([r["answer"] for r in evals])
    parsed = said != agent.UNPARSED
    table["agent"] = _per_type(said == answers, qtypes)
    agent_parsed = {"coverage": float(parsed.mean()),
                    **{k: v for k, v in _per_type((said == answers)[parsed],
                                                  qtypes[parsed]).items()}}
    seconds["agent"] = time.time() - t0

    t0 = time.time()
    models = load_models(config)
    seconds["models"] = time.time() - t0
    for kind in NEURAL:
        t0 = time.time()
        enc_eval = _encode(config, evals, vocab, kind)
        model = models.modules[kind]
        if kind == "cot":
            pred, _ = training.predict_cot(model, enc_eval, vocab,
                                           max_trace=config.cot_max_trace)
        else:
            pred = training.predict(model, enc_eval)
        table[kind] = _per_type(pred == enc_eval.answer, qtypes)
        seconds[f"eval_{kind}"] = time.time() - t0
        logging.info("tcr %s: accuracy %.3f", kind, table[kind]["all"]["score"])

    # the heuristics fit nothing but the majority answer position, so they are measured on
    # stories of their own, more than the evaluation set (their check has no SE allowance)
    shortcuts = shortcut_baselines(_stories(config, config.data.n_shortcut, config.seed + 2000),
                                   seed=config.seed)
    cfg = _model_config(config, len(vocab))
    results = {"table": table, "agent_parsed": agent_parsed, "shortcuts": shortcuts,
               "losses": models.metrics["losses"], "seconds": seconds,
               "train_seconds": models.metrics["seconds"],
               "models": {"source": models.source, "key": models.key},
               "length": config.model.length, "params": cfg.num_params()}
    results["claims"] = claims(results)
    results["regime"] = regime_checks(results)
    results["seconds"]["total"] = time.time() - started
    plots = [_plot(results, workdir)]
    return outputs.write_outputs(workdir, name="tcr", config=config, results=results,
                                 report=_report(results, config), plots=plots)


def _diff(a: dict, b: dict) -> tuple[float, float]:
    return a["score"] - b["score"], math.sqrt(a["se"] ** 2 + b["se"] ** 2)


def _gain(a: dict, b: dict) -> bool:
    d, se = _diff(a, b)
    return d >= MIN_GAIN and d > 2 * se


def claims(results: dict) -> list[dict]:
    """The paper's claims, decided by rules on the measured table."""
    t, ap, sc = results["table"], results["agent_parsed"], results["shortcuts"]
    f_p = _diff(t["former"]["all"], t["plain"]["all"])[0]
    f_c = _diff(t["former"]["deep"], t["cot"]["deep"])[0]
    deep_parsed = min(ap.get(q, {"score": 1.0})["score"] for q in DEEP)
    best_short = max(sc["all"][name] for name in SHORTCUTS)
    agent_gap = t["agent"]["all"]["score"] - best_short
    return [
        outputs.claim("TCR-Former is more accurate than the equal-size Transformer without "
                      "the causal-topological mask and span bias",
                      f"overall accuracy former - plain (>= {MIN_GAIN} and > 2 SE)", f_p,
                      _gain(t["former"]["all"], t["plain"]["all"])),
        outputs.claim("TCR-Agent is exact on the interventions and counterfactuals it can "
                      "parse, and parses most stories",
                      f"min accuracy on parsed intervention/counterfactual stories (>= "
                      f"{AGENT_EXACT}, coverage >= {MIN_COVERAGE})", deep_parsed,
                      deep_parsed >= AGENT_EXACT and ap["coverage"] >= MIN_COVERAGE),
        outputs.claim("CoT does not bring deep causal deduction; TCR-Former does: on "
                      "interventions and counterfactuals TCR-Former beats the CoT model",
                      f"deep-type accuracy former - cot (>= {MIN_GAIN} and > 2 SE)", f_c,
                      _gain(t["former"]["deep"], t["cot"]["deep"])),
        outputs.claim("TCR-Agent surpasses the training-free baselines",
                      f"overall accuracy agent - best shortcut (>= {AGENT_OVER_SHORTCUT})",
                      agent_gap, agent_gap >= AGENT_OVER_SHORTCUT),
    ]


def regime_checks(results: dict) -> list[dict]:
    """Is this a run where the comparison can show: the plain model has learnt something
    but not everything on some type, the agent reads most stories, no shortcut works."""
    t, sc = results["table"], results["shortcuts"]
    room = []
    for qt in TEMPOCAUSAL_TYPES:
        p, chance = t["plain"].get(qt), sc.get(qt, {}).get("chance")
        if p is not None and chance is not None and chance + 2 * p["se"] < p["score"] < CEILING:
            room.append(qt)
    gap = max(abs(sc[qt][name] - sc[qt]["chance"]) for qt in sc for name in SHORTCUTS)
    cov = results["agent_parsed"]["coverage"]
    return [
        outputs.regime(f"the plain Transformer is above chance (by 2 SE) and below {CEILING} "
                       "on at least one question type", len(room), bool(room)),
        outputs.regime(f"TCR-Agent parses at least {MIN_COVERAGE} of the stories", cov,
                       cov >= MIN_COVERAGE),
        outputs.regime(f"every shortcut heuristic is within {SHORTCUT_TOL} of chance on every "
                       "question type", gap, gap <= SHORTCUT_TOL),
    ]


def main_table(results) -> list[dict]:
    """The results page's table: accuracy (and SE) per question type of every model, then
    the best shortcut and chance."""
    rows = []
    types = [*TEMPOCAUSAL_TYPES, "all"]
    for name, per in results["table"].items():
        rows.append({"entry": name, **{qt: per[qt]["score"] for qt in types if qt in per},
                     "se(all)": per["all"]["se"]})
    sc = results["shortcuts"]
    rows.append({"entry": "best shortcut", **{qt: max(sc[qt][s] for s in SHORTCUTS)
                                               for qt in types if qt in sc}})
    rows.append({"entry": "chance", **{qt: sc[qt]["chance"] for qt in types if qt in sc}})
    return rows


def _report(results, config) -> str:
    types = [*TEMPOCAUSAL_TYPES, "all"]
    rows = main_table(results)
    ap = results["agent_parsed"]
    parsed_row = [{"entry": "agent (parsed stories only)", "coverage": ap["coverage"],
                   **{qt: ap[qt]["score"] for qt in types if qt in ap}}]
    sc = results["shortcuts"]
    short_rows = [{"shortcut": s, **{qt: sc[qt][s] for qt in types if qt in sc}}
                  for s in (*SHORTCUTS, "chance")]
    loss_rows = [{"model": k, "loss first 10": v["first"], "loss last 10": v["last"],
                  "train seconds": results["train_seconds"].get(k)}
                 for k, v in results["losses"].items()]
    return ("## Accuracy per question type\n\n"
            "agent: TCR-Agent (strict parser + intervention engine; 'unparsed' counts as "
            "wrong); former: TCR-Former; plain: the same Transformer without mask/bias; "
            "cot: the same Transformer writing its reasoning trace first. All neural models "
            f"have {results['params']} parameters and {config.train.steps} training steps.\n\n"
            + outputs.markdown_table(rows, ["entry", *types, "se(all)"]) +
            "\n## TCR-Agent on the stories it parses\n\n"
            + outputs.markdown_table(parsed_row, ["entry", "coverage", *types]) +
            f"\n## Shortcut heuristics ({config.data.n_shortcut // 2} held-out stories of "
            f"{config.data.n_shortcut} drawn for them)\n\n"
            + outputs.markdown_table(short_rows, ["shortcut", *types]) +
            "\n## Training\n\n"
            f"{config.data.n_train} training stories; the models are bundle "
            f"`{results['models']['key']}` ({results['models']['source']}).\n\n"
            + outputs.markdown_table(loss_rows) +
            f"\nPreset `{config.preset}`, total {results['seconds']['total']:.0f} s.\n")


def _plot(results, workdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    types = [*TEMPOCAUSAL_TYPES, "all"]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    x = np.arange(len(types))
    width = 0.8 / len(MODELS)
    for i, name in enumerate(MODELS):
        per = results["table"][name]
        ax.bar(x + width * i, [per.get(qt, {"score": 0})["score"] for qt in types], width,
               yerr=[per.get(qt, {"se": 0})["se"] for qt in types], label=name)
    sc = results["shortcuts"]
    ax.scatter(x + 0.4 - width / 2, [sc.get(qt, {}).get("chance", np.nan) for qt in types],
               marker="_", s=400, color="k", label="chance")
    ax.set_xticks(x + 0.4 - width / 2, types)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=5)
    return outputs.save_figure(fig, workdir, "tcr.png")


if __name__ == "__main__":
    launch.main(run)
