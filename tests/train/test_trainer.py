"""Trainer: determinism, exact resume after SIGKILL, corrupt-checkpoint fallback, accumulation."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from lab.train import TrainConfig, Trainer, sft_loss
from tests.train import train_job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y)
                                    for x, y in zip(a, b, strict=True))


def _uninterrupted(tmp_path_factory, precision: str):
    workdir = str(tmp_path_factory.mktemp(f"uninterrupted_{precision}"))
    model = Trainer(train_job.build(), sft_loss, train_job.TRAIN.replace(precision=precision),
                    workdir=workdir).fit(train_job.batch_fn)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return train_job.leaves(model), f.read()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of train_job: (final params, metrics.jsonl text)."""
    return _uninterrupted(tmp_path_factory, "float32")


@pytest.fixture(scope="module")
def reference_bf16(tmp_path_factory):
    """The same run under bfloat16 mixed precision."""
    return _uninterrupted(tmp_path_factory, "bfloat16")


def test_same_seed_gives_bitwise_equal_params(reference):
    cfg = train_job.TRAIN
    a = Trainer(train_job.build(), sft_loss, cfg).fit(train_job.batch_fn)
    assert _equal(train_job.leaves(a), reference[0])  # no workdir == with workdir
    b = Trainer(train_job.build(), sft_loss, cfg).fit(train_job.batch_fn)
    assert _equal(train_job.leaves(b), train_job.leaves(a))
    init = train_job.leaves(train_job.build())
    assert not _equal(train_job.leaves(a), init)  # it trained


@pytest.mark.parametrize("precision", ["float32", pytest.param("bfloat16", marks=pytest.mark.deep)])
def test_sigkill_then_restart_resumes_exactly(precision, request, tmp_path):
    """SIGKILL a training process after its first checkpoint; a restart ends bitwise equal.

    Under bfloat16 mixed precision too: the checkpoint holds the float32 master weights
    and optimizer state, so the resumed run continues the same float32 numbers."""
    reference = request.getfixturevalue("reference" if precision == "float32"
                                        else "reference_bf16")
    train = train_job.TRAIN.replace(precision=precision)
    workdir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "tests.train.train_job", workdir, "0.25",
                             precision],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    first = os.path.join(workdir, "checkpoints", "5")
    deadline = time.time() + 300
    while not os.path.isdir(first) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.isdir(first), "the job never wrote its first checkpoint"
    steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))
                   if s.isdigit())
    assert steps and steps[-1] < train_job.TRAIN.steps, f"killed too late: {steps}"
    assert not os.path.exists(os.path.join(workdir, "final.npz"))

    # Restart in the same workdir (in this process, where the step is already compiled).
    trainer = Trainer(train_job.build(), sft_loss, train, workdir=workdir)
    model = trainer.fit(train_job.batch_fn)
    assert all(x.dtype == np.float32 for x in train_job.leaves(model))
    assert _equal(train_job.leaves(model), reference[0])
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        text = f.read()
    recorded = [json.loads(line)["step"] for line in text.splitlines()]
    assert recorded == list(range(1, train_job.TRAIN.steps + 1))  # no duplicates, no gaps
    assert text == reference[1]
    assert [r["step"] for r in trainer.history] == recorded


def test_corrupt_latest_checkpoint_falls_back_to_previous(reference, tmp_path, caplog):
    workdir = str(tmp_path / "run")
    Trainer(train_job.build(), sft_loss, train_job.TRAIN, workdir=workdir).fit(train_job.batch_fn)
    ckdir = os.path.join(workdir, "checkpoints")
    assert sorted(int(s) for s in os.listdir(ckdir)) == [10, 15, 20]  # keep_checkpoints=3
    newest = os.path.join(ckdir, "20")
    for dirpath, _, files in os.walk(newest):  # overwrite every file of the newest save
        for name in files:
            with open(os.path.join(dirpath, name), "r+b") as f:
                size = max(os.path.getsize(f.name), 8)
                f.write(b"\x13" * size)
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(train_job.build(), sft_loss, train_job.TRAIN, workdir=workdir)
        model = trainer.fit(train_job.batch_fn)
    assert any("corrupt" in r.getMessage() and newest in r.getMessage() for r in caplog.records)
    assert [r["step"] for r in trainer.history] == list(range(1, 21))
    assert _equal(train_job.leaves(model), reference[0])
    assert sorted(int(s) for s in os.listdir(ckdir)) == [10, 15, 20]


def test_damaged_array_bytes_are_detected(reference, tmp_path, caplog):
    """Flipped bytes inside the array data (metadata intact) are caught.

    Orbax restores such damage silently as wrong numbers; the SHA-256 digest kept
    in the checkpoint's meta item catches it.
    """
    workdir = str(tmp_path / "run")
    Trainer(train_job.build(), sft_loss, train_job.TRAIN, workdir=workdir).fit(train_job.batch_fn)
    data = os.path.join(workdir, "checkpoints", "20", "state", "ocdbt.process_0", "d")
    for name in os.listdir(data):
        with open(os.path.join(data, name), "r+b") as f:
            raw = bytearray(f.read())
            for frac in (0.25, 0.5, 0.75):
                raw[int(len(raw) * frac)] ^= 0xFF
            f.seek(0)
            f.write(raw)
    # A save killed half-way leaves an orbax temporary directory; it must be ignored.
    partial = os.path.join(workdir, "checkpoints", "25.orbax-checkpoint-tmp-1")
    os.makedirs(os.path.join(partial, "state"))
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(train_job.build(), sft_loss, train_job.TRAIN.replace(steps=20),
                          workdir=workdir)
        model = trainer.fit(train_job.batch_fn)
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert _equal(train_job.leaves(model), reference[0])
    assert not os.path.exists(partial)


