"""TAR's VLM experiment: fine-tuned per task group against not fine-tuned, and the
multi-task ablation that adds task groups one by one.

On a synthetic TAR split written in the public schema and read back with the loader, a
small VLM (lab.methods.tar.vlm) is fine-tuned on the answers of

- ``qa``: the question-answering group (bcq, bcq_openended, mcq, mcq_openended, open_qa);
- ``qa+temporal``: and the temporal-reasoning group (temporal_localization,
  temporal_description, causal_linkage);
- ``qa+temporal+scene``: and scene understanding (scene_description), every task;
- ``no_video``: every task with every frame blanked (the same model, data and updates
  without the pixels: what the answers' words and the questions alone teach);

every run from the same pretrained model (dense perception targets only: what the actor
under each visual token is doing; no TAR question or answer) with the same updates, batch
and schedule. By default each answer is trained after a short reasoning trace that names
the video's event (``<think> a stalled car</think> Yes``; the evaluator drops the span),
and mcq is answered with the option's text. ``zero_shot`` is that pretrained model before
fine-tuning. The majority and question-only shortcuts (lab.methods.tar.shortcuts) stand beside them.
Every predictor runs through ``tar.predict`` and its submission CSV is written, read back
and scored by ``tar.evaluate``.

  python -m experiments.tar --config=configs/tar.py:default --workdir=/tmp/tar_vlm
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

from configs.tar import GROUP_ORDER, get_config
from lab import launch, outputs
from lab.config import check
from lab.methods import tar
from lab.methods.tar import shortcuts
from lab.methods.tar import vlm as tv

# Why the main job leaves this experiment out (experiments.reproduce reads it).
OUT_OF_MAIN_JOB = ("outside its regime at default: the pretrained model sees the anomalous "
                   "actors and the full model answers mcq above chance, but its bcq stays at "
                   "chance (docs/tar.md), and training its five models takes about 40 "
                   "minutes on two cores")

CHOICE_TASKS = ("bcq", "mcq")
SHORT = {"question_answering": "qa", "temporal_reasoning": "temporal",
         "scene_understanding": "scene"}
BASELINES = ("majority", "question_only")

# Rules of the claims and the regime (fixed before the default run).
SE_MULT = 2.0          # a difference counts when it exceeds this many paired standard errors
SEES_MARGIN = 0.1      # the full model beats its no-video twin on bcq / mcq by this
LOCALISE_MARGIN = 0.1  # and on temporal-localization mIoU, and every baseline, by this
FLOOR_MARGIN = 0.1     # regime: the full model's bcq / mcq accuracy above chance by this
CEILING = 0.97         # regime: ... and under this (room for the added groups to help)
BALANCE = (0.4, 0.6)   # regime: bcq's yes rate on the test split
PERCEIVE_MIN = 0.5     # regime: the pretrained model's recall of anomalous actors' tokens
ANOMALOUS_REGIONS = ("<stopped>", "<wrong_way>", "<jaywalker>")


def _checks():
    return {"train_videos": (lambda v: v >= 5, "an int >= 5"),
            "test_videos": (lambda v: v >= 5, "an int >= 5"),
            "n_frames": (lambda v: v >= 24, "an int >= 24 (events last up to 12 frames)"),
            "fps": (lambda v: v > 0, "a positive number"),
            "groups": (lambda v: len(v) >= 1 and len(set(v)) == len(v)
                       and set(v) <= set(GROUP_ORDER),
                       f"distinct task groups of {list(GROUP_ORDER)}"),
            "model.frames": (lambda v: 1 <= v <= 48, "an int in [1, 48]"),
            "model.d_model": (lambda v: v >= 32 and v % 32 == 0, "a multiple of 32"),
            "sft.steps": (lambda v: v >= 1, "an int >= 1"),
            "sft.batch": (lambda v: v >= 1, "an int >= 1"),
            "sft.learning_rate": (lambda v: v > 0, "a positive number"),
            "scorer_layers": (lambda v: v >= 0, "an int >= 0")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def runs(groups) -> dict[str, tuple[tuple[str, ...], bool]]:
    """``{run: (task groups trained on, blank frames)}``: the groups added one by one in
    ``groups``' order, then every group without the video."""
    out = {}
    for i in range(1, len(groups) + 1):
        out["+".join(SHORT[g] for g in groups[:i])] = (tuple(groups[:i]), False)
    out["no_video"] = (tuple(groups), True)
    return out


