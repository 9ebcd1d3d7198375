"""Runs in a subprocess with 8 host CPU devices (see test_sharding.py); prints one JSON line.

For each mesh (data, model) it shards a Transformer with lab.parallel's rules
and measures, against the same model unsharded: the max |logit diff| of the
sharded forward and, where asked (each costs seconds of compilation), whether
lab.infer.generate gives the same greedy tokens (and the max |logprob diff|)
and the max |grad diff| of a cross-entropy loss. It
also records the placement of a few parameters so the test can check that the
weights really are split.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import hf, parallel
from lab.nn import Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4,
                           head_dim=8, d_ff=128, qk_norm=True, qkv_bias=True,
                           tie_embeddings=False, max_len=64)


def random_model(seed: int = 0) -> Transformer:
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(CONFIG, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(seed)

    def fill(tree, name=""):
        if isinstance(tree, dict):
            return {k: fill(v, str(k)) for k, v in tree.items()}
        noise = rng.standard_normal(tree.shape).astype(np.float32)
        return jnp.asarray(1.0 + 0.2 * noise if name == "weight" else 0.15 * noise)

    nnx.replace_by_pure_dict(state, fill(nnx.to_pure_dict(state)))
    return nnx.merge(graphdef, state)


def loss(model, tokens):
    logits = model(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


grad_fn = nnx.jit(nnx.grad(loss))


def placement(x) -> dict:
    return {"spec": str(x.sharding.spec), "shard": list(x.addressable_shards[0].data.shape),
            "devices": len(x.sharding.device_set)}


def main(meshes):
    timer = time.process_time
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, CONFIG.vocab_size, size=(8, 16)).astype(np.int32)
    mask = np.ones((8, 16), bool)
    mask[1, 12:] = False  # one padded row
    prompts = tokens[:, :6]

    ref_model = random_model()
    # The reference is jitted too, so the differences measure sharding alone (not fusion).
    forward = nnx.jit(lambda m, x, k: m(x, mask=k))
    ref_logits = np.asarray(forward(ref_model, jnp.asarray(tokens), jnp.asarray(mask)))
    checks = set().union(*(c for _, c in meshes))
    ref_gen = jax.device_get(_generate(ref_model, prompts)) if "gen" in checks else None
    ref_grads = jax.device_get(grad_fn(ref_model, jnp.asarray(tokens))) if "grad" in checks \
        else None

    out = {"max_abs_logit": float(np.abs(ref_logits).max())}
    for (data, model), checks in meshes:
        t0 = timer()
        mesh = parallel.make_mesh(data=data, model=model)
        sharded = parallel.shard_model(random_model(), mesh)
        logits = parallel.forward(sharded, tokens, mesh, mask=mask)
        attn = sharded.layers[0].attn
        res = out[f"{data}x{model}"] = {
            "logit_diff": float(np.abs(np.asarray(logits) - ref_logits).max()),
            "logits_spec": str(logits.sharding.spec),
            "cpu_s": {"forward": timer() - t0},
            "qkv": placement(attn.qkv.kernel[...]),
            "o": placement(attn.o.kernel[...]),
            "gate_up": placement(sharded.layers[0].mlp.gate_up.kernel[...]),
            "embed": placement(sharded.embed.embedding[...]),
            "norm": placement(sharded.norm.weight[...]),
        }
        if "gen" in checks:
            t0 = timer()
            gen = _generate(sharded, prompts)
            spec = gen.tokens.sharding.spec  # the rows' axis: split over "data"?
            res["gen_rows"] = str(spec[0]) if len(spec) else "None"
            gen = jax.device_get(gen)
            res["tokens_equal"] = bool(np.array_equal(gen.tokens, ref_gen.tokens))
            res["logprob_diff"] = float(np.abs(gen.logprobs - ref_gen.logprobs).max())
            res["cpu_s"]["generate"] = timer() - t0
        if "hf" in checks:  # lab.hf.load_pretrained(mesh=) places each slice directly
            t0 = timer()
            with tempfile.TemporaryDirectory() as tmp:
                hf.save_pretrained(random_model(), tmp)
                loaded = hf.load_pretrained(tmp, mesh=mesh)
            same = jax.tree.map(lambda a, b: a.sharding == b.sharding,
                                nnx.state(loaded), nnx.state(sharded))
            res["hf_same_placement"] = all(jax.tree.leaves(same))
            res["hf_logit_diff"] = float(np.abs(np.asarray(
                parallel.forward(loaded, tokens, mesh, mask=mask)) - ref_logits).max())
            res["cpu_s"]["hf"] = timer() - t0
        if "grad" in checks:
            t0 = timer()
            grads = grad_fn(sharded, parallel.shard_batch(jnp.asarray(tokens), mesh))
            res["grad_diff"] = max(
                float(np.abs(np.asarray(a) - b).max()) for a, b in
                zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True))
            res["cpu_s"]["grad"] = timer() - t0
    try:
        parallel.shard_batch({"inputs": np.zeros((3, 4), np.int32)}, parallel.make_mesh(data=2,
                                                                                       model=4))
        out["odd_batch_error"] = None
    except ValueError as e:
        out["odd_batch_error"] = str(e)
    print(json.dumps(out))


def _generate(model, prompts):
    from lab.infer import generate

    return generate(model, prompts, max_new_tokens=16)


if __name__ == "__main__":
    assert "xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")
    # Each argument: "DATAxMODEL" plus optional "+gen" / "+grad" checks, e.g. "2x4+gen+grad".
    requests = []
    for arg in sys.argv[1:]:
        shape, *checks = arg.split("+")
        requests.append((tuple(int(v) for v in shape.split("x")), set(checks)))
    main(requests)
