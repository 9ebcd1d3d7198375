"""lab.infer.generate / prefill / score: parity with the full forward, batching, sampling, errors.

The reference for cached decoding is the model's plain forward over the whole
sequence (prompt + generated tokens): in a causal model its logits at position
``p`` are exactly what recomputing the forward on the first ``p + 1`` tokens
gives, so it is the recompute-every-step reference in one call.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.infer import decode, engine, sampling
from lab.nn import KVCache
from tests.infer.conftest import CFG

N = 8
LENS = (10, 7)                 # prompt + N = 18 tokens: the reference forward's length


@pytest.fixture(scope="module")
def prompts():
    x = np.asarray(jax.random.randint(jax.random.key(1), (2, 10), 1, CFG.vocab_size))
    return [list(x[0, :LENS[0]]), list(x[1, :LENS[1]])]


@pytest.fixture(scope="module")
def greedy(model, prompts):
    return infer.generate(model, prompts, max_new_tokens=N, capture=("hidden",))


def full_sequences(prompts, gen):
    """Prompt + generated ids per row."""
    return [list(p) + list(np.asarray(gen.tokens[b])) for b, p in enumerate(prompts)]


def step_logits(logits, prompts):
    """``[B, N, V]``: the logits that chose generated token ``i`` (position len-1+i)."""
    return np.stack([np.asarray(logits[b, len(p) - 1:len(p) - 1 + N])
                     for b, p in enumerate(prompts)])


def test_cached_generation_equals_full_forward(model, prompts, greedy, reference):
    logits, inter = reference(full_sequences(prompts, greedy))
    ref = step_logits(logits, prompts)
    np.testing.assert_array_equal(greedy.tokens, ref.argmax(-1))
    ref_lp = np.take_along_axis(jax.nn.log_softmax(ref), np.asarray(greedy.tokens)[..., None],
                                -1)[..., 0]
    np.testing.assert_allclose(greedy.logprobs, ref_lp, atol=1e-4)
    # The captured residual stream, unembedded, gives the same logits (within 1e-4).
    assert greedy.hidden.shape == (CFG.n_layers + 1, 2, N, CFG.d_model)
    np.testing.assert_allclose(model.unembed(greedy.hidden[-1]), ref, atol=1e-4)
    ref_h = np.stack([np.asarray(inter.hidden[:, b, len(p) - 1:len(p) - 1 + N])
                      for b, p in enumerate(prompts)], 1)
    scale = np.abs(ref_h).max()                # the stream grows to ~100: compare relative to it
    np.testing.assert_allclose(greedy.hidden / scale, ref_h / scale, atol=1e-5)
    np.testing.assert_array_equal(greedy.lengths, [N, N])
    assert len(set(np.asarray(greedy.tokens).ravel().tolist())) > 4  # not a degenerate model


def test_rows_of_a_padded_batch_equal_rows_alone(model, prompts, greedy):
    alone = infer.generate(model, np.array([prompts[1]]), max_new_tokens=N)
    np.testing.assert_array_equal(alone.tokens[0], greedy.tokens[1])
    np.testing.assert_allclose(alone.logprobs[0], greedy.logprobs[1], atol=1e-5)
    # Same shapes again: the compiled program is reused, not retraced.
    before = engine._generate_jit._cache_size()
    again = infer.generate(model, np.array([prompts[1]]), max_new_tokens=N)
    assert engine._generate_jit._cache_size() == before
    np.testing.assert_array_equal(again.tokens, alone.tokens)


def test_top_k_one_is_greedy_and_stop_tokens_end_rows(model, prompts, greedy):
    # One program for both properties (each generate variant costs a compile):
    # sampling at temperature 0.7 from the top-1 token is greedy decoding, the
    # log-probs are the untempered ones, and a stop token ends its row.
    toks = np.asarray(greedy.tokens)
    stop = int(toks[0, 3])
    out = infer.generate(model, prompts, max_new_tokens=N, temperature=0.7, top_k=1, seed=3,
                         stop_tokens=(stop,), pad_id=0)
    for b in range(2):
        hits = np.flatnonzero(toks[b] == stop)
        end = int(hits[0]) + 1 if hits.size else N
        assert int(out.lengths[b]) == end
        np.testing.assert_array_equal(out.tokens[b, :end], toks[b, :end])
        np.testing.assert_allclose(out.logprobs[b, :end], greedy.logprobs[b, :end], atol=1e-5)
        assert np.all(np.asarray(out.tokens[b, end:]) == 0)
        assert np.all(np.asarray(out.logprobs[b, end:]) == 0.0)
    assert int(out.lengths[0]) <= 4 and int(out.lengths.max()) > int(out.lengths.min())


def test_inactive_row_leaves_its_cache_unchanged(model):
    rng = np.random.default_rng(0)
    shape = (CFG.n_layers, 2, CFG.n_kv_heads, 8, CFG.head_dim)
    positions = np.broadcast_to(np.where(np.arange(8) < 6, np.arange(8), -1), shape[:-1])
    cache = KVCache(jnp.asarray(rng.normal(size=shape), jnp.float32),
                    jnp.asarray(rng.normal(size=shape), jnp.float32),
                    jnp.asarray(positions, jnp.int32), jnp.array([6, 6], jnp.int32))
    step = nnx.jit(decode.step)
    _, new, _ = step(model, cache, jnp.array([3, 4]), jnp.array([6, 6]), jnp.array([True, False]))
    np.testing.assert_array_equal(new.length, [7, 6])
    np.testing.assert_array_equal(new.positions[:, 0, :, :7],
                                  np.broadcast_to(np.arange(7), (2, 2, 7)))
    # Row 1 keeps its entries, and the slot it skipped stays empty (position -1).
    np.testing.assert_array_equal(new.positions[:, 1], cache.positions[:, 1])
    held = positions[:, 1] >= 0
    for a, b in ((cache.keys, new.keys), (cache.values, new.values)):
        np.testing.assert_array_equal(np.asarray(a)[:, 1][held], np.asarray(b)[:, 1][held])


def test_sampling_warpers():
    logits = jnp.array([[3.0, 2.0, 1.0, 0.0]])
    kept = lambda z: np.asarray(z[0] > -1e29).tolist()  # noqa: E731
    assert kept(sampling.warp(logits, 1.0, 3, None)) == [True, True, True, False]
    # softmax = [.644, .237, .087, .032]: the 0.7 nucleus is the first two tokens.
    assert kept(sampling.warp(logits, 1.0, None, 0.7)) == [True, True, False, False]
    assert kept(sampling.warp(logits, 1.0, None, 0.5)) == [True, False, False, False]
    # Temperature sampling follows softmax(logits / T) (4000 draws, within 0.03).
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = jax.jit(jax.vmap(lambda k: sampling.choose(logits, k, jnp.float32(2.0), greedy=False,
                                                       top_k=None, top_p=None)[0]))(keys)
    freq = np.bincount(np.asarray(draws).ravel(), minlength=4) / 4000
    np.testing.assert_allclose(freq, jax.nn.softmax(logits[0] / 2.0), atol=0.03)


def test_score_matches_forward_and_ignores_padding(prompts, greedy, model, reference):
    rows = full_sequences(prompts, greedy)        # 18 and 15 tokens
    x = np.zeros((2, 18), np.int32)
    x[0] = rows[0]
    x[1, 3:] = rows[1]                            # left-padded row
    mask = np.ones((2, 18), bool)
    mask[1, :3] = False
    targets = np.roll(x, -1, axis=1)
    out = np.asarray(infer.score(model, x, targets, mask=mask))
    logp = np.asarray(jax.nn.log_softmax(reference(rows)[0]))
    for b, (row, start) in enumerate(((rows[0], 0), (rows[1], 3))):
        ref = np.take_along_axis(logp[b, :len(row)], targets[b, start:, None], -1)[:, 0]
        np.testing.assert_allclose(out[b, start:], ref, atol=1e-4)
    assert np.all(out[1, :3] == 0.0)


def test_bad_inputs_name_the_problem(model, prompts):
    gen = lambda *a, **k: infer.generate(model, *a, **{"max_new_tokens": 4, **k})  # noqa: E731
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen([[1, 2, CFG.vocab_size]])
    with pytest.raises(ValueError, match="max_len=48"):
        gen(prompts, max_new_tokens=40)
    with pytest.raises(ValueError, match="capacity=12"):
        gen(prompts, capacity=12)
    with pytest.raises(ValueError, match="ratio"):
        gen(prompts, policy="streaming_llm", ratio=1.0)
    with pytest.raises(ValueError, match="ratio"):
        infer.prefill(model, prompts, ratio=-0.1)
    with pytest.raises(ValueError, match="known policies: .*streaming_llm"):
        gen(prompts, policy="nope")
    with pytest.raises(ValueError, match="top_k"):
        gen(prompts, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        gen(prompts, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        gen(prompts, temperature=-1.0)
    with pytest.raises(ValueError, match="capture"):
        gen(prompts, capture=("attn",))
    with pytest.raises(ValueError, match="lengths"):
        gen(np.ones((2, 5), np.int32), lengths=[5, 6])
    with pytest.raises(ValueError, match="stop_tokens"):
        gen(prompts, stop_tokens=(CFG.vocab_size,))
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen(prompts, max_new_tokens=0)
    with pytest.raises(ValueError, match="targets"):
        infer.score(model, np.ones((1, 4), np.int32), np.full((1, 4), 99))


def test_as_batch_pads_lists_and_checks_lengths():
    tokens, lengths = infer.as_batch([[5, 6, 7], [8]], pad_id=2)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [8, 2, 2]])
    np.testing.assert_array_equal(lengths, [3, 1])
    tokens, lengths = infer.as_batch(np.array([4, 5]))
    assert tokens.shape == (1, 2) and lengths.tolist() == [2]
    with pytest.raises(ValueError, match="lengths"):
        infer.as_batch(np.ones((1, 3), np.int32), lengths=[0])


@pytest.mark.parametrize("cell", [{}, {"policy": "snapkv", "ratio": 0.5}])
def test_batches_of_one_padded_shape_share_one_compiled_program(model, cell):
    # The default capacity is sized from the padded width, not the longest row: a
    # batch whose longest row differs must not compile its own program.
    x = np.asarray(jax.random.randint(jax.random.key(3), (2, 12), 1, CFG.vocab_size))
    kw = dict(max_new_tokens=3, window=4, **cell)
    before = engine._generate_jit._cache_size()
    batches = ((12, 9), (8, 5), (11, 11))
    outs = [infer.generate(model, x, lengths=np.asarray(lens, np.int32), **kw)
            for lens in batches]
    assert engine._generate_jit._cache_size() - before == 1
    # the padding and the larger cache change nothing
    for lens, out in zip(batches, outs, strict=True):
        ref = infer.generate(model, [list(x[b, :n]) for b, n in enumerate(lens)], **kw)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
