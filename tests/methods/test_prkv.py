"""PRKV: PageRank scores on hand-built attention graphs, the policy's kept sets, bad input."""

import functools

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest
from flax import nnx

from kernels_pallas import pagerank as kernel
from lab import infer
from lab.infer.policies import Stats
from lab.methods import prkv
from lab.nn import KVCache, Transformer, TransformerConfig


def chain_attention(t, hops, n_heads=2):
    """Causal attention ``[1, 1, H, T, T]``: token ``a`` attends fully to ``b`` for each
    ``(a, b)`` in ``hops``; every other token attends to itself."""
    a = np.zeros((t, t), np.float32)
    for i in range(t):
        a[i, i] = 1.0
    for src, dst in hops:
        a[src] = 0.0
        a[src, dst] = 1.0
    return jnp.asarray(np.broadcast_to(a, (1, 1, n_heads, t, t)).copy())


def prefill_cache(t, n_kv=1, keys=None):
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, 1, n_kv, t))
    keys = jnp.ones((1, 1, n_kv, t, 4)) if keys is None else keys
    return KVCache(keys, keys, pos, jnp.array([t], jnp.int32))


SHARP = 40.0  # logit gap: exp(-40) ~ 4e-18, so each softmax row is one-hot in float32


def chain_stats(t, hops_per_head, window_positions):
    """``(cache, stats)`` whose queries and keys realise :func:`chain_attention`'s graphs:
    key ``j`` is the unit vector ``e_j``, query head ``h`` of token ``a`` is
    ``SHARP sqrt(t) e_b`` for its hop ``(a, b)`` (``e_a`` otherwise), so the causal softmax
    (``lab.nn``'s ``q k^T / sqrt(hd)``) puts all of ``a``'s attention on ``b``. ``stats``
    carries both the queries (the matrix-free policy's) and that softmax (``prkv_dense``'s)."""
    h = len(hops_per_head)
    target = np.tile(np.arange(t), (h, 1))
    for head, hops in enumerate(hops_per_head):
        for src, dst in hops:
            target[head, src] = dst
    q = np.zeros((1, 1, h, t, t), np.float32)
    for head in range(h):
        q[0, 0, head, np.arange(t), target[head]] = SHARP * np.sqrt(t)
    keys = jnp.asarray(np.eye(t, dtype=np.float32)[None, None, None])     # [1, 1, 1, T, T]
    logits = jnp.einsum("lbhqd,lbkd->lbhqk", q, keys[:, :, 0]) / np.sqrt(t)
    causal = np.tril(np.ones((t, t), bool))
    attn = jax.nn.softmax(jnp.where(causal, logits, -1e30), axis=-1)
    np.testing.assert_allclose(attn, jnp.concatenate(
        [chain_attention(t, hops, n_heads=1) for hops in hops_per_head], axis=2), atol=1e-6)
    stats = Stats(lengths=jnp.array([t], jnp.int32), attn=attn, all_queries=jnp.asarray(q),
                  query_positions=jnp.array([window_positions], jnp.int32))
    return prefill_cache(t, keys=keys), stats


def both(budget, cache, stats, **kw):
    """The kept positions of the matrix-free policy, checked equal to the materialised one's."""
    got = kept(jax.jit(functools.partial(prkv.prkv, **kw))(cache, stats, jnp.array([budget])))
    ref = kept(jax.jit(functools.partial(prkv.prkv_dense, **kw))(cache, stats,
                                                                 jnp.array([budget])))
    assert got == ref
    return got


def kept(cache):
    pos = np.asarray(cache.positions[0, 0])
    return [sorted(int(p) for p in row if p >= 0) for row in pos]


def test_personalized_pagerank_is_the_kernel_and_matches_networkx():
    assert prkv.personalized_pagerank is kernel.personalized_pagerank
    rng = np.random.default_rng(0)
    w = rng.random((12, 12)) * (rng.random((12, 12)) < 0.4) + np.eye(12) * 0.01
    p = w / w.sum(1, keepdims=True)
    v = np.zeros(12)
    v[-3:] = 1 / 3
    pi = np.asarray(prkv.personalized_pagerank(jnp.asarray(p, jnp.float32),
                                               jnp.asarray(v, jnp.float32), iters=200))
    g = nx.DiGraph()
    g.add_weighted_edges_from((i, j, w[i, j]) for i in range(12) for j in range(12) if w[i, j])
    ref = nx.pagerank(g, alpha=0.85, personalization=dict(enumerate(v)), tol=1e-12)
    np.testing.assert_allclose(pi, [ref[i] for i in range(12)], atol=1e-5)


