"""PRKV while decoding (``compress_every``): its scores against a numpy construction of the
graph the new tokens' queries span, and the policy through ``lab.infer.generate``."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import infer
from lab.infer.policies import Stats
from lab.methods import prkv as prkv_lib
from lab.nn import KVCache, Transformer, TransformerConfig

ALPHA, ITERS = 0.85, 60


def reference(keys, positions, queries, qpos, graph):
    """numpy: per (layer, row, KV head) the chain over cache slots whose rows are the new
    tokens' attention (mean over the group, or per head then averaged), every other row
    jumping to the restart, uniform over the new tokens' slots; power iteration."""
    n_layers, b, n_kv, c, hd = keys.shape
    h = queries.shape[2]
    g = h // n_kv
    out = np.zeros((n_layers, b, n_kv, c))
    for layer in range(n_layers):
        for row in range(b):
            for kv in range(n_kv):
                pos = positions[layer, row, kv]
                slots = [int(np.flatnonzero(pos == p)[0]) for p in qpos[row] if p >= 0]
                v = np.zeros(c)
                v[slots] = 1 / len(slots)
                heads = [list(range(kv * g, (kv + 1) * g))] if graph == "group" else \
                    [[kv * g + i] for i in range(g)]
                pis = []
                for hs in heads:
                    P = np.tile(v, (c, 1))
                    for w, p in enumerate(qpos[row]):
                        if p < 0:
                            continue
                        rows = []
                        for hh in hs:
                            logits = keys[layer, row, kv] @ queries[layer, row, hh, w] / hd ** 0.5
                            ok = (pos >= 0) & (pos <= p)
                            e = np.where(ok, np.exp(logits - logits[ok].max()), 0.0)
                            rows.append(e / e.sum())
                        P[int(np.flatnonzero(pos == p)[0])] = np.mean(rows, 0)
                    pi = v.copy()
                    for _ in range(ITERS):
                        pi = (1 - ALPHA) * v + ALPHA * pi @ P
                    pis.append(pi)
                out[layer, row, kv] = np.mean(pis, 0)
    return out


def test_decoding_scores_match_the_window_graph():
    rng = np.random.default_rng(0)
    n_layers, b, n_kv, h, c, hd, w = 2, 2, 2, 4, 12, 8, 3
    keys = rng.normal(size=(n_layers, b, n_kv, c, hd)).astype(np.float32)
    # A compressed cache: each head holds other positions; the newest three tokens (the
    # "window", positions 20-22) sit at different slots per head; row 1 has a free slot.
    positions = np.zeros((n_layers, b, n_kv, c), np.int32)
    for idx in np.ndindex(n_layers, b, n_kv):
        old = np.sort(rng.choice(20, size=c - w, replace=False))
        positions[idx] = rng.permutation(np.concatenate([old, [20, 21, 22]]))
    positions[:, 1, :, :][positions[:, 1, :, :] == int(positions[0, 1, 0, 0])] = -1
    qpos = np.array([[20, 21, 22], [-1, 21, 22]], np.int32)
    queries = rng.normal(size=(n_layers, b, h, w, hd)).astype(np.float32)
    cache = KVCache(jnp.asarray(keys), jnp.zeros_like(jnp.asarray(keys)), jnp.asarray(positions),
                    jnp.full((b,), c, jnp.int32))
    stats = Stats(lengths=jnp.array([23, 23], jnp.int32), queries=jnp.asarray(queries),
                  query_positions=jnp.asarray(qpos))
    for graph in prkv_lib.GRAPHS:
        got = jax.jit(lambda cache, stats, graph=graph: prkv_lib.decoding_scores(
            cache, stats, alpha=ALPHA, iters=ITERS, graph=graph))(cache, stats)
        want = reference(keys, np.where(positions >= 0, positions, -5), queries, qpos, graph)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
        assert np.asarray(got)[np.broadcast_to(positions < 0, got.shape)].max() < 1e-6


def test_prkv_evicts_while_decoding():
    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            head_dim=8, d_ff=64, max_len=48, init_std=0.5)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x = np.array(np.random.default_rng(1).integers(1, 64, (2, 12)), np.int32)
    lengths = np.array([12, 9], np.int32)
    kw = dict(lengths=lengths, max_new_tokens=20, policy="prkv", compress_every=4,
              return_cache=True, window=4)
    out = infer.generate(model, x, budget=8, **kw)
    pos = np.asarray(out.cache.positions)
    # Never more than budget + compress_every entries per KV head; the newest token kept.
    assert ((pos >= 0).sum(-1) <= 8 + 4).all()
    assert np.isfinite(np.asarray(out.logprobs)).all()
    # A budget that holds the whole context evicts nothing: the full cache's tokens.
    full = infer.generate(model, x, lengths=lengths, max_new_tokens=20)
    roomy = infer.generate(model, x, budget=32, **kw)
    np.testing.assert_array_equal(np.asarray(roomy.tokens), np.asarray(full.tokens))
