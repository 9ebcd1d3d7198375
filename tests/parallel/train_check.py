"""Sharded training on 8 host CPU devices, run in a subprocess by test_sharded_train.py.

``python tests/parallel/train_check.py WORKDIR`` trains the model of
sharded_check.py (8 heads, 4 KV heads, d_ff 128) for ``STEPS`` steps, unsharded
and with ``lab.train.Trainer(mesh=...)`` on several meshes (with and without
FSDP, with gradient accumulation), saves a run on (8, 1) and resumes it on
(2, 4), and tries meshes that do not fit; it prints one JSON line of what it saw.
With ``--processes N --process-id I`` (and ``JAX_COORDINATOR_ADDRESS``) it is one
of N processes that together hold the 8 devices and runs only the (4, 2) mesh.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from lab import parallel
from lab.train import TrainConfig, Trainer, sft_loss
from tests.parallel.sharded_check import CONFIG, random_model

STEPS, BATCH, SEQ = 5, 8, 16
TRAIN = TrainConfig(steps=STEPS, learning_rate=3e-3, warmup_steps=0, schedule="constant",
                    weight_decay=0.01, log_every=1, checkpoint_every=3, progress=False, seed=5)
MESHES = ((8, 1), (4, 2), (2, 4))


def batch_fn(step: int) -> dict:
    rng = np.random.default_rng(100 + step)
    x = rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ + 1)).astype(np.int32)
    mask = (np.arange(SEQ)[None, :] >= rng.integers(0, 5, (BATCH, 1))).astype(np.float32)
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "mask": mask}


def losses(trainer: Trainer) -> list[float]:
    return [r["loss"] for r in trainer.history]


def params(model) -> list[np.ndarray]:
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def max_diff(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def error(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def per_device_bytes(trees) -> int:
    """The most bytes any one device holds of the arrays in ``trees``."""
    held: dict = {}
    for leaf in jax.tree.leaves(trees):
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return max(held.values())


def run(mesh_shape, fsdp=False, cfg=TRAIN, workdir=None, **kw):
    mesh = parallel.make_mesh(*mesh_shape)
    trainer = Trainer(random_model(), sft_loss, cfg, workdir, mesh=mesh, fsdp=fsdp, **kw)
    return trainer, trainer.fit(batch_fn)


def main(workdir: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    t0, out = time.process_time(), {}
    ref = Trainer(random_model(), sft_loss, TRAIN)
    ref_params = params(ref.fit(batch_fn))
    out["ref_losses"] = losses(ref)
    accum_ref = Trainer(random_model(), sft_loss, TRAIN.replace(grad_accum=2))
    accum_ref.fit(batch_fn)
    out["ref_accum_losses"] = losses(accum_ref)
    for shape in MESHES:
        trainer, model = run(shape)
        out[f"{shape[0]}x{shape[1]}"] = {
            "losses": losses(trainer), "param_diff": max_diff(params(model), ref_params),
            "qkv_spec": str(model.layers[0].attn.qkv.kernel[...].sharding.spec)}
    for shape in ((8, 1), (2, 4)):
        trainer, model = run(shape, fsdp=True)
        out[f"{shape[0]}x{shape[1]}_fsdp"] = {
            "losses": losses(trainer), "param_diff": max_diff(params(model), ref_params),
            "qkv_spec": str(model.layers[0].attn.qkv.kernel[...].sharding.spec)}
    for fsdp in (False, True):  # what one device holds of the parameters + optimizer state
        state = Trainer(random_model(), sft_loss, TRAIN, mesh=parallel.make_mesh(8, 1),
                        fsdp=fsdp).initial_state()
        out[f"bytes_fsdp={fsdp}"] = per_device_bytes((state["params"], state["opt_state"]))
    trainer, _ = run((4, 2), cfg=TRAIN.replace(grad_accum=2))
    out["4x2_accum"] = {"losses": losses(trainer)}

    # Save on (8, 1) after 3 steps; resume on (2, 4) and train to 5.
    ckpt = os.path.join(workdir, "resume")
    _, saved = run((8, 1), cfg=TRAIN.replace(steps=3), workdir=ckpt)
    restored_trainer, restored = run((2, 4), cfg=TRAIN.replace(steps=3), workdir=ckpt)
    out["restore"] = {
        "param_diff": max_diff(params(restored), params(saved)),
        "o_spec": str(restored.layers[0].attn.o.kernel[...].sharding.spec),
        "mesh_devices": len(restored.layers[0].attn.o.kernel[...].sharding.device_set)}
    trainer, _ = run((2, 4), workdir=ckpt)
    out["restore"]["losses"] = losses(trainer)

    out["errors"] = {
        "batch": error(lambda: Trainer(random_model(), sft_loss, TRAIN,
                                       mesh=parallel.make_mesh(8, 1)).fit(
            lambda s: {k: v[:6] for k, v in batch_fn(s).items()})),
        "micro_batch": error(lambda: Trainer(random_model(), sft_loss,
                                             TRAIN.replace(grad_accum=4),
                                             mesh=parallel.make_mesh(8, 1)).fit(batch_fn)),
        # 4 KV heads do not split over a model axis of 8: strict (user) rules refuse.
        "rule": error(lambda: Trainer(random_model(), sft_loss, TRAIN,
                                      mesh=parallel.make_mesh(1, 8),
                                      rules=((r"attn/qkv/kernel$", P(None, "model")),)
                                      ).fit(batch_fn)),
    }
    out["cpu_s"] = time.process_time() - t0
    print(json.dumps(out))


def worker(processes: int, process_id: int) -> None:
    """One process of a multi-process run: the (4, 2) mesh over every process's devices."""
    assert parallel.initialize(), "JAX_COORDINATOR_ADDRESS is not set"
    assert (jax.process_count(), jax.device_count()) == (processes, 8), jax.devices()
    trainer, model = run((4, 2))
    out = {"process": jax.process_index(), "local_devices": jax.local_device_count(),
           "losses": losses(trainer),
           "o_spec": str(model.layers[0].attn.o.kernel[...].sharding.spec)}
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", nargs="?")
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--process-id", type=int, default=0)
    args = parser.parse_args()
    if args.processes:
        worker(args.processes, args.process_id)
    else:
        main(args.workdir)