def test_prkv_keeps_multi_hop_evidence_that_one_hop_scores_miss():
    # 11 (the question) -> 7 -> 3 -> 0: the question attends to 7 only.
    t = 12
    hops = [(11, 7), (7, 3), (3, 0)]
    attn = chain_attention(t, hops)
    cache, stats = chain_stats(t, [hops, hops], [11])
    assert both(4, cache, stats, iters=100) == [[0, 3, 7, 11]]
    # PageRank mass along the chain: (1-a), a(1-a), a^2(1-a), the rest absorbed at 0.
    v = prkv.window_restart(stats.lengths, t, 1)
    pi = np.asarray(prkv.prkv_scores(attn, v, 1, iters=200))[0, 0, 0]
    a = 0.85
    np.testing.assert_allclose(pi[[11, 7, 3]], [1 - a, a * (1 - a), a * a * (1 - a)], atol=1e-5)
    np.testing.assert_allclose(pi.sum(), 1.0, atol=1e-5)
    # The last query's own attention (TOVA's score) sees the first hop only.
    assert np.flatnonzero(np.asarray(attn[0, 0, 0, 11])).tolist() == [7]


def test_graph_per_head_or_per_group_and_protection():
    t = 10
    a0 = chain_attention(t, [(9, 5), (5, 2)], n_heads=1)    # head 0: 9 -> 5 -> 2
    a1 = chain_attention(t, [(9, 6), (6, 1)], n_heads=1)    # head 1: 9 -> 6 -> 1
    attn = jnp.concatenate([a0, a1], axis=2)                # one KV group of two heads
    cache, stats = chain_stats(t, [[(9, 5), (5, 2)], [(9, 6), (6, 1)]], [9])
    v = prkv.window_restart(stats.lengths, t, 1)
    # Per head: each chain's PageRank, averaged over the two heads.
    pi = np.asarray(prkv.prkv_scores(attn, v, 1, graph="head", iters=200))[0, 0, 0]
    np.testing.assert_allclose(pi[[5, 6]], 0.5 * 0.85 * 0.15, atol=1e-5)
    np.testing.assert_allclose(pi[[2, 1]], 0.5 * 0.85 ** 2, atol=1e-4)  # absorbed ends
    # Per group: one graph, the heads' mean (5 now half-stays at itself, head 1's row).
    pi = np.asarray(prkv.prkv_scores(attn, v, 1, graph="group", iters=200))[0, 0, 0]
    np.testing.assert_allclose(pi[5], 0.85 * 0.5 * 0.15 / (1 - 0.85 * 0.5), atol=1e-5)
    # The matrix-free scores are these, per graph, from the queries and keys alone.
    for graph in prkv.GRAPHS:
        mf = prkv.prkv_scores_matrix_free(stats.all_queries, cache.keys, cache.positions[0, :, 0],
                                          v, graph=graph, iters=200)
        dense = prkv.prkv_scores(stats.attn, v, 1, graph=graph, iters=200)
        # 200 float32 steps into the absorbing chain ends: rounding accrues to ~1e-5 relative
        np.testing.assert_allclose(mf, dense, rtol=2e-5, atol=1e-7)
    for graph in prkv.GRAPHS:                               # sink 0, then the chains' ends
        assert both(3, cache, stats, iters=100, n_sink=1, graph=graph) == [[0, 1, 2]]
    assert both(4, cache, stats, iters=100, n_recent=2) == [[1, 2, 8, 9]]


def test_pooling_keeps_a_hits_neighbours():
    # 19 (the question) -> 10 only. Without pooling only 10 and 19 score (the walk never
    # reaches the others, which tie at 0); kernel 3 spreads 10's score over 9 and 11, the
    # rest of the fact (a smeared key covers a few tokens), and keeps them before the others.
    t = 20
    cache, stats = chain_stats(t, [[(19, 10)]], [19])
    assert both(4, cache, stats, iters=100, kernel_size=3, n_recent=1) == [[9, 10, 11, 19]]
    out = both(4, cache, stats, iters=100, n_recent=1)[0]
    assert 10 in out and 19 in out and not {9, 11} <= set(out)
    with pytest.raises(ValueError, match="kernel_size=4"):
        prkv.prkv(cache, stats, jnp.array([4]), kernel_size=4)