def full_run(groups) -> str:
    """The run trained on every group (with the video)."""
    return "+".join(SHORT[g] for g in groups)


def item_scores(predictions: dict, split, task: str) -> np.ndarray:
    """Each ``task`` item's score (accuracy 0/1, or temporal IoU) in ``split`` order."""
    kind = tar.TASK_METRIC[task]
    out = []
    for pos, it in enumerate(split):
        if it.task != task:
            continue
        p = predictions.get(it.key(pos))
        if kind == "interval":
            out.append(tar.metrics.mean_iou([p], [it.answer])["score"])
        else:
            out.append(tar.metrics.accuracy([p], [it.answer], kind, [it.question])["score"])
    return np.asarray(out, float)


def _choice(per_item: dict, name: str) -> np.ndarray:
    return np.concatenate([per_item[name][t] for t in CHOICE_TASKS])


def claims(table: dict, per_item: dict, groups) -> list:
    """The claims, decided on the measured table (``{predictor: evaluate() result}``) and
    the per-item scores (``{predictor: {task: [score]}}``)."""
    out = []
    full, qa = full_run(groups), full_run(groups[:1])
    a, b = _choice(per_item, full), _choice(per_item, "no_video")
    d, se = float(a.mean() - b.mean()), outputs.paired_se(a, b)
    out.append(outputs.claim(
        f"the fine-tuned model reads the video: on bcq and mcq its accuracy beats the same "
        f"model fine-tuned on the same data without frames by {SEES_MARGIN} and by "
        f"{SE_MULT:g} paired standard errors",
        f"accuracy {full} - no_video (bcq and mcq items)",
        {"gain": d, "se": se, full: float(a.mean()), "no_video": float(b.mean())},
        d >= SEES_MARGIN and d > SE_MULT * se))
    if "temporal_reasoning" in groups:
        loc = {p: table[p]["tasks"]["temporal_localization"]["score"]
               for p in (*BASELINES, "no_video")}
        best = max(loc, key=loc.get)
        mine = table[full]["tasks"]["temporal_localization"]["score"]
        out.append(outputs.claim(
            f"the fine-tuned model localises the anomaly: its temporal-localization mean IoU "
            f"beats the best of the shortcuts and the no-video model by {LOCALISE_MARGIN}",
            f"mIoU {full} - best baseline",
            {"gain": mine - loc[best], full: mine, "best": best, "best_iou": loc[best]},
            mine - loc[best] >= LOCALISE_MARGIN))
    if len(groups) > 1:
        accs = {r: float(_choice(per_item, r).mean())
                for r in (full_run(groups[:i]) for i in range(1, len(groups) + 1))}
        seq = list(accs.values())
        rising = all(y > x for x, y in zip(seq, seq[1:], strict=False))
        out.append(outputs.claim(
            "adding task groups one by one gives consistent gains on binary and "
            "multiple-choice QA at the same number of updates (the paper's ablation): "
            "bcq and mcq accuracy rises with every added group",
            "bcq and mcq accuracy per ablation step",
            {**accs, "gain_full_vs_qa": accs[full] - accs[qa],
             "se": outputs.paired_se(_choice(per_item, full), _choice(per_item, qa))},
            rising))
    return out


