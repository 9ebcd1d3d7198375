"""Losses, training (through :class:`lab.train.Trainer`) and evaluation for S²-Net's tasks.

Binding is trained with a pairwise phase loss: for pixels ``i != j`` that each
belong to exactly one shape, ``(1 - y_ij * e_i . e_j) / 2`` with ``y = +1`` for
the same shape and ``-1`` for different shapes (anti-phase), averaged; it is
invariant to which shape gets which phase, as the ARI is. It is linear in the
similarity on purpose: a squared error ``(e_i . e_j - y_ij)^2`` scores silent
neurons (``e = 0``, loss 1) better than random phases (1.5), and a spiking
network trained with it learns to stop firing. Classification is
trained with softmax cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.methods.s2net import metrics
from lab.train import TrainConfig, Trainer


def pair_phase_loss(emb: jax.Array, labels: jax.Array, n_groups: int = 2) -> jax.Array:
    """Mean ``(1 - y_ij * e_i . e_j) / 2`` over pairs of single-shape pixels: 0 when
    shapes are in anti-phase and each in phase, 0.5 for silent or random phases; scalar."""
    keep = (labels >= 1) & (labels <= n_groups)
    sim = jnp.einsum("bic,bjc->bij", emb, emb)
    target = jnp.where(labels[:, :, None] == labels[:, None, :], 1.0, -1.0)
    n = labels.shape[1]
    mask = keep[:, :, None] & keep[:, None, :] & ~jnp.eye(n, dtype=bool)[None]
    return jnp.sum(jnp.where(mask, 0.5 * (1.0 - target * sim), 0.0)) / jnp.maximum(mask.sum(), 1)


def binding_loss(spike_penalty: float = 0.0, oscillator_weight: float = 0.0,
                 n_groups: int = 2) -> Callable:
    """Trainer loss for binding: :func:`pair_phase_loss` of the spike phases, plus
    ``oscillator_weight`` times the same loss on S²-Net's top-down oscillator phases
    (``osc_emb``; models without oscillators ignore it), plus ``spike_penalty`` times the
    mean firing rate (zero for non-spiking models).

    The rate penalty keeps a surrogate-gradient SNN out of runaway excitation (every
    neuron firing every step, where phases carry no information). The oscillator term
    gives the couplings a gradient that does not have to pass through spike timing;
    ARI is always measured on the spike phases.

    Returns ``loss_fn(model, batch, rng) -> (loss, {"loss", "phase_loss", "spikes"})``.
    """

    def loss_fn(model: nnx.Module, batch: dict, rng: jax.Array):
        out = model(batch["inputs"], key=rng)
        phase = pair_phase_loss(out["emb"], batch["labels"], n_groups)
        rate = out["rates"].mean() if "rates" in out else jnp.zeros(())
        loss = phase + spike_penalty * rate
        if oscillator_weight and "osc_emb" in out:
            loss = loss + oscillator_weight * pair_phase_loss(out["osc_emb"], batch["labels"],
                                                              n_groups)
        return loss, {"loss": loss, "phase_loss": phase, "spikes": out["spikes"].mean()}

    return loss_fn


def classify_loss(spike_penalty: float = 0.0) -> Callable:
    """Trainer loss for classification: cross-entropy plus ``spike_penalty`` times the
    mean firing rate (spikes per neuron per step; zero for non-spiking models), the
    usual activity regulariser of surrogate-gradient SNNs (Zenke & Vogels 2021).

    Returns ``loss_fn(model, batch, rng) -> (loss, {"loss", "ce", "accuracy", "spikes"})``.
    """

    def loss_fn(model: nnx.Module, batch: dict, rng: jax.Array):
        out = model(batch["inputs"], key=rng)
        logits = out["logits"]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
        rate = out["rates"].mean() if "rates" in out else jnp.zeros(())
        loss = ce + spike_penalty * rate
        acc = jnp.mean(jnp.argmax(logits, -1) == batch["labels"])
        return loss, {"loss": loss, "ce": ce, "accuracy": acc, "spikes": out["spikes"].mean()}

    return loss_fn


def fit(model: nnx.Module, loss_fn: Callable, batch_fn: Callable[[int], dict], *, steps: int,
        learning_rate: float, seed: int, workdir: str | None = None) -> tuple[nnx.Module, list]:
    """Trains ``model`` in place with :class:`lab.train.Trainer` (Adam, cosine decay, clip 1);
    returns ``(model, history)``."""
    config = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=min(10, steps),
                         schedule="cosine", optimizer="adam", grad_clip=1.0, seed=seed,
                         log_every=max(1, steps // 10), checkpoint_every=0, progress=False)
    trainer = Trainer(model, loss_fn, config, workdir=workdir)
    trainer.fit(batch_fn)
    return model, trainer.history


def _forward(model: nnx.Module):
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, inputs, key):
        out = nnx.merge(graphdef, state)(inputs, key=key)
        return {k: v for k, v in out.items() if k != "raw"}

    return lambda inputs, key: run(state, inputs, key)


def evaluate(model: nnx.Module, batches: list[dict], *, task: str, seed: int = 0,
             n_groups: int = 2) -> dict:
    """Mean metric over ``batches``: ``"ari"`` (binding, over ``n_groups`` groups) or
    ``"accuracy"``, their standard errors over samples ``"ari_se"`` / ``"accuracy_se"``,
    and the mean spike count per sample ``"spikes"``."""
    forward = _forward(model)
    scores, spikes = [], []
    for i, batch in enumerate(batches):
        out = forward(jnp.asarray(batch["inputs"]), jax.random.fold_in(jax.random.key(seed), i))
        if task == "binding":
            scores.append(metrics.binding_ari(out["emb"], batch["labels"], n_groups))
        else:
            scores.append(np.asarray(jnp.argmax(out["logits"], -1)) == batch["labels"])
        spikes.append(np.asarray(out["spikes"]))
    key = "ari" if task == "binding" else "accuracy"
    scores = np.concatenate(scores).astype(np.float64)
    return {key: float(np.mean(scores)), f"{key}_se": metrics.standard_error(scores),
            "spikes": float(np.mean(np.concatenate(spikes)))}
