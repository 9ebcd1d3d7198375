"""kernels_pallas.pagerank: kernel (interpreted on CPU) vs jnp reference vs networkx.pagerank."""

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

from kernels_pallas import pagerank as PR

ALPHA = 0.85


def random_graphs(heads=3, n=37, seed=0):
    """Sparse weighted digraphs, one per head, each with a dangling node; restart vectors."""
    r = np.random.default_rng(seed)
    adj = (r.random((heads, n, n)) < 0.2) * r.random((heads, n, n))
    adj[:, 5] = 0.0  # node 5 has no out-edges
    v = r.random((heads, n))
    v[:, :10] = 0.0  # restart only on the last nodes, like PRKV's observation window
    return adj, v / v.sum(-1, keepdims=True)


def networkx_scores(adj, v):
    """networkx.pagerank per head. Its stop rule is L1 change < N * tol, so tol is tiny here."""
    out = []
    for a, p in zip(adj, v, strict=True):
        g = nx.from_numpy_array(a, create_using=nx.DiGraph)
        d = nx.pagerank(g, alpha=ALPHA, personalization=dict(enumerate(p)), tol=1e-14,
                        max_iter=1000)
        out.append([d[i] for i in range(len(p))])
    return np.array(out)


def stochastic(adj, v):
    """Row-normalised adjacency with dangling rows sent to v (networkx's rule), in numpy."""
    sums = adj.sum(-1, keepdims=True)
    return np.where(sums > 0, adj / np.where(sums > 0, sums, 1), v[:, None, :])


def test_kernel_reference_and_networkx_agree():
    adj, v = random_graphs()
    want = networkx_scores(adj, v)
    ref = PR.pagerank_reference(adj, v, alpha=ALPHA, iters=500, tol=1e-9, normalize=True)
    ker = PR.pagerank_kernel(adj, v, alpha=ALPHA, iters=500, tol=1e-9, normalize=True, block=16,
                             interpret=True)
    assert ref.shape == ker.shape == (3, 37)
    assert float(np.abs(np.asarray(ref) - want).max()) <= 1e-5
    assert float(np.abs(np.asarray(ker) - want).max()) <= 1e-5
    assert float(jnp.abs(ker - ref).max()) <= 1e-6
    # The restart mass matters: scores differ from plain PageRank.
    plain = nx.pagerank(nx.from_numpy_array(adj[0], create_using=nx.DiGraph), alpha=ALPHA)
    assert np.abs(np.array([plain[i] for i in range(37)]) - want[0]).max() > 1e-3


def test_fixed_iterations_batched_leading_axes_and_shared_v():
    adj, v = random_graphs(heads=4, n=20, seed=1)
    p = stochastic(adj, v).reshape(2, 2, 20, 20)
    shared = v[0]  # one restart vector broadcast over the [2, 2] batch
    ref = PR.pagerank_reference(p, shared, alpha=ALPHA, iters=100)
    ker = PR.personalized_pagerank(p, shared, alpha=ALPHA, iters=100, impl="pallas")
    assert ref.shape == ker.shape == (2, 2, 20)
    assert float(jnp.abs(ker - ref).max()) <= 1e-6
    # The result is the fixed point: pi = (1 - alpha) v + alpha pi P, and a distribution.
    pi = np.asarray(ref, np.float64)
    residual = (1 - ALPHA) * shared + ALPHA * np.einsum("...i,...ij->...j", pi, p) - pi
    assert np.abs(residual).max() <= 1e-6
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-5)


def test_tol_stops_early_with_bounded_error():
    adj, v = random_graphs(heads=2, n=30, seed=2)
    p = stochastic(adj, v)
    exact = np.asarray(PR.pagerank_reference(p, v, iters=400))
    tol = 1e-3
    ref = np.asarray(PR.pagerank_reference(p, v, iters=400, tol=tol))
    ker = np.asarray(PR.pagerank_kernel(p, v, iters=400, tol=tol, block=16, interpret=True))
    err = np.abs(ref - exact).sum(-1)
    # Stopped early (not converged), within the contraction bound tol * alpha / (1 - alpha).
    assert (err > 1e-6).all() and (err <= tol * ALPHA / (1 - ALPHA)).all()
    assert np.abs(ker - ref).max() <= 1e-6  # the kernel applies the same stop rule per head


def test_dispatch_under_jit_and_bad_impl():
    adj, v = random_graphs(heads=2, n=12, seed=3)
    p = jnp.asarray(stochastic(adj, v))
    fn = jax.jit(lambda a, b: PR.personalized_pagerank(a, b, iters=60, impl="xla"))
    np.testing.assert_allclose(fn(p, v), PR.pagerank_reference(p, v, iters=60), atol=1e-6)
    with pytest.raises(ValueError, match="impl='cuda'"):
        PR.personalized_pagerank(p, v, impl="cuda")


def test_bad_inputs_name_the_problem():
    adj, v = random_graphs(heads=1, n=16, seed=4)
    p = stochastic(adj, v)
    dangling = p.copy()
    dangling[0, 5] = 0.0
    with pytest.raises(ValueError, match=r"not row-stochastic: row \(0, 5\) sums to 0"):
        PR.personalized_pagerank(dangling, v)
    with pytest.raises(ValueError, match="negative entries"):
        PR.personalized_pagerank(p - 0.5, v, normalize=True)
    with pytest.raises(ValueError, match="v is not a distribution"):
        PR.personalized_pagerank(p, 2 * v)
    with pytest.raises(ValueError, match=r"P has shape \(1, 16, 15\)"):
        PR.personalized_pagerank(p[..., :15], v)
    with pytest.raises(ValueError, match="alpha=1.0"):
        PR.personalized_pagerank(p, v, alpha=1.0)
    with pytest.raises(ValueError, match="block=12"):
        PR.pagerank_kernel(p, v, block=12, interpret=True)
