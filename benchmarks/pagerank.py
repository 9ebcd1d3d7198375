"""Lab's personalized PageRank against networkx.pagerank on one dense graph.

    python benchmarks/pagerank.py [--n 1024] [--repeats 5] [--impl xla|pallas]

Builds one dense weighted digraph of ``n`` nodes (every ordered pair an edge,
uniform random weights, no self loops) and a restart distribution on the last
32 nodes (an observation window, as in PRKV). Times, after a warm-up call:

* Lab: ``kernels_pallas.pagerank.personalized_pagerank`` (input checks, then a
  jitted power iteration; the backend the dispatcher picks unless ``--impl``)
  on the row-normalised weight matrix, to convergence (L1 change < 1e-7,
  float32), median of ``--repeats`` runs;
* networkx: ``networkx.pagerank(G, alpha, personalization=...)`` on the same
  graph with ``tol=1e-12`` (networkx stops at L1 change < N * tol, float64),
  median of ``--repeats`` runs. networkx's time includes building its sparse
  matrix from the graph, which a networkx user pays on every call; so the
  power iteration of networkx's ``_pagerank_scipy`` alone (the same loop and
  stop rule on the prebuilt, row-normalised CSR matrix) is timed too.

Prints both times, their ratio (target: Lab at least 50x faster) and the max
absolute difference of the scores (target: at most 1e-5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import networkx as nx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_pallas.dispatch import backend  # noqa: E402
from kernels_pallas.pagerank import personalized_pagerank  # noqa: E402

ALPHA = 0.85


def median_time(fn, repeats: int) -> tuple[float, object]:
    """Median wall time (s) of ``fn()`` over ``repeats`` calls after one warm-up, and its result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def networkx_iteration(a, p: np.ndarray, tol: float, max_iter: int = 1000) -> np.ndarray:
    """The loop of networkx's ``_pagerank_scipy`` (networkx 3.x) on a row-normalised CSR ``a``."""
    n = a.shape[0]
    x = np.repeat(1.0 / n, n)
    for _ in range(max_iter):
        last = x
        x = ALPHA * (x @ a) + (1 - ALPHA) * p  # no dangling nodes in this graph
        if np.abs(x - last).sum() < n * tol:
            return x
    raise RuntimeError("networkx iteration did not converge")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--impl", choices=("xla", "pallas"), default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    n = args.n
    weights = rng.random((n, n))
    np.fill_diagonal(weights, 0.0)
    restart = np.zeros(n)
    restart[-32:] = rng.random(32)
    restart /= restart.sum()
    graph = nx.from_numpy_array(weights, create_using=nx.DiGraph)
    personalization = dict(enumerate(restart))
    p = (weights / weights.sum(1, keepdims=True)).astype(np.float32)
    p_dev, v_dev = jax.device_put(p), jax.device_put(restart.astype(np.float32))

    def lab():
        return personalized_pagerank(p_dev, v_dev, alpha=ALPHA, iters=200, tol=1e-7,
                                     impl=args.impl).block_until_ready()

    def networkx():
        return nx.pagerank(graph, alpha=ALPHA, personalization=personalization, tol=1e-12,
                           max_iter=1000)

    lab_s, lab_pi = median_time(lab, args.repeats)
    nx_s, nx_scores = median_time(networkx, args.repeats)
    csr = nx.to_scipy_sparse_array(graph, nodelist=list(range(n)), dtype=float)
    csr = (csr.multiply(1.0 / csr.sum(axis=1)[:, None])).tocsr()
    core_s, core_pi = median_time(lambda: networkx_iteration(csr, restart, 1e-12), args.repeats)
    nx_pi = np.array([nx_scores[i] for i in range(n)])
    diff = float(np.abs(np.asarray(lab_pi, np.float64) - nx_pi).max())
    ratio = nx_s / lab_s
    chosen = backend(args.impl)
    print(f"graph: dense, {n} nodes, {graph.number_of_edges()} edges; alpha={ALPHA}; "
          f"jax backend {jax.default_backend()}, Lab impl {chosen.impl}"
          f"{' (interpret)' if chosen.interpret else ''}")
    print(f"lab personalized_pagerank : {lab_s * 1e3:10.3f} ms (median of {args.repeats})")
    print(f"networkx.pagerank         : {nx_s * 1e3:10.3f} ms (median of {args.repeats})")
    print(f"speed-up (networkx / lab)  : {ratio:10.1f}x  (target >= 50x: "
          f"{'met' if ratio >= 50 else 'NOT met'})")
    print(f"networkx iteration alone   : {core_s * 1e3:10.3f} ms (prebuilt CSR; "
          f"{core_s / lab_s:.1f}x Lab's time; max |diff| to networkx "
          f"{np.abs(core_pi - nx_pi).max():.1e})")
    print(f"max |lab - networkx|       : {diff:10.2e}  (target <= 1e-5: "
          f"{'met' if diff <= 1e-5 else 'NOT met'})")


if __name__ == "__main__":
    main()
