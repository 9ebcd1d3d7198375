"""lab.parallel on 8 CPU devices: sharded logits, generation and gradients equal unsharded ones.

The multi-device part runs `sharded_check.py` in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before
JAX starts, and this process has already started it). Tolerance: 1e-5 absolute
on logits of magnitude ~6, log-probs and gradients.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from lab import parallel
from lab.nn import Transformer, TransformerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-5
# Forward and generation on every mesh; gradients on the mixed one.
# Loading a checkpoint straight onto the mesh (lab.hf) is checked on the mixed one too.
REQUESTS = ["8x1+gen", "2x4+gen+grad+hf", "1x8+gen"]


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                     " --xla_force_host_platform_device_count=8").strip(),
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                        "sharded_check.py"), *REQUESTS],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mesh", ["8x1", "2x4", "1x8"])
def test_sharded_logits_equal_unsharded(measured, mesh):
    res = measured[mesh]
    print(f"{mesh}: max |logit diff| {res['logit_diff']:.2e} "
          f"(max |logit| {measured['max_abs_logit']:.2f}), cpu s {res['cpu_s']}")
    assert measured["max_abs_logit"] > 1.0  # the comparison is not between near-zero logits
    assert res["logit_diff"] < ATOL


def test_weights_are_split_as_the_rules_say(measured):
    # 2x4: every projection splits 4 ways. The fused q/k/v [D=64, Hkv=4, G+2=4, hd=8]
    # splits its KV heads: one KV group (2 queries, its key and value) per device.
    r = measured["2x4"]
    assert (r["qkv"]["spec"], r["qkv"]["shard"]) == ("P(None, 'model')", [64, 1, 4, 8])
    assert (r["o"]["spec"], r["o"]["shard"]) == ("P('model', None)", [16, 64])
    # gate/up [D, 2, F=128] splits F: each device holds matching gate and up columns.
    assert (r["gate_up"]["spec"], r["gate_up"]["shard"]) == ("P(None, None, 'model')",
                                                             [64, 2, 32])
    assert r["embed"]["shard"] == [32, 64]
    assert r["norm"] == {"spec": "P()", "shard": [64], "devices": 8}
    assert r["logits_spec"] == "P('data', None, 'model')"
    # 1x8: 4 KV heads cannot split 8 ways, so q/k/v is replicated; o splits one head each.
    r = measured["1x8"]
    assert (r["qkv"]["spec"], r["qkv"]["shard"]) == ("P(None, None)", [64, 4, 4, 8])
    assert r["o"]["shard"] == [8, 64]
    assert r["embed"]["shard"] == [16, 64]
    # 8x1: pure data parallelism, weights whole on every device, batch split.
    r = measured["8x1"]
    assert r["qkv"]["shard"] == [64, 4, 4, 8] and r["logits_spec"] == "P('data',)"


@pytest.mark.parametrize("mesh", ["8x1", "2x4", "1x8"])
def test_sharded_generate_equals_unsharded(measured, mesh):
    res = measured[mesh]
    assert res["tokens_equal"]
    assert res["logprob_diff"] < ATOL


def test_generate_splits_the_batch_over_data(measured):
    # 8 rows over data=8 and data=2: each data group decodes its own rows.
    assert measured["8x1"]["gen_rows"] == "data"
    assert measured["2x4"]["gen_rows"] == "data"
    assert measured["1x8"]["gen_rows"] == "None"  # one data group: every device has every row


def test_sharded_gradients_equal_unsharded(measured):
    assert measured["2x4"]["grad_diff"] < ATOL


def test_checkpoint_loads_straight_onto_the_mesh(measured):
    res = measured["2x4"]
    assert res["hf_same_placement"]  # what shard_model gives
    assert res["hf_logit_diff"] < ATOL


def test_batch_not_divisible_by_data_axis_is_named(measured):
    assert measured["odd_batch_error"] == ("mesh axis 'data' (size 2) does not divide the batch "
                                           "dimension of ['inputs'] (size 3); expected a batch "
                                           "that is a multiple of 2")


CONFIG = TransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4,
                           head_dim=8, d_ff=128, qkv_bias=True, tie_embeddings=False)


def test_every_parameter_has_a_rule():
    abstract = nnx.eval_shape(lambda: Transformer(CONFIG, rngs=nnx.Rngs(0)))
    paths = [parallel.path_str(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(nnx.state(abstract))[0]]
    assert len(paths) == 3 + 2 * 9  # embed, norm, lm_head; 9 per layer (q/k/v and gate/up fused)
    unmatched = [p for p in paths if not any(re.search(r, p) for r, _ in parallel.RULES)]
    assert unmatched == []


def test_spec_for_keeps_heads_whole_and_drops_axes_that_do_not_divide():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    # Fused q/k/v [D, Hkv, G+2, hd]: 4 KV heads split 4 ways, 2 would not -> replicated.
    assert parallel.spec_for("layers/0/attn/qkv/kernel", (64, 4, 4, 8), mesh, head_dim=8) == \
        P(None, "model")
    assert parallel.spec_for("layers/0/attn/qkv/kernel", (64, 2, 4, 16), mesh,
                             head_dim=16) == P(None, None)
    # o [H*hd, D]: 2 heads of 16 rows: 32 rows divide by 4, but heads do not -> replicated.
    assert parallel.spec_for("layers/0/attn/o/kernel", (32, 64), mesh, head_dim=16) == P(None, None)
    assert parallel.spec_for("layers/0/attn/o/kernel", (64, 64), mesh, head_dim=16) == \
        P("model", None)
    assert parallel.spec_for("embed/embedding", (130, 64), mesh) == P(None, None)
    assert parallel.spec_for("layers/1/mlp/down/kernel", (128, 64), mesh) == P("model", None)
    assert parallel.spec_for("layers/1/attn_norm/weight", (64,), mesh) == P()
    assert parallel.spec_for("something/new", (3, 3), mesh) == P()


def test_make_mesh_validates_sizes():
    n = jax.device_count()
    mesh = parallel.make_mesh()
    assert mesh.axis_names == ("data", "model") and mesh.shape["data"] == n
    with pytest.raises(ValueError, match=rf"data \* model == {n} devices"):
        parallel.make_mesh(data=n + 1, model=1)
    with pytest.raises(ValueError, match=r"model=0"):
        parallel.make_mesh(model=0)