def regime_checks(table: dict, test_items, base_chance: dict, groups,
                  perception: dict) -> list:
    """What must hold for the claims to say anything: pretraining taught the model to see
    the anomalous actors (``perception``: :func:`lab.methods.tar.vlm.region_recall` of the
    pretrained model on the test videos), the full model learned the choice tasks above
    chance but not to the ceiling, and bcq is balanced."""
    full = full_run(groups)
    rare = {k: perception[k]["recall"] for k in ANOMALOUS_REGIONS}
    known = [v for v in rare.values() if not np.isnan(v)]
    seen = float(np.mean(known)) if known else 0.0   # no anomalous token in the test videos
    gaps = {t: table[full]["tasks"][t]["score"] - base_chance[t] for t in CHOICE_TASKS}
    accs = {t: table[full]["tasks"][t]["score"] for t in CHOICE_TASKS}
    bcq = [it.answer for it in test_items if it.task == "bcq"]
    yes = bcq.count("Yes") / max(len(bcq), 1)
    return [
        outputs.regime(f"pretraining taught the model to see anomalous actors: on the test "
                       f"videos its mean recall of {', '.join(ANOMALOUS_REGIONS)} tokens is "
                       f"at least {PERCEIVE_MIN}", {**rare, "mean": seen},
                       seen >= PERCEIVE_MIN),
        outputs.regime(f"the full model is above the floor: its bcq and mcq accuracy beat "
                       f"chance by {FLOOR_MARGIN}", gaps, min(gaps.values()) >= FLOOR_MARGIN),
        outputs.regime(f"the full model is not at the ceiling: its mean bcq / mcq accuracy is "
                       f"under {CEILING}", accs, float(np.mean(list(accs.values()))) < CEILING),
        outputs.regime(f"bcq is balanced: the test split's yes rate is in {list(BALANCE)}",
                       yes, BALANCE[0] <= yes <= BALANCE[1]),
    ]


def fine_tuning_items(config, train: dict) -> dict:
    """``{task: items}`` as the fine-tuning sees them: with ``config.trace`` each answer
    after a short reasoning trace naming its video's event (:func:`lab.methods.tar.vlm.
    with_trace`), with ``config.choice_text`` mcq answered with the option's text."""
    traces = tv.event_traces(train) if config.trace else {}
    return {t: tv.with_trace(items, traces, choice_text=config.choice_text)
            for t, items in train.items()}


def _recipe(config, tokenizer) -> dict:
    """Everything that determines the trained models (the bundle's key)."""
    return {"seed": config.seed, "train_videos": config.train_videos,
            "n_frames": config.n_frames, "fps": config.fps, "groups": list(config.groups),
            "model": config.model.to_dict(), "pretrain": config.pretrain.to_dict(),
            "sft": config.sft.to_dict(), "trace": config.trace,
            "choice_text": config.choice_text, "vocab": list(tokenizer.vocab), "format": 1}


def _shape(config) -> tv.VideoShape:
    return tv.VideoShape(frames=config.model.frames, patch_size=config.model.patch_size)


def _vlm_config(config, tokenizer):
    m = config.model
    return tv.model_config(tokenizer, _shape(config), d_model=m.d_model, n_layers=m.n_layers,
                           vision_layers=m.vision_layers)


