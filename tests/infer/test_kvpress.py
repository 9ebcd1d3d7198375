"""kvpress baselines: each policy's kept set on hand-built caches where the answer is known,
and every registered policy through ``lab.infer.prefill`` / ``generate``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lab import infer
from lab.infer import kvpress, policies
from lab.infer.policies import Stats
from lab.nn import KVCache

HD = 8


def make_cache(keys):
    """A prefill cache (slot = position) from keys ``[Hkv, T, HD]`` (L = B = 1)."""
    keys = jnp.asarray(keys, jnp.float32)[None, None]
    hkv, t = keys.shape[2], keys.shape[3]
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, 1, hkv, t))
    return KVCache(keys, jnp.ones_like(keys), pos, jnp.array([t], jnp.int32))


def run(fn, cache, stats, budget, **kwargs):
    """``fn`` jitted as one program (eager op-by-op dispatch is slow on a busy CPU)."""
    return jax.jit(functools.partial(fn, **kwargs))(cache, stats, jnp.array([budget]))


def kept(cache):
    """Kept positions per KV head of layer 0, row 0, as sorted lists."""
    pos = np.asarray(cache.positions[0, 0])
    return [sorted(int(p) for p in row if p >= 0) for row in pos]


def spotlight_keys(t, targets_per_head):
    """Keys with a strong e_1 component at the target positions, e_0 elsewhere."""
    keys = np.zeros((len(targets_per_head), t, HD), np.float32)
    keys[:, :, 0] = 1.0
    for h, targets in enumerate(targets_per_head):
        for j in targets:
            keys[h, j] = 0.0
            keys[h, j, 1] = 1.0
    return keys


def window_stats(t, w, n_heads):
    """Queries 40 * e_1 for the last ``w`` positions of every head (softmax ~ one-hot)."""
    q = np.zeros((1, 1, n_heads, w, HD), np.float32)
    q[..., 1] = 40.0
    qpos = np.arange(t - w, t, dtype=np.int32)[None]
    return Stats(lengths=jnp.array([t], jnp.int32), queries=jnp.asarray(q),
                 query_positions=jnp.asarray(qpos))


def test_knorm_keeps_the_smallest_key_norms():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(2, 10, HD)).astype(np.float32)
    cache = make_cache(keys)
    out = run(kvpress.knorm, cache, Stats(lengths=cache.length), 4)
    norms = np.linalg.norm(keys, axis=-1)
    assert kept(out) == [sorted(np.argsort(norms[h])[:4].tolist()) for h in range(2)]


def test_random_keeps_budget_entries_and_depends_on_the_seed():
    cache = make_cache(np.ones((2, 20, HD)))
    stats = Stats(lengths=cache.length)
    a = run(kvpress.random, cache, stats, 5, seed=0)
    b = run(kvpress.random, cache, stats, 5, seed=1)
    assert [len(k) for k in kept(a)] == [5, 5]
    assert kept(a) != kept(b)
    assert kept(a) == kept(run(kvpress.random, cache, stats, 5))


def test_tova_keeps_the_last_querys_targets_and_the_last_token():
    t = 10
    cache = make_cache(spotlight_keys(t, [[2, 5]]))
    out = run(kvpress.tova, cache, window_stats(t, 1, n_heads=2), 3)
    assert kept(out) == [[2, 5, 9]]


def test_snapkv_window_pooling_and_gqa_groups():
    t, w = 16, 2
    # KV head 0's group attends to position 6, KV head 1's group to position 3.
    cache = make_cache(spotlight_keys(t, [[6], [3]]))
    stats = window_stats(t, w, n_heads=4)
    # Kernel-5 pooling spreads the peak evenly over its +-2 neighbours.
    out = run(kvpress.snapkv, cache, stats, w + 5)
    assert kept(out) == [[4, 5, 6, 7, 8, 14, 15], [1, 2, 3, 4, 5, 14, 15]]
    # Without pooling (kernel 1) only the peak stands out; ties go to earlier slots.
    out = run(kvpress.snapkv, cache, stats, w + 2, kernel_size=1)
    assert kept(out) == [[0, 6, 14, 15], [0, 3, 14, 15]]
    # The window is kept even when the budget is all window.
    assert kept(run(kvpress.snapkv, cache, stats, w)) == [[14, 15], [14, 15]]


def test_h2o_keeps_heavy_hitters_and_the_recent_half():
    t = 12
    cache = make_cache(np.ones((1, t, HD)))
    colsum = np.full((1, 1, 2, t), 0.1, np.float32)
    colsum[..., 4] = 5.0
    colsum[..., 1] = 3.0
    colsum[..., 10] = 9.0                                  # recent anyway
    stats = Stats(lengths=cache.length, attn_colsum=jnp.asarray(colsum))
    out = run(kvpress.h2o, cache, stats, 4)                # 2 recent + 2 heavy
    assert kept(out) == [[1, 4, 10, 11]]
    # Without the recent window: the mean attention per query that sees the key
    # (kvpress ObservedAttentionPress): slot 11's 0.1 from its one query beats slot 0's
    # 0.1 from 12 queries, which the raw column sum would tie at the earlier slot.
    out = run(kvpress.h2o, cache, stats, 4, recent_fraction=0.0)
    assert kept(out) == [[1, 4, 10, 11]]
    # Queries from position 8 on (decoding since the last compression): keys before 8
    # are seen by all 4 of them, so slot 1's 3.0 (0.75 a query) beats slot 11's 0.6
    # from its one query; counted from position 0 it would not (3.0 / 11 < 0.6).
    colsum[..., 11] = 0.6
    stats = stats._replace(attn_colsum=jnp.asarray(colsum))
    assert kept(run(kvpress.h2o, cache, stats, 3, recent_fraction=0.0)) == [[4, 10, 11]]
    late = stats._replace(query_start=jnp.array([8], jnp.int32))
    assert kept(run(kvpress.h2o, cache, late, 3, recent_fraction=0.0)) == [[1, 4, 10]]
    with pytest.raises(ValueError, match="recent_fraction"):
        kvpress.h2o(cache, stats, jnp.array([4]), recent_fraction=1.5)


POLICIES = ("full", "random", "streaming_llm", "h2o", "snapkv", "tova", "knorm")


def test_attention_policies_through_prefill_and_generate(model):
    # The policies whose statistics prefill must capture (column sums, window
    # queries) run end to end; the others' scoring needs only the cache.
    x = np.array(np.random.default_rng(1).integers(1, 64, (2, 20)), np.int32)
    lengths = np.array([20, 13], np.int32)
    for name in ("h2o", "snapkv", "tova"):
        logits, cache = infer.prefill(model, x, lengths=lengths, policy=name, ratio=0.5,
                                      window=4)
        pos = np.asarray(cache.positions)                  # [L, B, Hkv, C]
        for b, t in enumerate(lengths):
            assert ((pos[:, b] >= 0).sum(-1) == int(t * 0.5)).all(), name
            for row in pos[:, b].reshape(-1, pos.shape[-1]):
                p = row[row >= 0]
                assert len(set(p.tolist())) == len(p) and p.max() < t
                if name == "snapkv":                       # the window is kept
                    assert set(range(t - 4, t)) <= set(p.tolist())
                if name == "tova":                         # the last token is kept
                    assert t - 1 in p
    # Decoding continues on the half cache: finite log-probabilities, and the
    # first token (chosen from the prefill's logits, before eviction) unchanged.
    gen = infer.generate(model, x, lengths=lengths, max_new_tokens=6, policy="snapkv",
                         ratio=0.5, window=4)
    assert np.isfinite(np.asarray(gen.logprobs)).all()
    first = np.asarray(logits)[np.arange(2), lengths - 1].argmax(-1)
    np.testing.assert_array_equal(np.asarray(gen.tokens[:, 0]), first)


def test_bad_ratio_and_unknown_policy_name_the_problem(model):
    x = np.ones((1, 8), np.int32)
    for ratio in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"ratio=.*\[0, 1\)"):
            infer.prefill(model, x, policy="snapkv", ratio=ratio)
    with pytest.raises(ValueError, match="known policies") as e:
        infer.prefill(model, x, policy="snap_kv", ratio=0.5)
    for name in POLICIES:
        assert name in str(e.value)
    assert set(POLICIES) <= set(policies.names())


def test_avg_pool_is_torch_avg_pool1d():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).random((2, 3, 17)).astype(np.float32)
    for k in (1, 3, 5):
        ref = torch.nn.functional.avg_pool1d(torch.from_numpy(x), k, stride=1, padding=k // 2)
        np.testing.assert_allclose(np.asarray(kvpress.avg_pool(jnp.asarray(x), k)), ref.numpy(),
                                   atol=1e-6)
    with pytest.raises(ValueError, match="kernel_size=2"):
        kvpress.avg_pool(jnp.asarray(x), 2)
