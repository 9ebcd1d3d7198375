"""lab.train.Trainer on a device mesh: sharded losses equal unsharded, FSDP, resharded resume,
SIGKILL resume on a mesh, two processes on localhost, and meshes that do not fit.

The 8-device parts run in subprocesses with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see test_sharding.py); the
two-process test starts two processes with 4 devices each that find each other
through ``lab.parallel.initialize`` (JAX's coordinator on localhost, gloo CPU
collectives). Tolerance on losses: 1e-5 absolute (losses ~5.5).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from lab import parallel
from lab.train import Trainer, sft_loss
from tests.train import train_job

# The 8-device sharded-training equivalences take minutes; tests/parallel/test_sharding.py
# keeps the sharded forward in the README's test command.
pytestmark = pytest.mark.deep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
ATOL = 1e-5


def _env(devices: int, **extra) -> dict:
    return dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={devices}").strip(),
                JAX_PLATFORMS="cpu",
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("sharded_train"))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "train_check.py"), workdir],
                          env=_env(8), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _close(a, b) -> float:
    assert len(a) == len(b) == 5
    return float(np.abs(np.subtract(a, b)).max())


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8x1", "4x2", "2x4", "8x1_fsdp", "2x4_fsdp"])
def test_sharded_losses_equal_unsharded(measured, mesh):
    diff = _close(measured[mesh]["losses"], measured["ref_losses"])
    print(f"{mesh}: max |loss diff| {diff:.2e}, cpu s of the whole check {measured['cpu_s']:.0f}")
    assert diff < ATOL
    assert len(set(measured["ref_losses"])) == 5  # it trained: the losses move


@pytest.mark.slow
def test_weights_and_optimizer_state_are_split(measured):
    # The fused q/k/v [D=64, Hkv=4, G+2=4, hd=8]: KV heads on "model"; FSDP adds D on "data".
    assert measured["8x1"]["qkv_spec"] == "P(None, None)"
    assert measured["2x4"]["qkv_spec"] == "P(None, 'model')"
    assert measured["8x1_fsdp"]["qkv_spec"] == "P('data',)"
    assert measured["2x4_fsdp"]["qkv_spec"] == "P('data', 'model')"
    # FSDP on 8 data devices: each holds 1/8 of the parameters + Adam moments (within 10%).
    full, fsdp = measured["bytes_fsdp=False"], measured["bytes_fsdp=True"]
    assert abs(full / fsdp - 8) < 0.8, (full, fsdp)


@pytest.mark.slow
def test_gradient_accumulation_on_a_mesh(measured):
    assert _close(measured["4x2_accum"]["losses"], measured["ref_accum_losses"]) < ATOL


@pytest.mark.slow
def test_saved_on_8x1_resumes_on_2x4(measured):
    res = measured["restore"]
    assert res["param_diff"] == 0.0  # restored bit for bit, onto the other layout
    assert (res["o_spec"], res["mesh_devices"]) == ("P('model', None)", 8)
    # Steps 1-3 ran on (8, 1), 4-5 on (2, 4): the losses of the uninterrupted run.
    assert _close(res["losses"], measured["ref_losses"]) < ATOL


@pytest.mark.slow
def test_meshes_that_do_not_fit_are_named(measured):
    errors = measured["errors"]
    assert errors["batch"] == ("mesh axis 'data' (size 8) does not divide the batch dimension "
                               "of ['inputs'] (size 6); expected a batch that is a multiple "
                               "of 8")
    assert errors["micro_batch"].startswith(
        "mesh axis 'data' (size 8) does not divide the micro-batch dimension of ['inputs'] "
        "(size 2 = batch 8 / TrainConfig.grad_accum=4)")
    assert errors["rule"].startswith("mesh axis 'model' (size 8) does not divide dimension 1 "
                                     "of layers/0/attn/qkv/kernel (size 4)")


@pytest.mark.slow
def test_sigkill_then_restart_on_a_mesh_resumes_exactly(tmp_path):
    """train_job on a (4, 2) mesh: killed after its first checkpoint and restarted, it ends
    with the parameters and metrics of an uninterrupted (4, 2) run, bit for bit."""
    def job(workdir, sleep):
        return subprocess.Popen([sys.executable, "-m", "tests.train.train_job", workdir,
                                 str(sleep), "float32", "4x2"], cwd=ROOT, env=_env(8),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    ref, killed = job(ref_dir, 0), job(run_dir, 0.5)
    first = os.path.join(run_dir, "checkpoints", "5")
    deadline = time.time() + 300
    while not os.path.isdir(first) and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert os.path.isdir(first), "the job never wrote its first checkpoint"
    assert not os.path.exists(os.path.join(run_dir, "final.npz")), "killed too late"
    assert ref.wait(timeout=600) == 0, ref.stderr.read()[-4000:]
    restart = job(run_dir, 0)
    assert restart.wait(timeout=600) == 0, restart.stderr.read()[-4000:]
    a, b = np.load(os.path.join(ref_dir, "final.npz")), np.load(os.path.join(run_dir,
                                                                             "final.npz"))
    assert len(a.files) == len(b.files) == 10
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a.files)
    with open(os.path.join(ref_dir, "metrics.jsonl")) as f1, \
            open(os.path.join(run_dir, "metrics.jsonl")) as f2:
        assert f1.read() == f2.read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_on_localhost_agree_with_one(measured):
    """Two processes of 4 CPU devices each form one (4, 2) mesh and train as one process does."""
    if "jax_cpu_collectives_implementation" not in jax.config.values:
        pytest.skip(f"jax {jax.__version__} has no CPU collectives "
                    "(jax_cpu_collectives_implementation), so two CPU processes cannot "
                    "run one sharded step")
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "train_check.py"), "--processes", "2",
         "--process-id", str(i)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env(4, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                            JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)))
        for i in range(2)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-4000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert [o["process"] for o in outs] == [0, 1]
    assert [o["local_devices"] for o in outs] == [4, 4]
    assert outs[0]["o_spec"] == "P('model', None)"
    assert outs[0]["losses"] == outs[1]["losses"]  # one program, one set of numbers
    assert _close(outs[0]["losses"], measured["4x2"]["losses"]) < ATOL
    assert _close(outs[0]["losses"], measured["ref_losses"]) < ATOL


# In-process (one device): layouts and argument checks.

def test_fsdp_splits_the_largest_free_dimension_over_data():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    spec = parallel.spec_for
    assert spec("layers/0/attn/qkv/kernel", (64, 4, 4, 8), mesh, head_dim=8, fsdp=True) == \
        P("data", "model")
    assert spec("layers/0/mlp/down/kernel", (128, 64), mesh, fsdp=True) == P("model", "data")
    assert spec("norm/weight", (64,), mesh, fsdp=True) == P("data")
    assert spec("norm/weight", (63,), mesh, fsdp=True) == P()  # nothing divides: replicated
    # The optimizer state's paths end in the parameter's: the same layout.
    assert spec("1/0/mu/layers/0/mlp/down/kernel", (128, 64), mesh, fsdp=True) == \
        P("model", "data")
    assert spec("0/count", (), mesh, fsdp=True) == P()


def test_strict_rules_name_the_axis_the_dimension_and_both_sizes():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    assert parallel.spec_for("embed/embedding", (130, 64), mesh) == P(None, None)
    with pytest.raises(ValueError, match=r"mesh axis 'model' \(size 4\) does not divide "
                                         r"dimension 0 of embed/embedding \(size 130\)"):
        parallel.spec_for("embed/embedding", (130, 64), mesh, strict=True)
    with pytest.raises(ValueError, match=r"dimension 0 of layers/0/attn/o/kernel \(size 32 = "
                                         r"2 heads of 16\)"):
        parallel.spec_for("layers/0/attn/o/kernel", (32, 64), mesh, head_dim=16, strict=True)


def test_trainer_mesh_arguments_are_checked():
    cfg = train_job.TRAIN
    with pytest.raises(ValueError, match=r"fsdp=True\) without a mesh"):
        Trainer(train_job.build(), sft_loss, cfg, fsdp=True)
    with pytest.raises(ValueError, match=r"rules=given.*without a mesh"):
        Trainer(train_job.build(), sft_loss, cfg, rules=parallel.RULES)
    bad = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
    with pytest.raises(ValueError, match=r"expected a jax.sharding.Mesh with a 'data' axis"):
        Trainer(train_job.build(), sft_loss, cfg, mesh=bad)


def test_one_device_mesh_trains_like_no_mesh():
    """A (1, 1) mesh runs the sharded path; its numbers are the single device's."""
    cfg = train_job.TRAIN.replace(steps=3)
    a = Trainer(train_job.build(), sft_loss, cfg)
    a.fit(train_job.batch_fn)
    b = Trainer(train_job.build(), sft_loss, cfg,
                mesh=parallel.make_mesh(1, 1, devices=jax.devices()[:1]))
    model = b.fit(train_job.batch_fn)
    assert [r["loss"] for r in b.history] == pytest.approx([r["loss"] for r in a.history],
                                                           abs=1e-6)
    assert isinstance(model.embed.embedding[...].sharding, jax.sharding.NamedSharding)


def test_single_device_checkpoint_resumes_on_a_mesh(tmp_path):
    """A run saved without a mesh continues on a (1, 1) mesh: same losses, state on the mesh."""
    cfg = train_job.TRAIN.replace(steps=6, checkpoint_every=3, schedule="constant",
                                  warmup_steps=0)
    ref = Trainer(train_job.build(), sft_loss, cfg)
    ref.fit(train_job.batch_fn)
    workdir = str(tmp_path / "run")
    Trainer(train_job.build(), sft_loss, cfg.replace(steps=3), workdir).fit(train_job.batch_fn)
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    trainer = Trainer(train_job.build(), sft_loss, cfg, workdir, mesh=mesh)
    model = trainer.fit(train_job.batch_fn)
    assert [r["step"] for r in trainer.history] == list(range(1, 7))
    assert [r["loss"] for r in trainer.history] == pytest.approx(
        [r["loss"] for r in ref.history], abs=1e-6)
    assert model.embed.embedding[...].sharding.mesh.shape == mesh.shape
