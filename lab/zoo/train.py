"""Training a zoo model from its spec: data, the Trainer, held-out evaluation."""

from __future__ import annotations

import collections
import time

import datasets
from absl import logging
from flax import nnx

from lab import host
from lab.data import ByteTokenizer, mixture
from lab.data.batching import packed_sft_batches, sft_batches
from lab.nn import Transformer
from lab.train import TrainConfig, Trainer, sft_loss
from lab.zoo.evaluate import evaluate
from lab.zoo.spec import ZooSpec

HELD_OUT_SEED_OFFSET = 7919  # held-out data come from another seed of the same mixture


def per_task_indices(ds: datasets.Dataset, k: int,
                     exclude: set[str] = frozenset()) -> list[int]:
    """Indices of the first ``k`` rows of each task, skipping prompts in ``exclude``, in row
    order."""
    taken: collections.Counter = collections.Counter()
    keep = []
    for i, (task, prompt) in enumerate(zip(ds["task"], ds["prompt"], strict=True)):
        if taken[task] < k and prompt not in exclude:
            taken[task] += 1
            keep.append(i)
    return keep


def held_out_pool(spec: ZooSpec) -> datasets.Dataset:
    """The rows the held-out set is drawn from: the spec's mixture under another seed."""
    d = spec.data
    return mixture(4 * d["n_eval"] * len(d["tasks"]), d["seed"] + HELD_OUT_SEED_OFFSET,
                   d["tasks"])


def build_data(spec: ZooSpec) -> tuple[datasets.Dataset, datasets.Dataset, datasets.Dataset]:
    """Returns ``(train, train_eval, held_out)``.

    ``held_out`` has ``n_eval`` rows per task of :func:`held_out_pool`, none of whose
    prompts occurs in ``train`` (small tasks such as one-digit sums repeat).
    """
    d = spec.data
    train = mixture(d["n_train"], d["seed"], d["tasks"])
    pool = held_out_pool(spec)
    held_out = pool.select(per_task_indices(pool, d["n_eval"], exclude=set(train["prompt"])))
    return train, train.select(per_task_indices(train, d["n_eval"])), held_out


def _held_out_curve(held_out: datasets.Dataset, tok, seq_len: int):
    """``(eval_fn, by_step)``: ``eval_fn`` for the Trainer logs held-out exact match per task
    (``<task>/exact_match``) to ``metrics.jsonl`` every ``eval_every`` steps (0 = never) and
    keeps each full :func:`evaluate` result in ``by_step`` (the last one is the final model's)."""
    by_step: dict[int, dict] = {}

    def eval_fn(model, step):
        by_step[step] = evaluate(model, held_out, tok, seq_len)
        return {f"{task}/exact_match": r["exact_match"] for task, r in by_step[step].items()}
    return eval_fn, by_step


def train_model(spec: ZooSpec, workdir: str | None, progress: bool = True,
                init: nnx.Module | None = None) -> tuple[nnx.Module, dict]:
    """Trains the spec's model with :class:`lab.train.Trainer`; returns ``(model, metrics)``.

    ``metrics``: per-task ``train`` and ``held_out`` accuracies (see
    :func:`lab.zoo.evaluate.evaluate`), wall and CPU seconds of data
    generation, training and evaluation, the host that trained it
    (:func:`lab.host.describe`), the loss curve, the held-out exact match per task
    every ``eval_every`` steps (``held_out_curve``), the parameter count, and for a spec
    with ``regime`` set the chain-of-thought regime (:mod:`lab.zoo.reasoning`, ``"regime"``,
    timed as ``seconds["regime"]``).
    A ``workdir`` holds the trainer's checkpoints, so a killed run resumes.
    ``init``: a trained model of the same config whose weights start training
    (the spec's :attr:`ZooSpec.init` base).
    """
    tok = ByteTokenizer()
    t0, c0 = time.time(), time.process_time()
    train, train_eval, held_out = build_data(spec)
    make = packed_sft_batches if spec.pack else sft_batches
    batch_fn = make(train, tok, spec.batch_size, spec.seq_len, seed=spec.data["seed"],
                    prompt_weight=spec.prompt_weight)
    t1, c1 = time.time(), time.process_time()
    config = TrainConfig.from_dict({**spec.train, "progress": progress})
    model = Transformer(spec.model, rngs=nnx.Rngs(config.seed))
    if init is not None:
        nnx.update(model, nnx.state(init, nnx.Param))
    logging.info("zoo: training %s (%d params, %d steps)", spec.key, spec.model.num_params(),
                 config.steps)
    trainer = Trainer(model, sft_loss, config, workdir=workdir)
    eval_fn, evaluated = _held_out_curve(held_out, tok, spec.seq_len)
    model = trainer.fit(batch_fn, eval_fn=eval_fn)
    t2, c2 = time.time(), time.process_time()
    # the Trainer evaluates at its last step; a resumed, already finished run does not
    final = evaluated.get(config.steps) or evaluate(model, held_out, tok, spec.seq_len)
    results = {"train": evaluate(model, train_eval, tok, spec.seq_len), "held_out": final}
    t3, c3 = time.time(), time.process_time()
    regime = {}
    if spec.regime is not None:  # the chain-of-thought regime (lab.zoo.reasoning)
        from lab.zoo.reasoning import spec_regime

        regime = {"regime": spec_regime(spec, model, set(train["prompt"]), tok)}
    t4, c4 = time.time(), time.process_time()
    losses = [(r["step"], r["loss"]) for r in trainer.history if "loss" in r]
    curve = [r for r in trainer.history if any(k.startswith("eval/") for k in r)]
    metrics = {
        **results,
        "held_out_curve": curve,
        "params": spec.model.num_params(),
        "steps": config.steps,
        "examples": len(train),
        "final_loss": losses[-1][1] if losses else None,
        "loss_curve": losses,
        "seconds": {"data": t1 - t0, "train": t2 - t1, "eval": t3 - t2},
        "cpu_seconds": {"data": c1 - c0, "train": c2 - c1, "eval": c3 - c2},
        "host": host.describe(),
        **regime,
    }
    if regime:
        metrics["seconds"]["regime"] = t4 - t3
        metrics["cpu_seconds"]["regime"] = c4 - c3
    return model, metrics
