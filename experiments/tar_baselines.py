"""TAR evaluation harness end to end, with shortcut baselines as predictors.

On a synthetic split (lab.methods.tar.dataset), every predictor of
lab.methods.tar.shortcuts (majority, question-only, a single-frame nearest-centroid rule
on the first / middle / last frame, and the frame tracker) runs through
``lab.methods.tar.harness.predict`` and is scored by ``evaluate`` per task, per task
group and in aggregate. Its submission CSV is written and read back before scoring,
so the scores are those of the file on disk.

The VLM experiment of the TAR paper (zero-shot vs fine-tuned per task group, the
multi-task ablation), experiments/tar.py, calls the same harness with a VLM's predictor.

  python -m experiments.tar_baselines --config=configs/tar_baselines.py:default --workdir=/tmp/tar
"""

from __future__ import annotations

import os
import time

from absl import logging

from configs.tar_baselines import get_config
from lab import launch, outputs
from lab.config import check
from lab.methods import tar
from lab.methods.tar import shortcuts

SHORTCUTS = ("majority", "question_only", "first_frame", "middle_frame", "last_frame")
PREDICTORS = (*SHORTCUTS, "tracker")
CHOICE_TASKS = ("bcq", "mcq")

# Rules of the claims and the regime (fixed before the default run).
SHORTCUT_MARGIN = 0.1      # no shortcut beats chance by more than this on bcq / mcq
TRACKER_MIN_ACC = 0.95     # the labels are recoverable from the frames
TRACKER_MIN_IOU = 0.9
LOCALISE_MAX_FRAC = 0.6    # the best shortcut's mIoU is under this fraction of the tracker's
TEXT_MIN_GAIN = 0.1        # the tracker's open-ended score beats the best shortcut's by this
BALANCE = (0.4, 0.6)       # bcq's yes rate on the test split lies in this range
TEXT_TASKS = tuple(t for t in tar.TASKS if tar.TASK_METRIC[t] == "text")


