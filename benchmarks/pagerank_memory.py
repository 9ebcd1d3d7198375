"""Scoring memory of PRKV's PageRank: materialised attention graph against matrix-free.

    python benchmarks/pagerank_memory.py [--lengths 1024 4096 16384] [--time-up-to 4096]

One layer of a prompt of ``T`` tokens, ``B=1``, ``H=4`` query heads, ``Hkv=2``
KV heads, ``hd=32``, every token valid (positions ``0..T-1``), restart uniform
over the last 64 tokens (PRKV's window), ``alpha=0.85``, 50 power steps (no
early stop), ``graph="group"``. Three scoring functions of ``(q, k)``, each
jitted on its own:

* materialised: the causal softmax attention ``[B, H, T, T]`` (``jax.nn.softmax``
  over the positional mask), then ``lab.methods.prkv.prkv_scores`` on it
  (``transition_graph`` + ``personalized_pagerank``, the jnp reference), what
  ``lab.methods.prkv.prkv_dense`` does from ``Stats.attn``;
* matrix-free: ``kernels_pallas.pagerank.attention_pagerank_reference`` (the jnp
  reference; ``--block`` query rows per tile), which never forms ``[T, T]``;
* exact: ``kernels_pallas.pagerank.attention_pagerank_exact``, the chain's fixed point
  by blocked back-substitution (PRKV's default solver), also matrix-free;
* SnapKV: ``lab.infer.kvpress.snapkv_scores`` (the last 64 queries against the
  cache, the window mean, pooling, the group mean), the one-hop baseline.

For each it prints XLA's ``compiled.memory_analysis().temp_size_in_bytes``
(the scratch the compiled function allocates besides its inputs and outputs),
from lowering on shapes only, so nothing is run for memory. Wall time per
call (the best of ``--repeats`` after a warm-up) is measured for ``T`` up to
``--time-up-to``; the materialised function is never run above 4096 tokens.
Where both ran, it prints their max abs difference and each one's max abs
error against the same 50 power steps in float64 numpy, and the exact solve's error
against the fixed point solved in float64 (``numpy.linalg.solve``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_pallas.pagerank import (  # noqa: E402
    attention_pagerank_exact,
    attention_pagerank_reference,
)
from lab.infer.kvpress import snapkv_scores  # noqa: E402
from lab.infer.policies import Stats  # noqa: E402
from lab.methods.prkv import prkv_scores  # noqa: E402
from lab.nn.cache import KVCache  # noqa: E402

B, H, HKV, HD, WINDOW, ALPHA, ITERS = 1, 4, 2, 32, 64, 0.85, 50
MATERIALISED_MAX_RUN = 4096


def restart(t: int) -> jax.Array:
    on = jnp.arange(t) >= t - WINDOW
    return jnp.broadcast_to(on / jnp.sum(on), (B, t)).astype(jnp.float32)


def causal_probs(q, k, positions):
    """``[B, H, T, T]`` softmax attention under ``lab.nn``'s mask (0 <= key pos <= query pos)."""
    kk = jnp.repeat(k, H // HKV, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, kk) * HD ** -0.5
    ok = (positions[:, None, None, :] >= 0) & (positions[:, None, None, :]
                                               <= positions[:, None, :, None])
    return jnp.where(ok, jax.nn.softmax(jnp.where(ok, s, -1e30), axis=-1), 0.0)


def materialised(q, k, positions, v):
    attn = causal_probs(q, k, positions)[None]                   # [L=1, B, H, T, T]
    return prkv_scores(attn, v, HKV, alpha=ALPHA, iters=ITERS, graph="group", impl="xla")[0]


def matrix_free(block: int):
    def fn(q, k, positions, v):
        return attention_pagerank_reference(q, k, v, positions=positions, alpha=ALPHA,
                                            iters=ITERS, graph="group", block=block)
    return fn


def exact(q, k, positions, v):
    return attention_pagerank_exact(q, k, v, positions=positions, alpha=ALPHA, graph="group")


def snapkv(q, k, positions, v):
    del v
    t = k.shape[2]
    cache = KVCache(keys=k[None], values=k[None],
                    positions=jnp.broadcast_to(positions[None, :, None, :], (1, B, HKV, t)),
                    length=jnp.full((B,), t, jnp.int32))
    stats = Stats(lengths=jnp.full((B,), t, jnp.int32), queries=q[None, :, :, -WINDOW:],
                  query_positions=positions[:, -WINDOW:])
    return snapkv_scores(cache, stats)[0]


def shapes(t: int):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, H, t, HD), f32), jax.ShapeDtypeStruct((B, HKV, t, HD), f32),
            jax.ShapeDtypeStruct((B, t), jnp.int32), jax.ShapeDtypeStruct((B, t), f32))