def test_padding_rows_jump_to_the_restart_vector():
    attn = chain_attention(6, [(3, 1)], n_heads=1)
    attn = attn.at[0, 0, 0, 4:].set(0.0)                    # rows 4, 5: padding queries
    v = prkv.window_restart(jnp.array([4]), 6, 1)           # restart at position 3
    p = np.asarray(prkv.transition_graph(attn, 1, v))
    np.testing.assert_allclose(p[0, 0, 0].sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(p[0, 0, 0, 4], np.asarray(v[0]))


def test_bad_input_names_the_problem():
    p = jnp.full((1, 4, 4), 0.5)                            # rows sum to 2
    with pytest.raises(ValueError, match="row-stochastic"):
        prkv.personalized_pagerank(p, jnp.full((1, 4), 0.25))
    with pytest.raises(ValueError, match="graph='heads'"):
        prkv.transition_graph(jnp.ones((1, 1, 2, 4, 4)) / 4, 1, jnp.full((1, 4), 0.25),
                              graph="heads")
    with pytest.raises(ValueError, match=r"restart spans .* expected 0 <= start < end <= 8"):
        prkv.span_restart([3], [3], 8)
    t = 6
    cache, stats = chain_stats(t, [[]], [5])
    for fn in (prkv.prkv, prkv.prkv_dense):
        with pytest.raises(ValueError, match="budget=.* exceeds the context of 6 tokens"):
            fn(cache, stats, jnp.array([7]))
    with pytest.raises(ValueError, match="prkv needs stats.all_queries"):
        prkv.prkv(cache, stats._replace(all_queries=None), jnp.array([3]))
    with pytest.raises(ValueError, match="prkv_dense needs stats.attn"):
        prkv.prkv_dense(cache, stats._replace(attn=None), jnp.array([3]))
    with pytest.raises(ValueError, match="window=0"):
        prkv.window_restart(jnp.array([4]), 6, 0)
    with pytest.raises(ValueError, match=r"solver='lu'; expected one of \('exact', 'power'\)"):
        prkv.prkv(cache, stats, jnp.array([3]), solver="lu")
    with pytest.raises(ValueError, match="solver='exact' needs causal_slots=True"):
        prkv.prkv_scores_matrix_free(stats.all_queries, cache.keys, cache.positions[0, :, 0],
                                     prkv.window_restart(stats.lengths, t, 1), solver="exact")


def test_prkv_through_prefill_and_generate():
    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            head_dim=8, d_ff=64, max_len=48, init_std=0.5)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x = np.array(np.random.default_rng(0).integers(1, 64, (2, 24)), np.int32)
    lengths = np.array([24, 17], np.int32)
    gen = infer.generate(model, x, lengths=lengths, max_new_tokens=5, policy="prkv",
                         ratio=0.75, window=4, iters=20)
    assert np.isfinite(np.asarray(gen.logprobs)).all()
    _, cache = infer.prefill(model, x, lengths=lengths, policy="prkv", ratio=0.75, window=4,
                             iters=20, n_recent=3)
    pos = np.asarray(cache.positions)
    for b, t in enumerate(lengths):
        assert ((pos[:, b] >= 0).sum(-1) == int(t * 0.25)).all()
        # n_recent protects the last tokens whatever their PageRank.
        for row in pos[:, b].reshape(-1, pos.shape[-1]):
            assert {t - 3, t - 2, t - 1} <= set(row.tolist())


@pytest.mark.parametrize("graph", prkv.GRAPHS)
def test_matrix_free_policy_keeps_the_materialised_policys_set_through_prefill(graph):
    # A random model's real attention: the policy scores from Stats.all_queries and the
    # cache's keys; the kept sets equal prkv_dense's on the materialised Stats.attn.
    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            head_dim=8, d_ff=64, max_len=48, init_std=0.5)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x = np.array(np.random.default_rng(2).integers(1, 64, (2, 24)), np.int32)
    lengths = np.array([24, 17], np.int32)
    kw = dict(ratio=0.5, window=4, iters=30, graph=graph, kernel_size=3)
    _, got, stats = infer.prefill(model, x, lengths=lengths, policy="prkv", return_stats=True,
                                  **kw)
    assert stats.attn is None and stats.all_queries.shape == (2, 2, 4, 24, 8)
    _, ref, dense = infer.prefill(model, x, lengths=lengths, policy=prkv.DENSE,
                                  return_stats=True, **kw)
    assert dense.attn.shape == (2, 2, 4, 24, 24) and dense.all_queries is None
    np.testing.assert_array_equal(np.asarray(got.positions), np.asarray(ref.positions))
    np.testing.assert_array_equal(np.asarray(got.keys), np.asarray(ref.keys))