def trained_models(config, tokenizer, train_items, load_videos) -> tuple[dict, dict]:
    """``({"pretrained": model, run: model}, info)``: the perception-pretrained model and
    the fine-tuned models of :func:`runs` (each fine-tuned from the pretrained one), from
    Lab's bundle store (``tar-vlm``, keyed by :func:`_recipe`) or trained now on
    ``train_items`` (``{task: items}`` as :func:`fine_tuning_items` writes them) and the
    frames and region targets ``load_videos()`` returns (read only when training)."""
    from flax import nnx

    from lab.zoo import bundle

    shape = _shape(config)
    vcfg = _vlm_config(config, tokenizer)
    plan = runs(tuple(config.groups))

    def train():
        info = {}
        videos, regions = load_videos()
        t0 = time.perf_counter()
        pre = tv.new_model(vcfg, config.seed)
        percept = [tar.Item("scene_description", v, "", "") for v in sorted(videos)]
        pre, history = tv.finetune(
            pre, tokenizer, shape, percept, videos,
            tv.FinetuneConfig(**config.pretrain.to_dict(), seed=config.seed,
                              answer_weight=0.0, region_weight=1.0), regions=regions)
        info["pretrained"] = {"videos": len(percept), "seconds": time.perf_counter() - t0,
                              "final": history[-1] if history else {}}
        models = {"pretrained": pre}
        for name, (groups, blank) in plan.items():
            tasks = {t for g in groups for t in tar.TASK_GROUPS[g]}
            items = [it for t in tar.TASKS if t in tasks for it in train_items[t]]
            sft = config.sft.to_dict()
            if blank:   # nothing to perceive without the pixels
                sft["region_weight"] = 0.0
            t0 = time.perf_counter()
            model, history = tv.finetune(nnx.clone(pre), tokenizer, shape, items, videos,
                                         tv.FinetuneConfig(**sft, seed=config.seed,
                                                           blank=blank), regions=regions)
            models[name] = model
            info[name] = {"items": len(items), "seconds": time.perf_counter() - t0,
                          "final": history[-1] if history else {}}
            logging.info("tar: fine-tuned %s on %d items (%.0f s)", name, len(items),
                         info[name]["seconds"])
        return models, {"runs": info}

    if not config.cache:
        models, info = train()
        return models, {"source": "trained", **info}

    def template():
        return {name: nnx.eval_shape(lambda: tv.new_model(vcfg, 0))
                for name in ("pretrained", *plan)}

    got = bundle.load("tar-vlm", _recipe(config, tokenizer), train, template)
    return got.modules, {"source": got.source, "key": got.key, **got.metrics}


def _videos(ids, media, shape, tokenizer) -> tuple[dict, dict]:
    """``({video_id: sampled frames}, {video_id: region targets})`` read from ``media``."""
    frames, regions = {}, {}
    for v in ids:
        whole = tar.load_frames(v, media)
        frames[v] = tv.sample_frames(whole, shape)
        regions[v] = tv.region_targets(whole, shape, tokenizer)
    return frames, regions


def run(config, workdir: str) -> dict:
    """Builds the split, pretrains and fine-tunes the models (or loads them), scores every
    predictor; writes results.json, report.md and one submission CSV per predictor to
    ``workdir``."""
    check_config(config)
    started = time.time()
    groups = tuple(config.groups)
    train, test, media = tar.build_splits(
        os.path.join(workdir, "data"), seed=config.seed, train_videos=config.train_videos,
        test_videos=config.test_videos, n_frames=config.n_frames, fps=config.fps)
    build_s = time.time() - started
    shape = _shape(config)
    sft_items = fine_tuning_items(config, train)
    tokenizer = tv.TarTokenizer.fit(s for items in sft_items.values() for it in items
                                    for s in (it.question, it.answer))
    train_ids = sorted({it.video_id for items in train.values() for it in items})
    t0 = time.time()
    models, sft_info = trained_models(config, tokenizer, sft_items,
                                      lambda: _videos(train_ids, media, shape, tokenizer))
    sft_s = time.time() - t0
    test_videos, test_regions = _videos(sorted({it.video_id for it in test}), media, shape,
                                        tokenizer)
    perception = tv.region_recall(models["pretrained"], tokenizer, shape, test_videos,
                                  test_regions)
    longest = int(max(tv.answer_lengths(tokenizer, items).max()
                      for items in sft_items.values()))
    scorer = (tar.BERTScorer(config.scorer_dir, config.scorer_layers or None)
              if config.scorer_dir else None)
    plan = runs(groups)
    fns = {"majority": shortcuts.fit_majority(train),
           "question_only": shortcuts.fit_question_only(train),
           "zero_shot": tv.predictor(models["pretrained"], tokenizer, shape,
                                     max_new_tokens=longest + 2),
           **{name: tv.predictor(models[name], tokenizer, shape, max_new_tokens=longest + 2,
                                 blank=plan[name][1]) for name in plan}}
    table, per_item, rows, cache = {}, {}, [], {}
    for name, fn in fns.items():
        t1 = time.time()
        preds = tar.predict(fn, test, media_root=media, frames_cache=cache)
        path = os.path.join(workdir, "submissions", f"{name}.csv")
        tar.write_submission(path, preds)
        preds = tar.read_submission(path, test)
        res = tar.evaluate(preds, test, scorer=scorer)
        res["seconds"] = time.time() - t1
        table[name] = res
        per_item[name] = {t: item_scores(preds, test, t)
                          for t in (*CHOICE_TASKS, "temporal_localization")}
        trained = ("-" if name in BASELINES else "perception" if name == "zero_shot"
                   else "perception, " + "+".join(SHORT[g] for g in plan[name][0]))
        rows.append({"predictor": name, "trained on": trained,
                     **{t: res["tasks"][t]["score"] for t in tar.TASKS},
                     **res["groups"], "aggregate": res["aggregate"],
                     "malformed": sum(r["malformed"] for r in res["tasks"].values())})
        logging.info("tar %s: aggregate %.3f (%.1f s)", name, res["aggregate"],
                     res["seconds"])
    base_chance = tar.metrics.choice_chance(test)
    per_group = _per_group(table, groups)
    results = {"table": table, "chance": base_chance, "per_group": per_group,
               "perception": perception,
               "split": {"train_items": sum(len(v) for v in train.values()),
                         "test_items": len(test), "train_videos": config.train_videos,
                         "test_videos": config.test_videos},
               "vocab_size": tokenizer.vocab_size, "sft": sft_info,
               "text_metric": "bertscore_f1" if scorer else "rouge_l",
               "claims": claims(table, per_item, groups),
               "regime": regime_checks(table, test, base_chance, groups, perception),
               "build_seconds": build_s, "sft_seconds": sft_s,
               "seconds": time.time() - started}
    report = _report(config, results, rows)
    return outputs.write_outputs(workdir, name="tar", config=config, results=results,
                                 report=report)


