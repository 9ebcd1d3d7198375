"""TransformerConfig.qk_smear: queries and keys mixed over the previous tokens of the same
sequence, exact under packing, padding, cached decoding (both decode paths) and eviction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.hf import config_to_hf
from lab.infer import decode
from lab.nn import KVCache, Transformer, TransformerConfig
from lab.nn.layers import causal_smear, last_tokens

# init_std=0.3: varied attention, so a wrong smear term shows in the logits.
CFG = TransformerConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, d_ff=128, max_len=32, rope_theta=5000.0, init_std=0.3,
                        qk_smear=2)


@pytest.fixture(scope="module")
def model():
    m = Transformer(CFG, rngs=nnx.Rngs(0))
    # Distinct weights per lag, head and channel (the init is a constant 0.3).
    for layer in m.layers:
        a = layer.attn
        a.q_smear[...] = jax.random.uniform(jax.random.key(1), a.q_smear.shape, minval=-1, maxval=1)
        a.k_smear[...] = jax.random.uniform(jax.random.key(2), a.k_smear.shape, minval=-1, maxval=1)
    return m


def tokens(b=2, t=12, seed=1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, CFG.vocab_size)


def test_causal_smear_matches_a_loop():
    x = jax.random.normal(jax.random.key(0), (1, 7, 3, 4))
    w = jax.random.normal(jax.random.key(1), (2, 3, 4))
    pos = jnp.array([[0, 1, 2, 0, 1, 2, 3]])  # two packed examples
    prev = jnp.zeros((1, 2, 3, 4))
    out = causal_smear(x, pos, w, prev, jnp.full((1, 2), -1))
    want = np.array(x)
    for t in range(7):
        for i in (1, 2):
            if t - i >= 0 and pos[0, t - i] == pos[0, t] - i:
                want[0, t] += np.asarray(w[i - 1] * x[0, t - i])
    np.testing.assert_allclose(out, want, atol=1e-6)
    # The second example's first tokens get nothing from the first example.
    np.testing.assert_allclose(out[0, 3], x[0, 3])


def test_last_tokens_keeps_the_latest_valid_tokens():
    prev = jnp.arange(2.0)[None, :, None] + 100          # tail tokens at positions 3, 4
    x = jnp.arange(3.0)[None, :, None]
    tail, pos = last_tokens(prev, jnp.array([[3, 4]]), x, jnp.array([[5, -1, -1]]))
    np.testing.assert_array_equal(pos, [[4, 5]])
    np.testing.assert_array_equal(tail[0, :, 0], [101.0, 0.0])
    tail, pos = last_tokens(jnp.zeros((1, 2, 1)), jnp.full((1, 2), -1), x[:, :1],
                            jnp.array([[0]]))
    np.testing.assert_array_equal(pos, [[-1, 0]])  # fewer tokens than the tail holds


def test_smear_changes_the_model_and_is_counted(model):
    x = tokens()
    plain = Transformer(CFG.replace(qk_smear=0), rngs=nnx.Rngs(0))
    assert float(jnp.abs(model(x) - plain(x)).max()) > 0.1
    n = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == CFG.num_params() == plain.config.num_params() + 2 * 2 * (4 + 2) * 16


@pytest.mark.deep
def test_packed_examples_equal_examples_alone(model):
    x = tokens(b=1, t=12)
    positions = jnp.concatenate([jnp.arange(5), jnp.arange(7)])[None]
    segment = jnp.concatenate([jnp.zeros(5, int), jnp.ones(7, int)])
    same = segment[:, None] == segment[None, :]
    packed = model(x, positions=positions, mask=same[None, None])
    np.testing.assert_allclose(packed[:, :5], model(x[:, :5]), atol=1e-5)
    np.testing.assert_allclose(packed[:, 5:], model(x[:, 5:]), atol=1e-5)


def test_padding_is_never_smeared_in(model):
    x = tokens(b=1, t=8)
    left = jnp.concatenate([jnp.full((1, 3), 7, x.dtype), x], 1)
    valid = jnp.arange(11)[None] >= 3
    positions = jnp.maximum(jnp.arange(11)[None] - 3, 0)
    np.testing.assert_allclose(model(left, positions=positions, mask=valid)[:, 3:], model(x),
                               atol=1e-5)


def test_both_decode_paths_equal_the_full_forward(model):
    x = tokens()
    full = model(x)
    for fused in (False, True):
        logits, cache = model(x[:, :7], cache=KVCache.init(CFG, 2, 16))
        out = [logits]
        for i in range(7, 12):
            if fused:
                step, cache, _ = decode.step(model, cache, x[:, i], jnp.full((2,), i))
                step = step[:, None]
            else:
                step, cache = model(x[:, i:i + 1], cache=cache)
            out.append(step)
        np.testing.assert_allclose(jnp.concatenate(out, 1), full, atol=1e-4)
        np.testing.assert_array_equal(cache.tail_positions, [[10, 11], [10, 11]])


@pytest.mark.deep
def test_generation_with_and_without_eviction(model):
    rows = [list(np.asarray(tokens(b=1, t=14, seed=3)[0])), list(np.asarray(tokens(b=1, t=9)[0]))]
    out = infer.generate(model, rows, max_new_tokens=5)
    for b, row in enumerate(rows):
        seq = jnp.asarray(row + list(np.asarray(out.tokens[b])))[None]
        want = model(seq)[0, len(row) - 1:-1].argmax(-1)
        np.testing.assert_array_equal(out.tokens[b], want)
    # An evicting policy keeps the tail (the current tokens' context) and its window
    # queries are the full forward's smeared ones: nothing evicted = same tokens.
    for policy in ("snapkv", "tova", "h2o"):
        kept = infer.generate(model, rows, max_new_tokens=5, policy=policy, ratio=0.0)
        np.testing.assert_array_equal(kept.tokens, out.tokens)
    evicted = infer.generate(model, rows, max_new_tokens=5, policy="snapkv", ratio=0.5)
    assert evicted.tokens.shape == (2, 5)


def test_bad_config_cache_and_export_are_refused(model):
    plain_cache = KVCache.init(CFG.replace(qk_smear=0), 1, 8)
    with pytest.raises(ValueError, match="qk_smear=2 but the KVCache's qk_tail holds None"):
        model(jnp.zeros((1, 3), jnp.int32), cache=plain_cache)
    with pytest.raises(ValueError, match="KVCache.init"):
        decode.step(model, plain_cache, jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32))
    with pytest.raises(ValueError, match="qk_smear=-1"):
        TransformerConfig(qk_smear=-1)
    with pytest.raises(ValueError, match="qk_smear=2 has no Hugging Face"):
        config_to_hf(CFG)


def test_window_queries_are_the_full_forward_queries(model):
    # SnapKV/TOVA score with the prompt's last queries; with a smear each of them mixes
    # in the tokens before it. prefill's window is the full forward's own queries.
    x = np.asarray(tokens())
    lengths = np.array([12, 9])
    _, _, stats = infer.prefill(model, x, lengths=lengths, return_stats=("queries",), window=4)
    np.testing.assert_array_equal(stats.query_positions, [[8, 9, 10, 11], [5, 6, 7, 8]])
    _, inter = model(jnp.asarray(x), capture=("queries",))          # [L, B, H, T, hd]
    _, short = model(jnp.asarray(x[1:, :9]), capture=("queries",))   # row 1 alone, unpadded
    np.testing.assert_allclose(stats.queries[:, 0], inter.queries[:, 0, :, 8:12], atol=1e-5)
    np.testing.assert_allclose(stats.queries[:, 1], short.queries[:, 0, :, 5:9], atol=1e-5)
    # The smear matters: the same queries without it differ.
    flat = Transformer(CFG.replace(qk_smear=0), rngs=nnx.Rngs(0))
    _, plain = flat(jnp.asarray(x), capture=("queries",))
    assert float(jnp.abs(plain.queries[:, 0, :, 8:12] - stats.queries[:, 0]).max()) > 1e-3


def _mqar(rng, n, pairs=8, queries=4, n_keys=32, n_values=32):
    """Token-id MQAR with a separator: ``k = v`` pairs, then ``k = ?`` queries; the
    loss and the accuracy are on the queried values."""
    eq = n_keys + n_values
    ks = np.stack([rng.choice(n_keys, pairs, replace=False) for _ in range(n)])
    vs = n_keys + rng.integers(0, n_values, (n, pairs))
    qi = np.stack([rng.choice(pairs, queries, replace=False) for _ in range(n)])
    qk, qv = np.take_along_axis(ks, qi, 1), np.take_along_axis(vs, qi, 1)
    x = np.concatenate([np.stack([ks, np.full_like(ks, eq), vs], -1).reshape(n, -1),
                        np.stack([qk, np.full_like(qk, eq), qv], -1).reshape(n, -1)], 1)
    mask = np.zeros(x.shape, np.float32)
    mask[:, 3 * pairs + 2::3] = 1
    return {"inputs": x[:, :-1].astype(np.int32), "targets": x[:, 1:].astype(np.int32),
            "mask": mask[:, 1:]}


@pytest.mark.deep
def test_one_smeared_layer_learns_associative_recall():
    # One attention layer cannot chain "find the key, read the next token" (that takes
    # an induction circuit over two layers); with the key smeared into the separator's
    # query and the value's key it is one match. Measured: 1.00 vs 0.15 (chance 0.125).
    from lab.train import TrainConfig, Trainer, sft_loss
    test = _mqar(np.random.default_rng(1), 256)
    acc = {}
    for smear in (0, 2):
        cfg = TransformerConfig(vocab_size=72, d_model=64, n_layers=1, n_heads=2, n_kv_heads=1,
                                head_dim=32, d_ff=128, max_len=64, qk_smear=smear)
        conf = TrainConfig(steps=1000, learning_rate=3e-3, warmup_steps=20, weight_decay=0.01,
                           log_every=1000, checkpoint_every=0, progress=False)
        trainer = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)), sft_loss, conf)
        trainer.fit(lambda s: _mqar(np.random.default_rng([0, s]), 32))
        pred = np.asarray(trainer.model(test["inputs"])).argmax(-1)
        acc[smear] = float(((pred == test["targets"]) * test["mask"]).sum() / test["mask"].sum())
    assert acc[2] > 0.9 and acc[0] < 0.3, acc