def test_grad_accum_rng_and_eval_hook(reference):
    """grad_accum=2 equals the full batch; the loss gets the step's key; eval_fn is called.

    train_job's batches have a different number of loss tokens in each half, so
    equality needs the token-weighted accumulation (the loss is a token mean).
    """
    cfg = train_job.TRAIN.replace(grad_accum=2, eval_every=5)
    full = json_lines(reference[1])
    seen = []

    def loss_fn(model, batch, rng):
        loss, metrics = sft_loss(model, batch)
        return loss, dict(metrics, u=jax.random.uniform(rng))

    def eval_fn(model, step):
        seen.append(step)
        return {"mean_param": float(np.mean(train_job.leaves(model)[0]))}

    trainer = Trainer(train_job.build(), loss_fn, cfg)
    model = trainer.fit(train_job.batch_fn, eval_fn)
    for r1, r2 in zip(full, trainer.history, strict=True):
        assert r1["step"] == r2["step"] and r1["tokens"] == r2["tokens"]
        assert abs(r1["loss"] - r2["loss"]) < 1e-6
    # The first update sees identical parameters: the gradients agree to float32 rounding.
    assert abs(full[0]["grad_norm"] - trainer.history[0]["grad_norm"]) < 1e-6
    for x, y in zip(reference[0], train_job.leaves(model), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)

    assert seen == [5, 10, 15, 20]
    assert [k for k in trainer.history[4] if k.startswith("eval/")] == ["eval/mean_param"]
    # u: the micro-batches' uniform(fold_in(fold_in(key(seed), step), i)), token-weighted.
    step = 7
    mask = train_job.batch_fn(step)["mask"]
    tokens = np.array([mask[:2].sum(), mask[2:].sum()])
    key = jax.random.fold_in(jax.random.key(cfg.seed), step)
    u = np.array([float(jax.random.uniform(jax.random.fold_in(key, i))) for i in range(2)])
    assert abs(trainer.history[step]["u"] - (tokens * u).sum() / tokens.sum()) < 1e-6

    with pytest.raises(ValueError, match="grad_accum=3"):
        Trainer(train_job.build(), sft_loss, cfg.replace(grad_accum=3)).fit(train_job.batch_fn)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("field,value", [("optimizer", "lion"), ("schedule", "exponential"),
                                         ("learning_rate", -1e-3), ("grad_accum", 0),
                                         ("precision", "float16")])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        TrainConfig(**{field: value})
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        TrainConfig.from_dict({field: value})


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match="'lr'"):
        TrainConfig.from_dict({"lr": 1e-3})


def test_policy_gradient_training_moves_logprobs_with_the_advantage():
    """A few GRPO updates (grad_accum=2) raise the log-prob of the rewarded completions."""
    from lab.train import PolicyGradientLoss, token_logprobs

    batch = train_job.batch_fn(0)
    batch = dict(batch, advantages=np.array([1.0, -1.0, 1.0, -1.0], np.float32))
    model = train_job.build()
    before = np.asarray(token_logprobs(model, batch["inputs"], batch["targets"]))
    cfg = train_job.TRAIN.replace(steps=4, warmup_steps=0, grad_accum=2, schedule="constant")
    model = Trainer(model, PolicyGradientLoss(clip_eps=0.2), cfg).fit(lambda step: batch)
    after = np.asarray(token_logprobs(model, batch["inputs"], batch["targets"]))
    change = ((after - before) * batch["mask"]).sum(1) / batch["mask"].sum(1)
    assert np.all(change[[0, 2]] > 0) and np.all(change[[1, 3]] < 0), change


class DropoutNet(nnx.Module):
    """A tiny LM whose state holds an RNG stream (dropout): the Trainer must carry and save it."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(16, 8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8, 16, rngs=rngs)

    def __call__(self, x, mask=None, positions=None):
        return self.out(self.drop(self.embed(x)))


def test_crash_and_resume_with_rng_state_in_the_model(tmp_path):
    cfg = train_job.TRAIN.replace(steps=6, checkpoint_every=2, warmup_steps=0)
    ref = Trainer(DropoutNet(nnx.Rngs(0, dropout=1)), sft_loss, cfg).fit(train_job.batch_fn)

    def flat(model):  # every leaf of the model's state, PRNG keys as their key data
        return [np.asarray(jax.random.key_data(x)
                           if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
                for x in jax.tree.leaves(nnx.state(model))]

    ref_state = flat(ref)

    def crashing(step):
        if step == 3:
            raise RuntimeError("simulated crash")
        return train_job.batch_fn(step)

    workdir = str(tmp_path / "run")
    with pytest.raises(RuntimeError, match="simulated crash"):
        Trainer(DropoutNet(nnx.Rngs(0, dropout=1)), sft_loss, cfg, workdir=workdir).fit(crashing)
    model = Trainer(DropoutNet(nnx.Rngs(0, dropout=1)), sft_loss, cfg, workdir=workdir).fit(
        train_job.batch_fn)
    assert _equal(flat(model), ref_state)
    count = [np.asarray(v) for p, v in nnx.to_flat_state(nnx.state(model, nnx.RngCount))]
    assert count and int(count[0]) == 6  # one dropout draw per step, carried through the step
