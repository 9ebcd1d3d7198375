"""lab.nn.Transformer: one forward for logits, intermediates, embeddings and cached decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab.nn import KVCache, Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, d_ff=128, max_len=32, rope_theta=5000.0)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def tokens(b=2, t=10, seed=1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, CFG.vocab_size)


def test_capture_is_the_same_forward(model):
    x = tokens()
    plain = model(x)
    logits, inter = model(x, capture=("hidden", "attn", "attn_colsum"))
    np.testing.assert_allclose(logits, plain, atol=1e-6)
    assert inter.hidden.shape == (3, 2, 10, 64)
    assert inter.attn.shape == (2, 2, 4, 10, 10)
    # Probabilities are causal, rows sum to one, and the column sums match them.
    np.testing.assert_allclose(inter.attn.sum(-1), 1.0, atol=1e-5)
    assert float(jnp.abs(jnp.triu(inter.attn, k=1)).max()) == 0.0
    np.testing.assert_allclose(inter.attn_colsum, inter.attn.sum(-2), atol=1e-5)
    # The last residual state, unembedded, gives the logits.
    np.testing.assert_allclose(model.unembed(inter.hidden[-1]), logits, atol=1e-5)


def test_inputs_embeds_equal_tokens(model):
    x = tokens()
    np.testing.assert_allclose(model(inputs_embeds=model.embed_tokens(x)), model(x), atol=1e-6)


def test_last_only_unembeds_the_last_position(model):
    x = tokens(t=12)
    full = model(x)
    last = model(x, last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)
    _, inter = model(x, capture=("hidden",), last_only=True)    # captures still every position
    assert inter.hidden.shape[2] == 12


def test_cached_decoding_equals_full_forward(model):
    x = tokens(t=12)
    full = model(x)
    cache = KVCache.init(CFG, 2, 16)
    logits, cache = model(x[:, :7], cache=cache)
    steps = [logits]
    for i in range(7, 12):
        step, cache = model(x[:, i:i + 1], cache=cache)
        steps.append(step)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)
    np.testing.assert_array_equal(cache.length, [12, 12])


def test_padding_mask_ignores_padded_keys(model):
    x = tokens(b=1, t=8)
    padded = jnp.concatenate([x, jnp.zeros((1, 4), x.dtype)], 1)
    valid = jnp.arange(12)[None] < 8
    np.testing.assert_allclose(model(padded, mask=valid)[:, :8], model(x), atol=1e-5)


def test_bidirectional_config_sees_the_future():
    m = Transformer(CFG.replace(causal=False), rngs=nnx.Rngs(0))
    x = tokens(b=1, t=6)
    y = x.at[0, 5].set((x[0, 5] + 1) % CFG.vocab_size)
    assert float(jnp.abs(m(x)[0, 0] - m(y)[0, 0]).max()) > 1e-4


def test_bad_inputs_name_the_limit(model):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(jnp.array([[1, 64]]))
    with pytest.raises(ValueError, match="max_len=32"):
        model(jnp.zeros((1, 33), jnp.int32))
    with pytest.raises(ValueError, match="capacity 4"):
        model(jnp.zeros((1, 5), jnp.int32), cache=KVCache.init(CFG, 1, 4))
    with pytest.raises(ValueError, match="capture"):
        model(jnp.zeros((1, 3), jnp.int32), capture=("logits",))
    with pytest.raises(ValueError, match="n_kv_heads"):
        TransformerConfig(n_heads=6, n_kv_heads=4)
    with pytest.raises(ValueError, match="attention_impl"):
        TransformerConfig(attention_impl="cuda")


def test_param_count_matches_config():
    for tie in (True, False):
        cfg = CFG.replace(tie_embeddings=tie, qkv_bias=True)
        m = Transformer(cfg, rngs=nnx.Rngs(0))
        n = sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
        assert n == cfg.num_params()


def test_attention_impl_none_follows_lab_kernels(model, monkeypatch):
    # attention_impl=None (the default) leaves the choice to the dispatcher, so the
    # LAB_KERNELS override reaches the Transformer; an explicit impl still wins.
    assert CFG.attention_impl is None
    x = tokens(b=1, t=8)

    def uses_pallas(m):
        return "pallas_call" in str(jax.make_jaxpr(lambda t: m(t))(x))

    monkeypatch.setenv("LAB_KERNELS", "pallas")
    assert uses_pallas(model)
    assert not uses_pallas(Transformer(CFG.replace(attention_impl="xla"), rngs=nnx.Rngs(0)))
    monkeypatch.setenv("LAB_KERNELS", "xla")
    assert not uses_pallas(model)
