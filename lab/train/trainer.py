"""Trainer: the one training loop of Lab (jitted step, metrics, checkpoints, exact resume).

``Trainer(model, loss_fn, config, workdir=None).fit(batch_fn, eval_fn=None)``
trains ``model`` (a Flax NNX module, updated in place and returned) for
``config.steps`` optimizer updates; update ``s`` uses ``batch_fn(s)``, so the
data position is the step and a resumed run sees the same batches.

With a ``workdir`` the run writes ``metrics.jsonl`` (one JSON record per log or
eval step) and orbax checkpoints under ``workdir/checkpoints`` (see
:mod:`lab.train.checkpoint`); a new ``fit`` in the same workdir resumes from the
newest intact checkpoint and truncates ``metrics.jsonl`` to it, so a run killed
at any point (SIGKILL included) and restarted ends with the same parameters and
the same metrics file as an uninterrupted run, bit for bit (CPU). Without a
workdir nothing touches the disk.

RNG: ``jax.random.key(config.seed)`` folded with the step (and with the
micro-batch index under gradient accumulation) is passed to ``loss_fn`` as
``rng=`` when ``loss_fn`` takes a parameter named ``rng``.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from tqdm.auto import tqdm

from lab.atomic import write_text as atomic_write_text
from lab.train.checkpoint import RunCheckpoints
from lab.train.config import TrainConfig, make_optimizer
from lab.train.step import compiled_step, step_config

LossFn = Callable[..., tuple[jax.Array, dict]]


def _takes_rng(fn: Callable) -> bool:
    try:
        return "rng" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _to_python(x) -> Any:
    arr = np.asarray(x)
    return arr.item() if arr.ndim == 0 else arr.tolist()


class Trainer:
    """Trains an NNX model on ``loss_fn(model, batch) -> (loss, metrics_dict)``.

    Args:
      model: a Flax NNX module; its ``nnx.Param`` variables are trained, other
        state (if any) is carried through the step.
      loss_fn: ``loss_fn(model, batch) -> (scalar loss, dict of scalar metrics)``,
        traceable by ``jax.jit`` (e.g. :func:`lab.train.sft_loss`). If it takes an
        ``rng`` parameter it receives a per-step key.
      config: a :class:`TrainConfig` or a mapping for ``TrainConfig.from_dict``.
      workdir: where metrics and checkpoints go; None keeps everything in memory.

    Attributes:
      history: list of the metric records (``{"step": n, ...}``, ``n`` = updates
        done), the same records ``metrics.jsonl`` holds.
    """

    def __init__(self, model: nnx.Module, loss_fn: LossFn, config: TrainConfig | Mapping,
                 workdir: str | None = None):
        if not isinstance(config, TrainConfig):
            config = TrainConfig.from_dict(config)
        if not callable(loss_fn):
            raise ValueError(f"loss_fn={loss_fn!r} is not callable")
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self.workdir = None if workdir is None else os.path.abspath(workdir)
        self.history: list[dict] = []

    @property
    def metrics_path(self) -> str | None:
        return None if self.workdir is None else os.path.join(self.workdir, "metrics.jsonl")

    def fit(self, batch_fn: Callable[[int], Any],
            eval_fn: Callable[[nnx.Module, int], Mapping] | None = None) -> nnx.Module:
        """Runs (or resumes) training; returns the trained model (the same object).

        Args:
          batch_fn: ``batch_fn(step) -> pytree of arrays``, deterministic in ``step``.
          eval_fn: ``eval_fn(model, step) -> dict of numbers``, called every
            ``eval_every`` updates and at the end; its metrics are logged with an
            ``eval/`` prefix. The model it gets is valid for the call only (its
            buffers are reused by the next step).
        """
        cfg = self.config
        graphdef, params, rest = nnx.split(self.model, nnx.Param, ...)
        if cfg.precision != "float32":
            self._check_master_weights(params)
        # Own copies: the step donates its inputs, the caller's arrays stay alive.
        params, rest = jax.tree.map(jnp.copy, (params, rest))
        opt_state = make_optimizer(cfg).init(params)
        key = jax.random.key(cfg.seed)
        step = compiled_step(graphdef, self.loss_fn, step_config(cfg), _takes_rng(self.loss_fn))

        start, ckpt, log_file = 0, None, None
        self.history = []
        try:
            if self.workdir is not None:
                os.makedirs(self.workdir, exist_ok=True)
                ckpt = RunCheckpoints(os.path.join(self.workdir, "checkpoints"),
                                      cfg.keep_checkpoints)
                target = {"params": params, "rest": rest, "opt_state": opt_state, "rng": key}
                restored = ckpt.restore_latest(target)
                if restored is not None:
                    start, state, meta = restored
                    params, rest, opt_state = state["params"], state["rest"], state["opt_state"]
                    key = state["rng"]
                    self._check_resume(meta, start)
                self.history = self._truncate_metrics(start)
                log_file = open(self.metrics_path, "a")  # noqa: SIM115 - closed in finally

            bar = tqdm(total=cfg.steps, initial=min(start, cfg.steps), disable=not cfg.progress,
                       desc="train", dynamic_ncols=True)
            for s in range(start, cfg.steps):
                batch = jax.tree.map(jnp.asarray, batch_fn(s))
                params, rest, opt_state, metrics = step(params, rest, opt_state, batch,
                                                        jnp.int32(s), key)
                done, final = s + 1, s + 1 == cfg.steps
                record = {}
                if done % cfg.log_every == 0 or final:
                    record.update({k: _to_python(v) for k, v in jax.device_get(metrics).items()})
                if eval_fn is not None and cfg.eval_every and (done % cfg.eval_every == 0
                                                               or final):
                    result = eval_fn(nnx.merge(graphdef, params, rest), done)
                    record.update({f"eval/{k}": _to_python(v) for k, v in dict(result).items()})
                if record:
                    record = {"step": done, **record}
                    self.history.append(record)
                    if log_file is not None:
                        log_file.write(json.dumps(record) + "\n")
                        log_file.flush()
                    if "loss" in record:
                        bar.set_postfix(loss=f"{record['loss']:.4g}", refresh=False)
                if ckpt is not None and (final or (cfg.checkpoint_every
                                                   and done % cfg.checkpoint_every == 0)):
                    os.fsync(log_file.fileno())  # metrics up to `done` are durable first
                    ckpt.save(done, {"params": params, "rest": rest, "opt_state": opt_state,
                                     "rng": key}, {"config": cfg.to_dict()})
                bar.update(1)
            bar.close()
        finally:
            if log_file is not None:
                log_file.close()
            if ckpt is not None:
                ckpt.close()
        nnx.update(self.model, params, rest)
        return self.model

    def _check_master_weights(self, params) -> None:
        """Mixed precision keeps float32 master weights: every float parameter must be one."""
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            dtype = jnp.result_type(leaf)
            if jnp.issubdtype(dtype, jnp.floating) and dtype != jnp.float32:
                raise ValueError(
                    f"TrainConfig.precision={self.config.precision!r} keeps float32 master "
                    f"weights, but the parameter {jax.tree_util.keystr(path)} is {dtype}; "
                    "expected a model built in float32")

    def _check_resume(self, meta: dict, step: int) -> None:
        logging.info("Resuming from checkpoint step %d in %s", step, self.workdir)
        saved = meta.get("config") or {}
        ignore = {"steps", "progress", "log_every", "eval_every", "checkpoint_every",
                  "keep_checkpoints"}
        changed = sorted(k for k, v in self.config.to_dict().items()
                         if k not in ignore and k in saved and saved[k] != v)
        if changed:
            logging.warning("Resuming in %s with a config that differs from the checkpoint's in "
                            "%s; the run will not match an uninterrupted one.", self.workdir,
                            {k: (saved[k], getattr(self.config, k)) for k in changed})
        if step > self.config.steps:
            logging.warning("The checkpoint in %s is at step %d, past TrainConfig.steps=%d; "
                            "returning it without training.", self.workdir, step,
                            self.config.steps)

    def _truncate_metrics(self, step: int) -> list[dict]:
        """Keeps the records of ``metrics.jsonl`` up to ``step``; returns them."""
        path = self.metrics_path
        if not os.path.exists(path):
            return []
        kept = []
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                if isinstance(record, dict) and record.get("step", step + 1) <= step:
                    kept.append(record)
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        return kept