def random_layers(seed, *, n_layers, t, lengths, window, q_scale=1.0):
    """Random queries ``[L, 2, 4, T, 8]`` and keys ``[L, 2, 2, T, 8]`` of a right-padded batch
    (position -1 past each row's length) and the window restart."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(n_layers, 2, 4, t, 8)) * q_scale, jnp.float32)
    k = jnp.asarray(rng.normal(size=(n_layers, 2, 2, t, 8)), jnp.float32)
    lengths = np.asarray(lengths)
    pos = jnp.asarray(np.where(np.arange(t)[None] < lengths[:, None], np.arange(t)[None], -1),
                      jnp.int32)
    return q, k, pos, prkv.window_restart(jnp.asarray(lengths), t, window)


def test_skipping_masked_tiles_changes_nothing_and_checks_its_promise():
    # causal_slots (slot = position, padding at the end) skips the key tiles past each group
    # of query blocks; the scores are the full computation's.
    t = 200
    q, k, pos, v = random_layers(3, n_layers=1, t=t, lengths=(t, 131), window=5)
    for graph in prkv.GRAPHS:
        full = prkv.prkv_scores_matrix_free(q, k, pos, v, iters=30, graph=graph)
        skip = prkv.prkv_scores_matrix_free(q, k, pos, v, iters=30, graph=graph,
                                            causal_slots=True)
        np.testing.assert_allclose(skip, full, rtol=1e-6, atol=1e-9)
    shuffled = pos.at[0, 5].set(7)                          # slot 5 at position 7 = slot 7's
    with pytest.raises(ValueError, match="causal_slots=True but .* strictly increasing"):
        prkv.prkv_scores_matrix_free(q, k, shuffled, v, causal_slots=True)


def test_exact_solver_is_where_power_steps_converge():
    # The policy's default solve (back-substitution) against 400 power steps, both
    # matrix-free on two layers; a few steps stop visibly short of it.
    t = 120
    q, k, pos, v = random_layers(5, n_layers=2, t=t, lengths=(t, 77), window=6, q_scale=2.0)
    for graph in prkv.GRAPHS:
        exact = prkv.prkv_scores_matrix_free(q, k, pos, v, graph=graph, causal_slots=True,
                                             solver="exact")
        long = prkv.prkv_scores_matrix_free(q, k, pos, v, graph=graph, causal_slots=True,
                                            iters=400)
        short = prkv.prkv_scores_matrix_free(q, k, pos, v, graph=graph, causal_slots=True,
                                             iters=5)
        assert exact.shape == (2, 2, 2, t)
        np.testing.assert_allclose(exact, long, atol=2e-6)
        assert np.abs(np.asarray(short - exact)).sum(-1).min() > 0.1


@pytest.mark.parametrize("policy", ["prkv", "snapkv"])
def test_question_lengths_make_the_question_the_observation_window(policy):
    # Each row's restart span (PRKV) or observation window (SnapKV) is then its own question:
    # the same kept set as prefilling that row alone with window = its question length.
    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            head_dim=8, d_ff=64, max_len=48, init_std=0.5)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x = np.array(np.random.default_rng(1).integers(1, 64, (2, 24)), np.int32)
    lengths, questions = np.array([24, 17], np.int32), np.array([3, 6], np.int32)
    kw = {"policy": policy, "ratio": 0.5, **({"iters": 30} if policy == "prkv" else {})}
    _, got = infer.prefill(model, x, lengths=lengths, window=8, question_lengths=questions, **kw)
    for b, (t, q) in enumerate(zip(lengths, questions, strict=True)):
        _, alone = infer.prefill(model, x[b:b + 1, :t], window=int(q), **kw)
        n = int(alone.length[0])
        np.testing.assert_array_equal(np.asarray(got.positions[:, b, :, :n]),
                                      np.asarray(alone.positions[:, 0, :, :n]))
    _, window = infer.prefill(model, x, lengths=lengths, window=8, **kw)
    assert not np.array_equal(np.asarray(window.positions), np.asarray(got.positions))
    with pytest.raises(ValueError, match=r"question_lengths=\[3, 9\].*at most window=8"):
        infer.prefill(model, x, lengths=lengths, window=8, question_lengths=[3, 9], **kw)
    with pytest.raises(ValueError, match=r"question_lengths has shape \(3,\)"):
        infer.generate(model, x, lengths=lengths, max_new_tokens=2, question_lengths=[1, 2, 3],
                       **kw)
