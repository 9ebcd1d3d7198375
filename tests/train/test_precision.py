"""bfloat16 mixed precision: the matmul and its gradients, the step's HLO, training quality."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.nn import Fused, Transformer, TransformerConfig
from lab.train import TrainConfig, Trainer, make_optimizer, sft_loss
from lab.train.step import MixedMatmul, compiled_step, step_config, use_mixed_matmul
from tests.train import train_job

LINEAR_DIMS = (((1,), (0,)), ((), ()))


def _operands(seed=0, m=24, k=16, n=12):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(m, k)), jnp.float32),
            jnp.asarray(rng.normal(size=(k, n)), jnp.float32),
            jnp.asarray(rng.normal(size=(m, n)), jnp.float32))


def _grads(dot, x, w, g):
    out, vjp = jax.vjp(lambda x, w: dot(x, w, LINEAR_DIMS), x, w)
    return out, *vjp(g)


def test_mixed_matmul_float32_matches_dot_general_with_its_gradients():
    x, w, g = _operands()
    ref = _grads(jax.lax.dot_general, x, w, g)
    got = _grads(MixedMatmul("float32"), x, w, g)
    for a, b in zip(ref, got, strict=True):
        assert b.dtype == jnp.float32
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_mixed_matmul_bfloat16_is_the_product_of_rounded_operands():
    """Forward and both gradients equal float32 products of the bf16-rounded operands."""
    x, w, g = _operands(1)
    r = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    out, dx, dw = _grads(MixedMatmul("bfloat16"), x, w, g)
    assert out.dtype == dx.dtype == dw.dtype == jnp.float32
    np.testing.assert_allclose(out, r(x) @ r(w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, r(g) @ r(w).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, r(x).T @ r(g), rtol=1e-5, atol=1e-5)
    # ... and differ from the float32 product by bf16 rounding (relative 2^-8 per operand).
    err = float(jnp.max(jnp.abs(out - x @ w)) / jnp.max(jnp.abs(x @ w)))
    assert 1e-4 < err < 2e-2, err


def test_mixed_matmul_other_contractions_and_dtypes():
    """A 3-D Linear input reshapes to 2-D; a batched contraction falls back to dot_general;
    a bfloat16 operand pair returns bfloat16, ``preferred_element_type`` wins."""
    rng = np.random.default_rng(2)
    x3 = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    mm = MixedMatmul("bfloat16")
    r = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    np.testing.assert_allclose(mm(x3, w, (((2,), (0,)), ((), ()))), r(x3) @ r(w), rtol=1e-5,
                               atol=1e-5)
    a = jnp.asarray(rng.normal(size=(3, 4, 6)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(3, 6, 5)), jnp.float32)
    batched = (((2,), (1,)), ((0,), (0,)))
    out = mm(a, b, batched)
    assert out.dtype == jnp.float32 and out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, jnp.einsum("bij,bjk->bik", r(a), r(b)), rtol=1e-5,
                               atol=1e-5)
    assert mm(x3.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
              (((2,), (0,)), ((), ()))).dtype == jnp.bfloat16
    assert mm(x3, w, (((2,), (0,)), ((), ())),
              preferred_element_type=jnp.bfloat16).dtype == jnp.bfloat16


def _dots(config: TrainConfig):
    """The (operand dtypes, result dtype) of every dot in the lowered train step."""
    model = train_job.build()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    step = compiled_step(graphdef, sft_loss, step_config(config), False)
    batch = jax.tree.map(jnp.asarray, train_job.batch_fn(0))
    text = step.lower(params, rest, make_optimizer(config).init(params), batch, jnp.int32(0),
                      jax.random.key(0)).as_text()
    sigs = re.findall(r"stablehlo\.dot_general[^\n]*: \(tensor<[0-9x]*x(\w+)>, "
                      r"tensor<[0-9x]*x(\w+)>\) -> tensor<[0-9x]*x(\w+)>", text)
    n_linear = sum(isinstance(m, (nnx.Linear, Fused)) for _, m in nnx.iter_modules(model))
    return sigs, n_linear


def test_bfloat16_step_runs_every_linear_product_in_bf16_with_f32_accumulation():
    sigs, n_linear = _dots(train_job.TRAIN.replace(precision="bfloat16"))
    bf16 = [s for s in sigs if s[0] == "bf16"]
    # Forward, input gradient and weight gradient of each projection (Linear, fused
    # q/k/v and gate/up): bf16 x bf16 -> f32.
    assert n_linear > 0 and len(bf16) == 3 * n_linear
    assert set(bf16) == {("bf16", "bf16", "f32")}
    # The rest (attention, the tied embedding's logits) stays float32.
    assert all(s == ("f32", "f32", "f32") for s in sigs if s[0] != "bf16")
    f32_sigs, _ = _dots(train_job.TRAIN)
    assert len(f32_sigs) == len(sigs) and all(s == ("f32", "f32", "f32") for s in f32_sigs)


def _counting_batch(step: int, vocab: int = 16, batch: int = 8, seq: int = 12) -> dict:
    """Rows counting up mod ``vocab`` from a random start: next token = token + 1."""
    rng = np.random.default_rng(step)
    x = (rng.integers(0, vocab, (batch, 1)) + np.arange(seq + 1)[None, :]) % vocab
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "mask": np.ones((batch, seq), np.float32)}


def test_bfloat16_training_lowers_the_loss_like_float32():
    """Same model, data and recipe: the bf16 run's losses track the float32 run's."""
    model_cfg = TransformerConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2,
                                  n_kv_heads=1, head_dim=16, d_ff=64, max_len=16)
    cfg = TrainConfig(steps=60, learning_rate=1e-2, warmup_steps=5, log_every=1,
                      checkpoint_every=0, progress=False)
    losses = {}
    for precision in ("float32", "bfloat16"):
        trainer = Trainer(Transformer(model_cfg, rngs=nnx.Rngs(0)), sft_loss,
                          cfg.replace(precision=precision))
        model = trainer.fit(_counting_batch)
        losses[precision] = np.array([r["loss"] for r in trainer.history])
        assert all(x.dtype == np.float32 for x in train_job.leaves(model))
    f32, bf16 = losses["float32"], losses["bfloat16"]
    assert abs(bf16[0] - f32[0]) < 0.01  # same start, up to the bf16 rounding of the products
    # float32 goes from 2.836 to 0.030 (last five steps' mean), bfloat16 to 0.030 as well.
    assert f32[-5:].mean() < 0.05 * f32[0]
    assert abs(bf16[-5:].mean() - f32[-5:].mean()) < 0.1 * f32[-5:].mean()
    assert np.max(np.abs(bf16 - f32)) < 0.01


def test_bfloat16_needs_float32_master_weights():
    model = Transformer(train_job.MODEL.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"TrainConfig.precision='bfloat16'.*bfloat16"):
        Trainer(model, sft_loss, train_job.TRAIN.replace(precision="bfloat16")).fit(
            train_job.batch_fn)


def test_use_mixed_matmul_refuses_a_custom_dot_general():
    layer = nnx.Linear(4, 4, rngs=nnx.Rngs(0), dot_general=lambda *a, **k: None)
    with pytest.raises(ValueError, match="TrainConfig.precision='bfloat16'.*dot_general"):
        use_mixed_matmul(layer)
    plain = use_mixed_matmul(nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    assert plain.dot_general == MixedMatmul("bfloat16")
