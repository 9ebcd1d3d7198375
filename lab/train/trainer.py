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

On a device mesh (``Trainer(..., mesh=lab.parallel.make_mesh(data=2, model=4))``)
the batch is split over the mesh's ``"data"`` axis, the parameters, the other
model state and the optimizer state are laid out by :mod:`lab.parallel`'s
partition rules (heads and the FFN width on ``"model"``; with ``fsdp=True`` also
over ``"data"``, ZeRO-3 style), and the step is jitted with those shardings as
explicit inputs and outputs (:class:`lab.train.step.StepLayout`); gradient
accumulation splits each micro-batch over ``"data"``. Losses equal the unsharded
run's up to float reassociation. Checkpoints are orbax's sharded saves; a run
resumes on another mesh shape (the state is restored straight onto the new
layout). With several processes (:func:`lab.parallel.initialize`) every process
runs the same ``fit`` with the same ``batch_fn``, which returns the global
batch. Without a mesh nothing of this runs and the numbers are those of one device.

RNG: ``jax.random.key(config.seed)`` folded with the step (and with the
micro-batch index under gradient accumulation) is passed to ``loss_fn`` as
``rng=`` when ``loss_fn`` takes a parameter named ``rng``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm

from lab import parallel
from lab.train.checkpoint import RunCheckpoints
from lab.train.config import TrainConfig, make_optimizer
from lab.train.runlog import due, log_update, to_python, truncate_metrics
from lab.train.step import StepLayout, compiled_step, step_config

LossFn = Callable[..., tuple[jax.Array, dict]]