def inputs(t: int, seed: int = 0):
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.normal(size=(B, H, t, HD)), jnp.float32)
    k = jnp.asarray(r.normal(size=(B, HKV, t, HD)), jnp.float32)
    return q, k, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (B, t)), restart(t)


def float64_graph(q, k) -> np.ndarray:
    """The chain's ``P [B, Hkv, T, T]`` (all tokens valid) in float64 numpy."""
    q, k = (np.asarray(x, np.float64) for x in (q, k))
    t = q.shape[2]
    s = np.einsum("bhqd,bhkd->bhqk", q, np.repeat(k, H // HKV, axis=1)) * HD ** -0.5
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).reshape(B, HKV, H // HKV, t, t).mean(2)


def float64_fixed_point(q, k, v) -> np.ndarray:
    """``pi (I - alpha P) = (1 - alpha) v`` solved in float64 numpy."""
    p, v = float64_graph(q, k), np.asarray(v, np.float64)
    eye = np.eye(p.shape[-1])
    return np.stack([np.stack([np.linalg.solve((eye - ALPHA * p[b, g]).T, (1 - ALPHA) * v[b])
                               for g in range(HKV)]) for b in range(B)])


def float64_scores(q, k, v) -> np.ndarray:
    """The same chain (all tokens valid) and 50 power steps in float64 numpy."""
    p, v = float64_graph(q, k), np.asarray(v, np.float64)
    pi = np.broadcast_to(v[:, None], (B, HKV, p.shape[-1])).copy()
    for _ in range(ITERS):
        pi = (1 - ALPHA) * v[:, None] + ALPHA * np.einsum("bhi,bhij->bhj", pi, p)
    return pi


def best_time(compiled, args, repeats: int) -> float:
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--time-up-to", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block", type=int, default=64)
    args = ap.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()} ({platform.processor() or 'cpu'}); "
          f"B={B} H={H} Hkv={HKV} hd={HD} window={WINDOW} iters={ITERS} block={args.block}")
    sides = {"materialised": materialised, "matrix-free": matrix_free(args.block),
             "exact": exact, "snapkv": snapkv}
    print("| T | side | temp MiB | temp / T (KiB) | s per call |")
    print("|---|---|---|---|---|")
    for t in args.lengths:
        data = inputs(t) if t <= args.time_up_to else None
        outs = {}
        for name, fn in sides.items():
            compiled = jax.jit(fn).lower(*shapes(t)).compile()
            temp = compiled.memory_analysis().temp_size_in_bytes
            secs = "-"
            runnable = name != "materialised" or t <= MATERIALISED_MAX_RUN
            if data is not None and runnable:
                secs = f"{best_time(compiled, data, args.repeats):.3f}"
                outs[name] = np.asarray(compiled(*data))
            print(f"| {t} | {name} | {temp / 2**20:.2f} | {temp / t / 1024:.2f} | {secs} |",
                  flush=True)
        if "materialised" in outs and "matrix-free" in outs:
            mat, free = outs["materialised"], outs["matrix-free"]
            truth = float64_scores(data[0], data[1], data[3])
            print(f"T={t}: max |materialised - matrix-free| = {np.abs(mat - free).max():.3g}; "
                  f"against float64: materialised {np.abs(mat - truth).max():.3g}, "
                  f"matrix-free {np.abs(free - truth).max():.3g} (max pi {truth.max():.3g})")
        if "exact" in outs:
            fixed = float64_fixed_point(data[0], data[1], data[3])
            print(f"T={t}: exact solve against the float64 fixed point: "
                  f"{np.abs(outs['exact'] - fixed).max():.3g}; {ITERS} float32 power steps "
                  f"(matrix-free): {np.abs(outs['matrix-free'] - fixed).max():.3g}")


if __name__ == "__main__":
    main()
