"""Trains a Transformer LM from a zoo-style config, with checkpoints in the workdir.

  python -m experiments.train_lm --config=configs/train_lm.py:test --workdir=/tmp/train_lm

Writes ``config.json``, ``results.json`` (final loss, per-task train and held-out
accuracy, resume step), ``report.md``, ``loss.png``. A config with ``init`` (lm-xs:
``lm-xs-copy``) starts from that zoo model, trained and cached first if needed.
Checkpoints and metrics live in ``<workdir>/train`` (``lab.train.Trainer``); running
again in the same workdir resumes from the latest checkpoint instead of starting over.
"""

from __future__ import annotations

import os

from configs.train_lm import get_config
from lab import launch, zoo
from lab.config import check
from lab.outputs import claim, markdown_table, save_figure, write_outputs
from lab.train import TrainConfig
from lab.zoo import ZooSpec
from lab.zoo.train import train_model


def check_config(config) -> ZooSpec:
    """Validates against the preset's schema; returns the ZooSpec it describes."""
    check(config, get_config, {
        "seq_len": (lambda v: v > 0, "a positive int"),
        "batch_size": (lambda v: v > 0, "a positive int"),
        "train.steps": (lambda v: v > 0, "a positive int"),
        "data.n_train": (lambda v: v > 0, "a positive int"),
        "prompt_weight": (lambda v: 0 <= v <= 1, "a loss weight in [0, 1]"),
    })
    d = config.to_dict()
    TrainConfig.from_dict(d["train"])  # raises ValueError naming a bad training field
    try:
        spec = ZooSpec.from_dict({k: d[k] for k in ("name", "model", "train", "data", "seq_len",
                                                     "batch_size", "pack", "prompt_weight",
                                                     "init")})
    except TypeError as e:  # a TransformerConfig field of the wrong kind
        raise ValueError(f"config.model is invalid: {e}") from e
    spec.base()  # raises ValueError for an unknown init or one with another model config
    return spec


def _mean(accs: dict, key: str) -> float:
    vals = [v[key] for v in accs.values() if isinstance(v, dict) and key in v]
    return sum(vals) / len(vals) if vals else float("nan")


def run(config, workdir: str) -> dict:
    """Trains (or resumes) the LM; returns the results written to results.json."""
    spec = check_config(config)
    train_dir = os.path.join(workdir, "train")
    ckpt_dir = os.path.join(train_dir, "checkpoints")
    resumed = max((int(s) for s in os.listdir(ckpt_dir) if s.isdigit()), default=0) \
        if os.path.isdir(ckpt_dir) else 0
    _, metrics = train_model(spec, train_dir, progress=True, init=zoo.load_base(spec))
    curve = metrics["loss_curve"]
    first, final = (curve[0][1], curve[-1][1]) if curve else (float("nan"),) * 2
    held_out = _mean(metrics["held_out"], "answer_accuracy")
    results = {
        "params": metrics["params"], "steps": metrics["steps"], "resumed_from_step": resumed,
        "first_logged_loss": first, "final_loss": final,
        "held_out_answer_accuracy": held_out,
        "held_out_exact_match": _mean(metrics["held_out"], "exact_match"),
        "train": metrics["train"], "held_out": metrics["held_out"],
        "loss_curve": curve, "seconds": metrics["seconds"],
    }
    results["claims"] = [claim(
        "Training on the synthetic mixture lowers the loss.",
        "final logged loss < first logged loss", {"first": first, "final": final},
        bool(curve) and final < first)]
    rows = [{"task": t, "split": split, **{k: v for k, v in m.items() if not isinstance(v, dict)}}
            for split in ("train", "held_out") for t, m in metrics[split].items()
            if isinstance(m, dict)]
    report = "\n".join([
        f"Model {spec.name}: {metrics['params']} parameters, {metrics['steps']} steps "
        f"(resumed from step {resumed}). Final loss {final:.4g}; mean held-out answer "
        f"accuracy {held_out:.3f}.\n",
        "## Accuracy per task\n", markdown_table(rows),
        "\n## Time (s)\n", markdown_table([metrics["seconds"]])])
    plots = []
    if curve:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([s for s, _ in curve], [v for _, v in curve])
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_yscale("log")
        os.makedirs(workdir, exist_ok=True)
        plots.append(save_figure(fig, workdir, "loss.png"))
    return write_outputs(workdir, name="train_lm", config=config, results=results, report=report,
                         plots=plots)


if __name__ == "__main__":
    launch.main(run)