def _takes_rng(fn: Callable) -> bool:
    try:
        return "rng" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
      mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis (e.g.
        :func:`lab.parallel.make_mesh`) to train sharded on; None trains on the
        default device, exactly as without the argument.
      rules: ``(regex, PartitionSpec)`` partition rules (default
        :data:`lab.parallel.RULES`, where an axis that does not divide a dimension
        replicates it). Rules given here are strict: an axis that does not divide
        the dimension it shards is a ValueError.
      fsdp: also shard every parameter and its optimizer state over ``"data"``
        (its largest dimension that the axis divides).

    Attributes:
      history: list of the metric records (``{"step": n, ...}``, ``n`` = updates
        done), the same records ``metrics.jsonl`` holds.
    """

    def __init__(self, model: nnx.Module, loss_fn: LossFn, config: TrainConfig | Mapping,
                 workdir: str | None = None, *, mesh: Mesh | None = None, rules=None,
                 fsdp: bool = False):
        if not isinstance(config, TrainConfig):
            config = TrainConfig.from_dict(config)
        if not callable(loss_fn):
            raise ValueError(f"loss_fn={loss_fn!r} is not callable")
        if mesh is None and (rules is not None or fsdp):
            raise ValueError(f"Trainer(rules={'given' if rules is not None else None}, "
                             f"fsdp={fsdp!r}) without a mesh; expected mesh= to shard on")
        if mesh is not None and (not isinstance(mesh, Mesh) or "data" not in mesh.axis_names):
            raise ValueError(f"Trainer(mesh={mesh!r}); expected a jax.sharding.Mesh with a "
                             "'data' axis (lab.parallel.make_mesh)")
        self.mesh = mesh
        self.rules = rules
        self.fsdp = bool(fsdp)
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
        graphdef, state = self._initial_state()
        params, rest, opt_state, key = (state[k] for k in ("params", "rest", "opt_state", "rng"))
        if self.mesh is None:
            step = compiled_step(graphdef, self.loss_fn, step_config(cfg),
                                 _takes_rng(self.loss_fn))
            place_batch = lambda b: jax.tree.map(jnp.asarray, b)  # noqa: E731
        else:
            step, place_batch = self._sharded_step(
                graphdef, jax.tree.map(lambda x: x.sharding, state))

        start, ckpt, log_file = 0, None, None
        self.history = []
        try:
            if self.workdir is not None:
                os.makedirs(self.workdir, exist_ok=True)
                ckpt = RunCheckpoints(os.path.join(self.workdir, "checkpoints"),
                                      cfg.keep_checkpoints)
                target = {"params": params, "rest": rest, "opt_state": opt_state, "rng": key}
                target_shardings = jax.tree.map(lambda x: x.sharding, target)
                restored = ckpt.restore_latest(target)
                if restored is not None:
                    start, state, meta = restored
                    if self.mesh is not None:  # onto this trainer's layout, whatever was saved
                        state = parallel.place(state, target_shardings)
                    params, rest, opt_state = state["params"], state["rest"], state["opt_state"]
                    key = state["rng"]
                    self._check_resume(meta, start)
                self.history = truncate_metrics(self.metrics_path, start)
                log_file = open(self.metrics_path, "a")  # noqa: SIM115 - closed in finally

            bar = tqdm(total=cfg.steps, initial=min(start, cfg.steps), disable=not cfg.progress,
                       desc="train", dynamic_ncols=True)
            for s in range(start, cfg.steps):
                batch = place_batch(batch_fn(s))
                params, rest, opt_state, metrics = step(params, rest, opt_state, batch,
                                                        jnp.int32(s), key)
                done, final = s + 1, s + 1 == cfg.steps
                record = {}
                if due(done, cfg.log_every, final):
                    record = {k: to_python(v) for k, v in jax.device_get(metrics).items()}
                record = log_update(
                    done, record, eval_fn=eval_fn, eval_due=bool(cfg.eval_every)
                    and due(done, cfg.eval_every, final),
                    model_fn=lambda: nnx.merge(graphdef, params, rest),  # noqa: B023
                    history=self.history, log_file=log_file)
                if "loss" in record:
                    bar.set_postfix(loss=f"{record['loss']:.4g}", refresh=False)
                if ckpt is not None and due(done, cfg.checkpoint_every, final):
                    os.fsync(log_file.fileno())  # metrics up to `done` are durable first
                    ckpt.save(done, {"params": params, "rest": rest, "opt_state": opt_state,
                                     "rng": key}, self._meta())
                bar.update(1)
            bar.close()
        finally:
            if log_file is not None:
                log_file.close()
            if ckpt is not None:
                ckpt.close()
        nnx.update(self.model, params, rest)
        return self.model

    def initial_state(self) -> dict:
        """The state a new ``fit`` starts from, placed as the step takes it.

        ``{"params", "rest", "opt_state", "rng"}``: own copies of the model's
        parameters and other state, the optimizer's initial state and the RNG key,
        on the mesh's layout when the trainer has one (so
        ``x.addressable_shards`` tell what each device holds).
        """
        return self._initial_state()[1]

    def _initial_state(self) -> tuple[Any, dict]:
        graphdef, params, rest = nnx.split(self.model, nnx.Param, ...)
        if self.config.precision != "float32":
            self._check_master_weights(params)
        key = jax.random.key(self.config.seed)
        if self.mesh is not None:
            return graphdef, self._place(params, rest, key)
        # Own copies: the step donates its inputs, the caller's arrays stay alive.
        params, rest = jax.tree.map(jnp.copy, (params, rest))
        opt_state = make_optimizer(self.config).init(params)
        return graphdef, {"params": params, "rest": rest, "opt_state": opt_state, "rng": key}

    def _meta(self) -> dict:
        meta = {"config": self.config.to_dict()}
        if self.mesh is not None:  # a record only: a run resumes on any mesh
            meta["mesh"] = {str(k): int(v) for k, v in self.mesh.shape.items()}
            meta["fsdp"] = self.fsdp
        return meta

    def _place(self, params, rest, key) -> dict:
        """Lays out the run's state on the mesh (``initial_state``'s dict)."""
        mesh, cfg = self.mesh, self.config
        head_dim = getattr(getattr(self.model, "config", None), "head_dim", None)
        rules = parallel.RULES if self.rules is None else self.rules

        def shardings_of(tree):
            return parallel.named(parallel.tree_specs(
                tree, mesh, rules, head_dim=head_dim, fsdp=self.fsdp,
                strict=self.rules is not None), mesh)

        sh = {"params": shardings_of(params), "rest": shardings_of(rest)}
        tx = make_optimizer(cfg)
        sh["opt_state"] = shardings_of(jax.eval_shape(tx.init, params))
        sh["rng"] = parallel.named(jax.sharding.PartitionSpec(), mesh)
        placed = parallel.place({"params": params, "rest": rest, "rng": key},
                                {k: sh[k] for k in ("params", "rest", "rng")})
        # Own copies: the step donates its inputs, the caller's arrays stay alive.
        own = jax.tree.map(lambda a, b: jnp.copy(b) if a is b else b,
                           {"params": params, "rest": rest}, {k: placed[k] for k in
                                                              ("params", "rest")})
        opt_state = jax.jit(tx.init, out_shardings=sh["opt_state"])(own["params"])
        return {"params": own["params"], "rest": own["rest"], "opt_state": opt_state,
                "rng": placed["rng"]}

    def _sharded_step(self, graphdef, shardings):
        """``(step, place_batch)`` on the mesh: the step is compiled for each batch structure."""
        mesh, cfg, pass_rng = self.mesh, step_config(self.config), _takes_rng(self.loss_fn)
        steps: dict = {}
        current = {}

        def place_batch(batch):
            batch = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x),
                                 batch)
            treedef = jax.tree.structure(batch)
            if treedef not in steps:
                specs = parallel.batch_specs(batch, mesh)
                self._check_micro_batches(batch)
                batch_sh = parallel.named(specs, mesh)
                layout = StepLayout(mesh, *(StepLayout.flat(shardings[k]) for k in
                                            ("params", "rest", "opt_state")),
                                    StepLayout.flat(batch_sh))
                steps[treedef] = (compiled_step(graphdef, self.loss_fn, cfg, pass_rng, layout),
                                  batch_sh)
            current["step"], batch_sh = steps[treedef]
            return parallel.place(batch, batch_sh)

        def step(*args):
            return current["step"](*args)

        return step, place_batch

    def _check_micro_batches(self, batch) -> None:
        """Each micro-batch of gradient accumulation is split over ``"data"`` as well."""
        n, data = self.config.grad_accum, self.mesh.shape["data"]
        if n == 1:
            return
        for path, x in jax.tree_util.tree_leaves_with_path(batch):
            size = np.shape(x)[0] if np.ndim(x) else 0
            if size % n == 0 and (size // n) % data:
                raise ValueError(
                    f"mesh axis 'data' (size {data}) does not divide the micro-batch dimension "
                    f"of {jax.tree_util.keystr(path)} (size {size // n} = batch {size} / "
                    f"TrainConfig.grad_accum={n}); expected a batch that is a multiple of "
                    f"{n * data}")

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