def _checks():
    n = (lambda v: v >= 5, "an int >= 5")
    return {"train_videos": n, "test_videos": n,
            "n_frames": (lambda v: v >= 24, "an int >= 24 (events last up to 12 frames)"),
            "fps": (lambda v: v > 0, "a positive number"),
            "scorer_layers": (lambda v: v >= 0, "an int >= 0")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    return check(config, get_config, _checks())


def _text_score(res) -> float:
    return sum(res["tasks"][t]["score"] for t in TEXT_TASKS) / len(TEXT_TASKS)


def claims(table: dict, base_chance: dict) -> list:
    """The claims, decided on the measured table (``{predictor: evaluate() result}``)."""
    out = []
    gaps = {f"{p}/{t}": table[p]["tasks"][t]["score"] - base_chance[t]
            for p in SHORTCUTS for t in CHOICE_TASKS}
    worst = max(gaps, key=gaps.get)
    out.append(outputs.claim(
        f"no shortcut (majority, question-only, single-frame rules) beats chance by more than "
        f"{SHORTCUT_MARGIN} on bcq or mcq accuracy",
        "largest shortcut accuracy minus chance", {"gap": gaps[worst], "at": worst},
        gaps[worst] <= SHORTCUT_MARGIN))
    best_iou = max(table[p]["tasks"]["temporal_localization"]["score"] for p in SHORTCUTS)
    trk_iou = table["tracker"]["tasks"]["temporal_localization"]["score"]
    out.append(outputs.claim(
        f"temporal localization is not guessable: the best shortcut's mean IoU is under "
        f"{LOCALISE_MAX_FRAC} x the frame tracker's",
        "best shortcut mIoU / tracker mIoU",
        {"shortcut": best_iou, "tracker": trk_iou, "ratio": best_iou / max(trk_iou, 1e-9)},
        best_iou < LOCALISE_MAX_FRAC * trk_iou))
    best_text = max(_text_score(table[p]) for p in SHORTCUTS)
    trk_text = _text_score(table["tracker"])
    out.append(outputs.claim(
        f"the open-ended metric separates reading the video from guessing: the tracker's mean "
        f"score over the six open-ended tasks beats the best shortcut's by {TEXT_MIN_GAIN}",
        "tracker minus best shortcut, mean open-ended score",
        {"tracker": trk_text, "shortcut": best_text, "gain": trk_text - best_text},
        trk_text - best_text >= TEXT_MIN_GAIN))
    return out


def regime_checks(table: dict, test_items) -> list:
    """What must hold for the claims to say anything."""
    trk = table["tracker"]["tasks"]
    acc = min(trk[t]["score"] for t in CHOICE_TASKS)
    bcq = [it.answer for it in test_items if it.task == "bcq"]
    yes = bcq.count("Yes") / max(len(bcq), 1)
    return [
        outputs.regime(f"the labels are recoverable from the frames: the frame tracker's bcq "
                       f"and mcq accuracy are at least {TRACKER_MIN_ACC}", acc,
                       acc >= TRACKER_MIN_ACC),
        outputs.regime(f"the intervals are recoverable from the frames: the tracker's "
                       f"temporal-localization mIoU is at least {TRACKER_MIN_IOU}",
                       trk["temporal_localization"]["score"],
                       trk["temporal_localization"]["score"] >= TRACKER_MIN_IOU),
        outputs.regime(f"bcq is balanced: the test split's yes rate is in {list(BALANCE)}",
                       yes, BALANCE[0] <= yes <= BALANCE[1]),
    ]


def run(config, workdir: str) -> dict:
    """Builds the synthetic split, runs and scores every predictor; writes results.json,
    report.md and one submission CSV per predictor to ``workdir``."""
    check_config(config)
    started = time.time()
    train, test, media = tar.build_splits(
        os.path.join(workdir, "data"), seed=config.seed, train_videos=config.train_videos,
        test_videos=config.test_videos, n_frames=config.n_frames, fps=config.fps)
    build_s = time.time() - started
    scorer = (tar.BERTScorer(config.scorer_dir, config.scorer_layers or None)
              if config.scorer_dir else None)
    train_frames = {v: tar.load_frames(v, media) for v in shortcuts.video_types(train)}
    fns = {"majority": shortcuts.fit_majority(train),
           "question_only": shortcuts.fit_question_only(train),
           **{f"{pos}_frame": shortcuts.fit_frame_rule(train, media, pos, frames=train_frames)
              for pos in ("first", "middle", "last")},
           "tracker": shortcuts.tracker(config.fps)}
    table, rows, test_frames = {}, [], {}
    for name, fn in fns.items():
        t0 = time.time()
        preds = tar.predict(fn, test, media_root=media, frames_cache=test_frames)
        path = os.path.join(workdir, "submissions", f"{name}.csv")
        tar.write_submission(path, preds)
        res = tar.evaluate(tar.read_submission(path, test), test, scorer=scorer)
        res["seconds"] = time.time() - t0
        table[name] = res
        rows.append({"predictor": name,
                     **{t: res["tasks"][t]["score"] for t in tar.TASKS},
                     **res["groups"], "aggregate": res["aggregate"],
                     "malformed": sum(r["malformed"] for r in res["tasks"].values())})
        logging.info("tar_baselines %s: aggregate %.3f (%.1f s)", name, res["aggregate"],
                     res["seconds"])
    base_chance = tar.metrics.choice_chance(test)
    results = {"table": table, "chance": base_chance,
               "split": {"train_items": sum(len(v) for v in train.values()),
                         "test_items": len(test), "train_videos": config.train_videos,
                         "test_videos": config.test_videos},
               "text_metric": "bertscore_f1" if scorer else "rouge_l",
               "claims": claims(table, base_chance), "regime": regime_checks(table, test),
               "build_seconds": build_s, "seconds": time.time() - started}
    metric = results["text_metric"]
    report = ("## Shortcut baselines and the frame tracker on a synthetic TAR split\n\n"
              f"Per task: bcq / mcq accuracy, temporal_localization mean IoU, open-ended "
              f"tasks {metric}; groups and aggregate are means over tasks. Chance: "
              + outputs.format_value(base_chance) + ".\n\n"
              + outputs.markdown_table(rows) +
              f"\n{results['split']['test_items']} test items over {config.test_videos} "
              f"videos, {results['split']['train_items']} train items over "
              f"{config.train_videos} videos. Preset `{config.preset}`, total "
              f"{results['seconds']:.0f} s (building the split {build_s:.0f} s).\n")
    return outputs.write_outputs(workdir, name="tar_baselines", config=config,
                                 results=results, report=report)


def main_table(results: dict) -> list[dict]:
    """The results page's table rows: every predictor per task group and in aggregate."""
    return [{"predictor": p, **r["groups"], "aggregate": r["aggregate"]}
            for p, r in results["table"].items()]


if __name__ == "__main__":
    launch.main(run)
