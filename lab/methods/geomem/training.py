"""Gradient-descent training of the one-layer model on all facts (memorisation).

Many tiny trainings (one per embedding dimension in the search) make a
Python-level loop per step the bottleneck, so training is a jitted
``lax.scan`` over steps of Adam on minibatches, run in segments between which
the accuracy on every fact is checked; it stops once ``target`` is reached.
``only`` restricts the trained parameters (zero-shot transfer fits the subject
embeddings alone with everything else frozen).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lab.methods.geomem.model import OneLayer, accuracy


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """steps: maximum Adam steps; segment: steps between accuracy checks;
    target: stop once this accuracy on every fact is reached (None: run every step);
    weight_decay: AdamW's decoupled decay."""

    steps: int = 3000
    learning_rate: float = 1e-2
    batch_size: int = 1024
    segment: int = 250
    target: float | None = 0.99
    seed: int = 0
    weight_decay: float = 0.0

    def __post_init__(self):
        for name in ("steps", "batch_size", "segment"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"FitConfig.{name}={v!r}; expected a positive int")
        if not self.learning_rate > 0:
            raise ValueError(f"FitConfig.learning_rate={self.learning_rate!r}; expected > 0")
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"FitConfig.target={self.target!r}; expected in (0, 1]")


def _optimizer() -> optax.GradientTransformation:
    # Hyper-parameters live in the optimizer state, so runs that differ only in
    # them share one compiled segment.
    return optax.inject_hyperparams(optax.adamw)(learning_rate=0.0, weight_decay=0.0)


def _init_opt(params, learning_rate: float, weight_decay: float):
    state = _optimizer().init(params)
    state.hyperparams["learning_rate"] = jnp.asarray(learning_rate, jnp.float32)
    state.hyperparams["weight_decay"] = jnp.asarray(weight_decay, jnp.float32)
    return state


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _segment(graphdef, params, rest, opt_state, data, batch_size: int, length: int):
    """``length`` Adam steps on random minibatches; returns params, opt_state, losses."""
    tokens, answers, key = data
    n = tokens.shape[0]
    tx = _optimizer()

    def loss_fn(p, t, a):
        logits = nnx.merge(graphdef, p, rest)(t)
        return optax.softmax_cross_entropy_with_integer_labels(logits, a).mean()

    def step(carry, k):
        p, s = carry
        if batch_size < n:
            idx = jax.random.randint(k, (batch_size,), 0, n)
            t, a = tokens[idx], answers[idx]
        else:
            t, a = tokens, answers
        loss, grads = jax.value_and_grad(loss_fn)(p, t, a)
        updates, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state),
                                               jax.random.split(key, length))
    return params, opt_state, losses


def fit(model: OneLayer, tokens: jax.Array, answers: jax.Array, config: FitConfig,
        only: str | None = None) -> dict:
    """Trains ``model`` in place with Adam on softmax cross-entropy over every fact.

    Args:
      model: a :class:`OneLayer`.
      tokens, answers: all queries (``data.queries``) - the facts to memorise.
      config: a :class:`FitConfig`.
      only: ``None`` (train every parameter) or a parameter name such as ``"subjects"``.

    Returns:
      ``{"accuracy", "steps", "loss"}``: accuracy on every fact at the end, steps
      taken, last segment's mean loss.
    """
    filt = nnx.Param if only is None else nnx.All(nnx.Param, nnx.PathContains(only))
    graphdef, params, rest = nnx.split(model, filt, ...)
    opt_state = _init_opt(params, config.learning_rate, config.weight_decay)
    key = jax.random.PRNGKey(config.seed)
    steps, acc, loss = 0, 0.0, float("nan")
    while steps < config.steps:
        key, sub = jax.random.split(key)
        params, opt_state, losses = _segment(graphdef, params, rest, opt_state,
                                             (tokens, answers, sub), int(config.batch_size),
                                             int(config.segment))
        steps += config.segment
        loss = float(jnp.mean(losses))
        nnx.update(model, params)
        acc = accuracy(model, tokens, answers)
        if config.target is not None and acc >= config.target:
            break
    return {"accuracy": acc, "steps": steps, "loss": loss}
