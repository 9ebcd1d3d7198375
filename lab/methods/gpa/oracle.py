"""GPA's frozen oracles: small 1-D CNNs that predict a cell type's activity from sequence.

The network reads one-hot input ``[n, L, 4]`` (so gradient-based editing can
differentiate through a relaxed sequence): two convolutions with ReLU, max and
mean pooling over positions, a linear head. One oracle per cell type guides
design; a separately trained, wider oracle on a disjoint split audits it (a
design that only fools its guide shows up as a gap between the two).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.data.batching import step_indices
from lab.train import TrainConfig, Trainer


class CNNOracle(nnx.Module):
    def __init__(self, *, width: int = 32, kernel: int = 9, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(4, width, kernel_size=(kernel,), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(width, width, kernel_size=(5,), padding="SAME", rngs=rngs)
        self.head = nnx.Linear(2 * width, 1, rngs=rngs)
        self.scale = nnx.Variable(jnp.ones(()))  # target standardisation (not trained)
        self.shift = nnx.Variable(jnp.zeros(()))

    def __call__(self, onehot: jax.Array) -> jax.Array:
        """Predicted activity ``[n]`` from one-hot (or relaxed) sequences ``[n, L, 4]``."""
        h = jax.nn.relu(self.conv1(onehot))
        h = jax.nn.relu(self.conv2(h))
        pooled = jnp.concatenate([h.max(axis=1), h.mean(axis=1)], axis=-1)
        return self.head(pooled)[:, 0] * self.scale[...] + self.shift[...]

    def predict(self, seqs: jax.Array) -> jax.Array:
        return self(jax.nn.one_hot(seqs, 4))


def _mse(model: CNNOracle, batch):
    pred = model(jax.nn.one_hot(batch["x"], 4))
    loss = jnp.mean((pred - batch["y"]) ** 2)
    return loss, {"loss": loss}


def train_oracle(seqs: np.ndarray, targets: np.ndarray, train: TrainConfig, *,
                 width: int = 32, batch_size: int = 128) -> CNNOracle:
    """Fits a CNN oracle to measured activities by mean squared error."""
    seqs, targets = np.asarray(seqs), np.asarray(targets, np.float32)
    if seqs.shape[0] != targets.shape[0]:
        raise ValueError(f"{seqs.shape[0]} sequences but {targets.shape[0]} targets")
    model = CNNOracle(width=width, rngs=nnx.Rngs(train.seed))
    model.shift.value = jnp.asarray(targets.mean())
    model.scale.value = jnp.asarray(targets.std() + 1e-6)
    n = seqs.shape[0]

    def batch_fn(step):
        idx = step_indices(n, batch_size, step, train.seed)
        return {"x": jnp.asarray(seqs[idx], jnp.int32), "y": jnp.asarray(targets[idx])}

    Trainer(model, _mse, train).fit(batch_fn)
    return model
