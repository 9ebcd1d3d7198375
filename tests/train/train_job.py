"""A small training run shared by the resume tests (not a test module).

``python -m tests.train.train_job WORKDIR [SLEEP [PRECISION [MESH]]]`` trains the
tiny model of :func:`build` in WORKDIR (sleeping SLEEP seconds per batch so that a
test can kill it mid-run; ``TRAIN`` with ``precision=PRECISION``, default
float32; on a ``DATAxMODEL`` device mesh such as ``4x2`` when MESH is given) and,
when done, writes the final parameters to ``WORKDIR/final.npz``.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np
from flax import nnx

from lab.nn import Transformer, TransformerConfig
from lab.train import TrainConfig, Trainer, sft_loss

MODEL = TransformerConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                          head_dim=8, d_ff=32, max_len=16)
TRAIN = TrainConfig(steps=20, learning_rate=1e-2, warmup_steps=3, schedule="cosine",
                    weight_decay=0.01, log_every=1, checkpoint_every=5, keep_checkpoints=3,
                    progress=False, seed=3)
BATCH, SEQ = 4, 8


def batch_fn(step: int) -> dict:
    """A deterministic batch per step; the loss mask hides a step-dependent prefix."""
    rng = np.random.default_rng(1000 + step)
    x = rng.integers(0, MODEL.vocab_size, (BATCH, SEQ + 1))
    mask = (np.arange(SEQ)[None, :] >= rng.integers(0, 4, (BATCH, 1))).astype(np.float32)
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "mask": mask}


def build() -> nnx.Module:
    return Transformer(MODEL, rngs=nnx.Rngs(0))


def leaves(model: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def main(workdir: str, sleep: float = 0.0, precision: str = "float32",
         mesh: str | None = None) -> None:
    def slow_batch_fn(step):
        time.sleep(sleep)
        return batch_fn(step)

    if mesh is not None:
        from lab import parallel

        mesh = parallel.make_mesh(*(int(v) for v in mesh.split("x")))
    model = Trainer(build(), sft_loss, TRAIN.replace(precision=precision), workdir=workdir,
                    mesh=mesh).fit(slow_batch_fn if sleep else batch_fn)
    tmp = os.path.join(workdir, "final.tmp.npz")
    np.savez(tmp, *leaves(model))
    os.replace(tmp, os.path.join(workdir, "final.npz"))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
         sys.argv[3] if len(sys.argv) > 3 else "float32",
         sys.argv[4] if len(sys.argv) > 4 else None)
