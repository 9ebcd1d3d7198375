"""lab.infer.policies: compaction, StreamingLLM, decoding on an evicted cache, stats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.infer import policies
from lab.nn import KVCache
from tests.infer.conftest import CFG


def prompt_batch(lengths, seed=1):
    t = max(lengths)
    x = np.array(jax.random.randint(jax.random.key(seed), (len(lengths), t), 1, 64))
    for b, n in enumerate(lengths):
        x[b, n:] = 0
    return x.astype(np.int32), np.array(lengths, np.int32)


def test_compact_keeps_the_top_budget_per_head_in_slot_order():
    rng = np.random.default_rng(0)
    shape = (2, 2, 3, 7)                                  # L, B, Hkv, C
    positions = np.tile(np.arange(7) * 2, shape[:3] + (1,)).astype(np.int32)
    positions[:, 1, :, 5:] = -1                           # row 1 holds 5 entries
    keys = rng.normal(size=shape + (4,)).astype(np.float32)
    values = rng.normal(size=shape + (4,)).astype(np.float32)
    scores = rng.normal(size=shape).astype(np.float32)
    cache = KVCache(jnp.asarray(keys), jnp.asarray(values), jnp.asarray(positions),
                    jnp.array([7, 5], jnp.int32))
    out = jax.jit(policies.compact)(cache, jnp.asarray(scores), jnp.array([3, 4]))
    np.testing.assert_array_equal(out.length, [3, 4])
    for idx in np.ndindex(*shape[:3]):
        budget = (3, 4)[idx[1]]
        valid = np.flatnonzero(positions[idx] >= 0)
        top = np.sort(valid[np.argsort(-scores[idx][valid], kind="stable")[:budget]])
        np.testing.assert_array_equal(out.positions[idx][:budget], positions[idx][top])
        np.testing.assert_array_equal(out.keys[idx][:budget], keys[idx][top])
        np.testing.assert_array_equal(out.values[idx][:budget], values[idx][top])
        assert np.all(np.asarray(out.positions[idx][budget:]) == -1)
        assert np.all(np.asarray(out.keys[idx][budget:]) == 0)


def test_streaming_llm_keeps_sinks_and_recent(model):
    x, lens = prompt_batch([20, 13])
    _, cache = infer.prefill(model, x, lengths=lens, policy="streaming_llm", ratio=0.5)
    # kvpress's rule: int(T * (1 - ratio)) = 10 and 6 kept per KV head.
    assert cache.capacity == 10
    np.testing.assert_array_equal(cache.length, [10, 6])
    want = {0: [0, 1, 2, 3, 14, 15, 16, 17, 18, 19], 1: [0, 1, 2, 3, 11, 12]}
    for b, kept in want.items():
        got = np.asarray(cache.positions[:, b])            # [L, Hkv, C]
        np.testing.assert_array_equal(got[..., :len(kept)],
                                      np.broadcast_to(kept, got.shape[:2] + (len(kept),)))
        assert np.all(got[..., len(kept):] == -1)


def subset_scores(positions, n_rows, n_heads, xp=jnp):
    """Scores of the test policy below, for positions ``[..., B, Hkv, C]``."""
    head = xp.arange(n_heads)[:, None]
    row = xp.arange(n_rows)[:, None, None]
    return xp.sin(positions * (1.7 + head) + row)


def per_head_subset(cache, stats, budget):
    """Test policy: a fixed pseudo-random kept set per (row, KV head), the same in every layer."""
    del stats
    b, h = cache.positions.shape[1:3]
    return policies.compact(cache, subset_scores(cache.positions, b, h), budget)


policies.register("test_per_head_subset", per_head_subset)


def test_decoding_on_an_evicted_cache_uses_the_stored_positions(model, reference):
    lens, n, ratio = (12, 9), 6, 0.4
    x, lengths = prompt_batch(lens, seed=2)
    gen = infer.generate(model, x, lengths=lengths, max_new_tokens=n,
                         policy="test_per_head_subset", ratio=ratio)
    # The kept prompt entries, per row and KV head (budget = int(T * (1 - ratio))).
    kept = {}
    for b, t in enumerate(lens):
        s = subset_scores(np.arange(t)[None, None, :], 2, CFG.n_kv_heads, np)[b]  # [Hkv, t]
        for h in range(CFG.n_kv_heads):
            kept[b, h] = np.argsort(-s[h], kind="stable")[:int(t * (1 - ratio))]
    assert set(kept[0, 0]) != set(kept[0, 1])              # eviction differs per head
    # Reference: the full forward over prompt + generated tokens with attention
    # from generated positions restricted to the kept prompt entries per KV head.
    rows, mask = [], np.zeros((2, CFG.n_kv_heads, 18, 18), bool)
    for b, t in enumerate(lens):
        rows.append(list(x[b, :t]) + list(np.asarray(gen.tokens[b])))
        mask[b, :, :t, :] = True                           # prompt queries: full causal
        for h in range(CFG.n_kv_heads):
            mask[b, h, t:, kept[b, h]] = True
            mask[b, h, t:, t:] = True
    logits = np.asarray(reference(rows, mask)[0])
    ref = np.stack([logits[b, t - 1:t - 1 + n] for b, t in enumerate(lens)])
    np.testing.assert_array_equal(gen.tokens, ref.argmax(-1))
    ref_lp = np.take_along_axis(jax.nn.log_softmax(ref), np.asarray(gen.tokens)[..., None], -1)
    np.testing.assert_allclose(gen.logprobs, ref_lp[..., 0], atol=1e-4)
    # Without the restriction the logits differ: the test can see eviction.
    full = np.asarray(reference(rows)[0])
    full = np.stack([full[b, t - 1:t - 1 + n] for b, t in enumerate(lens)])
    assert np.abs(full - ref).max() > 1e-3


def test_stats_hold_what_scorers_need(model, reference):
    x, lens = prompt_batch([9, 6], seed=3)
    # prefill under "full" returns the uncompressed prompt cache and every statistic.
    _, cache, stats = infer.prefill(model, x[:, :9], lengths=lens, return_stats=policies.STATS,
                                    window=4)
    window = policies.window_attention(cache, stats)
    assert stats.queries.shape == (2, 2, 4, 4, 16)         # [L, B, H, W, hd]
    np.testing.assert_array_equal(stats.query_positions, [[5, 6, 7, 8], [2, 3, 4, 5]])
    attn = np.asarray(reference([x[0, :9], x[1, :6]])[1].attn)  # [L, B, H, 18, 18]
    for b, t in enumerate(lens):
        ref = attn[:, b, :, :t, :t]
        # Padding queries add nothing: the column sums are the unpadded row's.
        np.testing.assert_allclose(stats.attn_colsum[:, b, :, :t], ref.sum(-2), atol=1e-5)
        assert float(jnp.abs(stats.attn_colsum[:, b, :, t:]).max(initial=0.0)) == 0.0
        np.testing.assert_allclose(stats.attn[:, b, :, :t, :t], ref, atol=1e-5)
        # Window queries (after RoPE) reproduce the model's last-queries attention.
        np.testing.assert_allclose(window[:, b, :, :, :t], ref[:, :, t - 4:], atol=1e-5)


def test_registry_rules():
    assert {"full", "streaming_llm"} <= set(policies.names())
    assert policies.get("streaming_llm").needs == ()
    with pytest.raises(ValueError, match="already registered"):
        policies.register("streaming_llm", lambda c, s, b: c)
    with pytest.raises(ValueError, match="needs"):
        policies.Policy(lambda c, s, b: c, needs=("logits",))
    with pytest.raises(ValueError, match="unknown cache policy 'nope'; known policies: .*full"):
        policies.get("nope")
    assert policies.budgets([10, 7, 3], 0.5) == [5, 3, 1]
    # kvpress's compute_n_kept keeps at least one entry of a non-empty row.
    assert policies.budgets([10, 7, 3, 0], 0.9) == [1, 1, 1, 0]


def test_generate_memory_falls_with_the_ratio_and_counts_the_cache(model):
    """XLA's buffer assignment: the compressed decode cache is smaller, so temp bytes fall
    with the ratio; the full cache's bytes are a lower bound on the full run's temp."""
    x, lengths = prompt_batch([40, 40])
    mem = {r: infer.generate_memory(model, x, lengths=lengths, max_new_tokens=4,
                                    policy="streaming_llm", ratio=r) for r in (0.0, 0.75)}
    cache_bytes = KVCache.init(CFG, 2, 44).keys.nbytes * 2  # keys + values, 40 + 4 slots
    assert mem[0.0]["temp"] >= cache_bytes
    assert mem[0.75]["temp"] < mem[0.0]["temp"]
    weights = sum(v.nbytes for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert weights <= mem[0.0]["arguments"] < weights + 1024  # weights + prompts + budget
    for m in mem.values():
        assert m["total"] == m["arguments"] + m["outputs"] + m["temp"]


@pytest.mark.parametrize("policy", ["full", "snapkv", "streaming_llm"])
def test_memory_analysis_reports_the_bytes_of_the_default_compile(model, policy):
    """memory_analysis compiles without LLVM's optimisations on CPU; XLA's buffer
    assignment, and so every byte count, is that of the program generate runs."""
    x, lengths = prompt_batch([40, 24])
    kw = dict(policy=policy, ratio=0.5 if policy != "full" else 0.0, max_new_tokens=4)
    graphdef = nnx.graphdef(model)
    lowered = jax.jit(lambda st: infer.generate(nnx.merge(graphdef, st), x, lengths=lengths,
                                                **kw).tokens).lower(nnx.state(model))
    default = lowered.compile().memory_analysis()
    got = infer.memory_analysis(lowered)
    assert (got["arguments"], got["outputs"], got["temp"]) == (
        default.argument_size_in_bytes, default.output_size_in_bytes,
        default.temp_size_in_bytes)
    assert got["temp"] > 0