def _per_group(table: dict, groups) -> list[dict]:
    """Zero-shot against fine-tuned per task group: each group's score before any
    fine-tuning, without the group's tasks (the ablation step before it is added; none for
    the first), and with them (the step that adds it)."""
    out = []
    for i, g in enumerate(groups):
        added = full_run(groups[:i + 1])
        row = {"group": g, "zero_shot": table["zero_shot"]["groups"][g],
               "without the group": (table[full_run(groups[:i])]["groups"][g] if i else None),
               "fine-tuned": table[added]["groups"][g],
               "all groups": table[full_run(groups)]["groups"][g],
               "no_video": table["no_video"]["groups"][g]}
        out.append(row)
    return out


def _report(config, results, rows) -> str:
    metric = results["text_metric"]
    s = results["split"]
    return ("## A small VLM fine-tuned on a synthetic TAR split\n\n"
            f"Per task: bcq / mcq accuracy, temporal_localization mean IoU, open-ended tasks "
            f"{metric}; groups and aggregate are means over tasks. Chance: "
            + outputs.format_value(results["chance"]) + ".\n\n"
            + outputs.markdown_table(rows)
            + "\n### Zero-shot against fine-tuned, per task group\n\n"
            + outputs.markdown_table(results["per_group"])
            + "\nFine-tuning answers: "
            + ("after a short reasoning trace naming the video's event, `<think> ...</think>`, "
               "which the evaluator drops" if config.trace else "without a reasoning trace")
            + ("; mcq answered with the option's text, which the evaluator reads as its "
               "letter" if config.choice_text else "; mcq answered with the letter") + ".\n"
            + f"\n{s['test_items']} test items over {s['test_videos']} videos; "
            f"{s['train_items']} train items over {s['train_videos']} videos. Models: "
            f"{results['sft'].get('source')}"
            + (f" ({results['sft']['key']})" if "key" in results["sft"] else "")
            + f". Preset `{config.preset}`, total {results['seconds']:.0f} s (split "
            f"{results['build_seconds']:.0f} s, fine-tuning {results['sft_seconds']:.0f} s).\n")


def main_table(results: dict) -> list[dict]:
    """The results page's rows: every predictor per task group and in aggregate."""
    return [{"predictor": p, **r["groups"], "aggregate": r["aggregate"]}
            for p, r in results["table"].items()]



if __name__ == "__main__":
    launch.main(run)
