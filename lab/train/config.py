"""TrainConfig and the optax optimizer / learning-rate schedule it describes.

The optimizer is built from the config alone (:func:`make_optimizer`), so that
the jitted train step can rebuild it inside the trace from a hashable config
and two trainers with the same config share one compiled step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import optax

SCHEDULES = ("cosine", "constant", "linear")
OPTIMIZERS = ("adamw", "adam", "sgd")
PRECISIONS = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of :class:`lab.train.Trainer`.

    steps:            number of optimizer updates; update ``s`` (0-based) trains on
                      ``batch_fn(s)``.
    learning_rate:    peak learning rate (> 0).
    warmup_steps:     linear warm-up from 0 to ``learning_rate``.
    schedule:         ``"cosine"`` (decay to 0 at ``steps``), ``"linear"`` (decay to 0),
                      ``"constant"``.
    optimizer:        ``"adamw"`` (decoupled weight decay), ``"adam"`` / ``"sgd"``
                      (weight decay added to the gradient, PyTorch's convention).
    weight_decay:     applied to parameters with at least 2 dimensions only
                      (matrices and embeddings, not norms or biases).
    grad_clip:        global-norm clip; 0 disables it.
    grad_accum:       micro-batches per update; the batch's leading axis is split.
    seed:             the RNG seed (``jax.random.key(seed)``, folded with the step).
    log_every:        append a metrics record every this many updates (and at the end).
    eval_every:       call ``eval_fn`` every this many updates (and at the end); 0 = never.
    checkpoint_every: save every this many updates (and at the end) when the trainer
                      has a workdir; 0 = only at the end.
    keep_checkpoints: how many checkpoints to keep.
    progress:         show a tqdm progress bar.
    b1, b2, eps:      Adam moments; ``momentum`` for SGD.
    precision:        ``"float32"`` (the model computes as it is built) or ``"bfloat16"``:
                      mixed precision, the ``nnx.Linear`` products in bfloat16 with float32
                      accumulation while parameters, gradients, optimizer state and
                      checkpoints stay float32 (see :mod:`lab.train.step`); the model's
                      parameters must then be float32.
    """

    steps: int = 1000
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    grad_accum: int = 1
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    progress: bool = True
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float = 0.0
    precision: str = "float32"

    def __post_init__(self):
        def fail(name, expected):
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r}; expected {expected}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for name, low in (("steps", 0), ("warmup_steps", 0), ("grad_accum", 1), ("seed", None),
                          ("log_every", 1), ("eval_every", 0), ("checkpoint_every", 0),
                          ("keep_checkpoints", 1)):
            v = getattr(self, name)
            if not is_int(v) or (low is not None and v < low):
                fail(name, "an int" + ("" if low is None else f" >= {low}"))
        if not is_num(self.learning_rate) or not self.learning_rate > 0:
            fail("learning_rate", "a number > 0")
        for name in ("weight_decay", "grad_clip", "eps", "momentum"):
            v = getattr(self, name)
            if not is_num(v) or v < 0:
                fail(name, "a number >= 0")
        for name in ("b1", "b2"):
            v = getattr(self, name)
            if not is_num(v) or not 0 <= v < 1:
                fail(name, "a number in [0, 1)")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"one of {SCHEDULES}")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"one of {OPTIMIZERS}")
        if self.precision not in PRECISIONS:
            fail("precision", f"one of {PRECISIONS}")
        if self.warmup_steps > self.steps:
            fail("warmup_steps", f"at most steps={self.steps}")
        if not isinstance(self.progress, bool):
            fail("progress", "a bool")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Builds a config from a mapping (dict or ``ml_collections.ConfigDict``).

        Raises ValueError naming any unknown key.
        """
        d = dict(d.to_dict() if hasattr(d, "to_dict") else d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}; known keys: {sorted(known)}")
        return cls(**d)

    def replace(self, **kwargs) -> TrainConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_schedule(config: TrainConfig) -> optax.Schedule:
    """Returns the learning rate as a function of the update count."""
    lr, warm, total = float(config.learning_rate), config.warmup_steps, max(config.steps, 1)
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(total, warm + 1), 0.0)
    if config.schedule == "linear":
        decay = optax.linear_schedule(lr, 0.0, max(total - warm, 1))
    else:
        decay = optax.constant_schedule(lr)
    if warm == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), decay], [warm])


def _decay_mask(params):
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Returns the optax transformation the config describes (clip, then the optimizer)."""
    lr = make_schedule(config)
    wd = float(config.weight_decay)
    if config.optimizer == "adamw":
        opt = optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=wd,
                          mask=_decay_mask)
    else:
        base = (optax.adam(lr, b1=config.b1, b2=config.b2, eps=config.eps)
                if config.optimizer == "adam"
                else optax.sgd(lr, momentum=config.momentum or None))
        opt = optax.chain(optax.add_decayed_weights(wd, _decay_mask), base) if wd else base
    if config.grad_clip:
        opt = optax.chain(optax.clip_by_global_norm(float(config.grad_clip)), opt)
    return opt
