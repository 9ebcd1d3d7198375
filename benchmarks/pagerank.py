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
  matrix from the graph, which is part of what a networkx user pays on every
  call; that part is also timed alone and printed.

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
    build_s, _ = median_time(lambda: nx.to_scipy_sparse_array(graph, dtype=float), 1)
    nx_pi = np.array([nx_scores[i] for i in range(n)])
    diff = float(np.abs(np.asarray(lab_pi, np.float64) - nx_pi).max())
    ratio = nx_s / lab_s
    chosen = backend(args.impl)
    print(f"graph: dense, {n} nodes, {graph.number_of_edges()} edges; alpha={ALPHA}; "
          f"jax backend {jax.default_backend()}, Lab impl {chosen.impl}"
          f"{' (interpret)' if chosen.interpret else ''}")
    print(f"lab personalized_pagerank : {lab_s * 1e3:10.3f} ms (median of {args.repeats})")
    print(f"networkx.pagerank         : {nx_s * 1e3:10.3f} ms (median of {args.repeats}; "
          f"of which building the scipy matrix from the graph ~{build_s * 1e3:.0f} ms)")
    print(f"speed-up (networkx / lab)  : {ratio:10.1f}x  (target >= 50x: "
          f"{'met' if ratio >= 50 else 'NOT met'})")
    iter_s = max(nx_s - build_s, 1e-9)
    print(f"networkx without the build : ~{iter_s * 1e3:9.1f} ms (difference of medians), "
          f"~{iter_s / lab_s:.1f}x Lab's time")
    print(f"max |lab - networkx|       : {diff:10.2e}  (target <= 1e-5: "
          f"{'met' if diff <= 1e-5 else 'NOT met'})")


if __name__ == "__main__":
    main()
