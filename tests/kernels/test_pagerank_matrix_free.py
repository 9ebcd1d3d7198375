"""Matrix-free attention PageRank against PRKV's materialised graph, the kernel, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import attention as attention_kernels
from kernels_pallas import pagerank as PR
from lab.methods.prkv import prkv_scores


def layer(b=2, h=4, hkv=2, t=150, hd=24, lengths=(150, 97), window=16, seed=0, q_scale=2.0):
    """Random queries/keys of one layer, right-padded rows (position -1), window restart."""
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.normal(size=(b, h, t, hd)) * q_scale, jnp.float32)
    k = jnp.asarray(r.normal(size=(b, hkv, t, hd)), jnp.float32)
    idx, lengths = np.arange(t)[None], np.asarray(lengths)[:, None]
    pos = jnp.asarray(np.where(idx < lengths, idx, -1), jnp.int32)
    on = (idx < lengths) & (idx >= lengths - window)
    return q, k, jnp.asarray(on / on.sum(-1, keepdims=True), jnp.float32), pos


def softmax_attention(q, k, pos):
    """``[B, H, T, T]`` causal attention probabilities materialised with jax.nn.softmax under
    lab.nn's mask (key position in [0, query position]); padding rows are zero."""
    b, h, t, hd = q.shape
    kk = jnp.repeat(k, h // k.shape[1], axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, kk, precision="highest") * hd ** -0.5
    ok = (pos[:, None, None, :] >= 0) & (pos[:, None, None, :] <= pos[:, None, :, None])
    return jnp.where(ok, jax.nn.softmax(jnp.where(ok, s, -1e30), axis=-1), 0.0)


def materialised(q, k, v, pos, *, graph="group", **kw):
    """PRKV's path on one layer: attention -> transition_graph -> personalized_pagerank."""
    attn = softmax_attention(q, k, pos)[None]
    return np.asarray(prkv_scores(attn, v, k.shape[1], graph=graph, impl="xla", **kw)[0])


def float64_graph(q, k, pos, graph="group"):
    """The chain's attention rows in float64 numpy, ``[B, Hg, T, T]`` (the group mean for
    ``graph="group"``), padding rows zero."""
    q, k, pos = (np.asarray(x, np.float64) for x in (q, k, pos))
    b, h, t, hd = q.shape
    hkv = k.shape[1]
    s = np.einsum("bhqd,bhkd->bhqk", q, np.repeat(k, h // hkv, axis=1)) * hd ** -0.5
    ok = (pos[:, None, None, :] >= 0) & (pos[:, None, None, :] <= pos[:, None, :, None])
    s = np.where(ok, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    d = e.sum(-1, keepdims=True)
    a = np.where(d > 0, e / np.where(d > 0, d, 1.0), 0.0)
    return a.reshape(b, hkv, h // hkv, t, t).mean(2) if graph == "group" else a


def float64_truth(q, k, v, pos, *, alpha, iters=50, graph="group"):
    """The same chain and power iteration in float64 numpy."""
    a, v = float64_graph(q, k, pos, graph), np.asarray(v, np.float64)
    vb = np.broadcast_to(v[:, None, None, :], a.shape)
    p = np.where(a.sum(-1, keepdims=True) < 0.5, vb, a)
    pi = vb[..., 0, :].copy()
    for _ in range(iters):
        pi = (1 - alpha) * vb[..., 0, :] + alpha * np.einsum("bhi,bhij->bhj", pi, p)
    return pi if graph == "group" else pi.reshape(a.shape[0], k.shape[1], -1, a.shape[-1]).mean(2)


@pytest.mark.parametrize("graph,alpha,heads", [
    ("group", 0.85, (4, 2)), ("group", 0.5, (4, 2)), ("group", 0.7, (6, 2)),
    ("group", 0.85, (3, 1)), ("head", 0.85, (4, 2)), ("head", 0.6, (4, 4)),
])
def test_reference_equals_the_materialised_prkv_path(graph, alpha, heads):
    h, hkv = heads
    q, k, v, pos = layer(h=h, hkv=hkv)
    want = materialised(q, k, v, pos, graph=graph, alpha=alpha, iters=50)
    got = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, alpha=alpha,
                                                     iters=50, graph=graph, block=32))
    assert got.shape == (2, hkv, 150)
    assert np.abs(got - want).max() <= 1e-6
    assert np.abs(got - float64_truth(q, k, v, pos, alpha=alpha, graph=graph)).max() <= 1e-6
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    assert np.abs(got[1, :, 97:]).max() == 0.0  # padding receives no mass
    # Not a trivial answer: mass spreads beyond the restart window.
    assert got[0, :, :134].sum(-1).min() > 0.05


def test_high_alpha_is_as_close_to_float64_as_the_materialised_path():
    # At alpha = 0.95 float32 rounding is amplified ~1 / (1 - alpha) = 20x and both float32
    # paths sit a few 1e-6 from the float64 solve (pi peaks near 0.74 here), so 1e-6
    # between them is out of reach: the check is accuracy against float64 instead.
    q, k, v, pos = layer(h=6, hkv=2)
    truth = float64_truth(q, k, v, pos, alpha=0.95)
    want = materialised(q, k, v, pos, alpha=0.95, iters=50)
    got = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, alpha=0.95,
                                                     block=32))
    mat_err, err = np.abs(want - truth).max(), np.abs(got - truth).max()
    assert err <= 3e-6 and err <= mat_err + 5e-7
    assert np.abs(got - want).max() <= 1e-5


def test_block_size_and_jit_do_not_change_the_result():
    q, k, v, pos = layer(t=130, lengths=(130, 70))
    base = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, block=16))
    for block in (32, 64, 256):
        other = PR.attention_pagerank_reference(q, k, v, positions=pos, block=block)
        assert np.abs(np.asarray(other) - base).max() <= 1e-6
    jitted = jax.jit(lambda *a: PR.attention_pagerank_reference(a[0], a[1], a[2], positions=a[3],
                                                                block=16))(q, k, v, pos)
    assert np.abs(np.asarray(jitted) - base).max() <= 1e-6


def test_equals_prkv_on_the_models_attention_probabilities():
    # Stats.attn comes from kernels_pallas.attention.reference under lab.nn's allowed mask.
    q, k, v, pos = layer(t=96, lengths=(96, 60), seed=3)
    allowed = (pos[:, None, None, :] >= 0) & (pos[:, None, None, :] <= pos[:, None, :, None])
    _, _, probs = attention_kernels.reference(q, k, k, mask=allowed, return_colsum=True,
                                              return_probs=True)
    want = np.asarray(prkv_scores(probs[None], v, 2, impl="xla")[0])
    got = np.asarray(PR.attention_pagerank(q, k, v, positions=pos, impl="xla"))
    # pi peaks at 0.45 here; the materialised float32 solve is itself 2.2e-6 from float64
    # (the matrix-free one 1.9e-6), so they agree to 1.0e-6, not below it.
    truth = float64_truth(q, k, v, pos, alpha=0.85)
    assert np.abs(got - want).max() <= 2e-6
    assert np.abs(got - truth).max() <= np.abs(want - truth).max() + 5e-7


@pytest.mark.parametrize("graph,block", [("group", 32), ("head", 16)])
def test_kernel_interpreted_equals_reference(graph, block):
    q, k, v, pos = layer(t=100, lengths=(100, 41), hd=20, seed=1)
    ref = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, graph=graph,
                                                     iters=30))
    ker = np.asarray(PR.attention_pagerank_kernel(q, k, v, positions=pos, graph=graph, iters=30,
                                                  block=block, interpret=True))
    assert np.abs(ker - ref).max() <= 1e-6
    via = np.asarray(PR.attention_pagerank(q, k, v, positions=pos, graph=graph, iters=30,
                                           impl="pallas"))
    assert np.abs(via - ref).max() <= 1e-6


def test_tol_stops_early_like_the_materialised_path():
    q, k, v, pos = layer(t=80, lengths=(80, 50), seed=2)
    exact = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, iters=300))
    tol, alpha = 1e-3, 0.85
    ref = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, iters=300, tol=tol))
    ker = np.asarray(PR.attention_pagerank_kernel(q, k, v, positions=pos, iters=300, tol=tol,
                                                  interpret=True))
    want = materialised(q, k, v, pos, iters=300, tol=tol)
    err = np.abs(ref - exact).sum(-1)
    # Stopped early (not converged), within the contraction bound tol * alpha / (1 - alpha),
    # at the same step as the materialised solve and the kernel.
    assert (err > 1e-6).all() and (err <= tol * alpha / (1 - alpha)).all()
    assert np.abs(ref - want).max() <= 1e-6 and np.abs(ker - ref).max() <= 1e-6


def _bad(**change):
    q, k, v, pos = layer(b=1, t=20, lengths=(20,), window=4)
    kw = dict(q=q, k=k, v=v, positions=pos)
    kw.update(change)
    return kw


@pytest.mark.parametrize("change,match", [
    (dict(q=jnp.zeros((4, 20, 24))), r"q has shape \(4, 20, 24\)"),
    (dict(k=jnp.zeros((1, 2, 19, 24))), r"k has shape \(1, 2, 19, 24\)"),
    (dict(k=jnp.zeros((1, 3, 20, 24))), r"H=4 heads and k has Hkv=3"),
    (dict(positions=jnp.zeros((1, 21), jnp.int32)), r"positions has shape \(1, 21\)"),
    (dict(positions=jnp.zeros((1, 20))), r"positions has shape .* dtype float32"),
    (dict(v=jnp.full((1, 21), 1 / 21)), r"v has shape \(1, 21\)"),
    (dict(v=jnp.full((1, 20), 0.1)), r"v is not a distribution"),
    (dict(alpha=1.0), r"alpha=1.0"), (dict(alpha=0.0), r"alpha=0.0"),
    (dict(alpha=-0.2), r"alpha=-0.2"), (dict(iters=0), r"iters=0"),
    (dict(iters=2.5), r"iters=2.5"), (dict(tol=0.0), r"tol=0.0"),
    (dict(graph="layer"), r"graph='layer'"), (dict(block=24), r"block=24"),
    (dict(scale=-1.0), r"scale=-1.0"),
])
@pytest.mark.parametrize("fn", ["reference", "kernel"])
def test_bad_input_raises_naming_the_argument(change, match, fn):
    f = (PR.attention_pagerank_reference if fn == "reference"
         else lambda **kw: PR.attention_pagerank_kernel(interpret=True, **kw))
    with pytest.raises(ValueError, match=match):
        f(**_bad(**change))


def float64_fixed_point(q, k, v, pos, *, alpha, graph="group"):
    """The chain's fixed point itself, ``pi (I - alpha P) = (1 - alpha) v``, solved in float64
    numpy on the materialised ``P`` (padding rows sent to ``v``)."""
    a, v = float64_graph(q, k, pos, graph), np.asarray(v, np.float64)
    t = a.shape[-1]
    out = np.zeros(a.shape[:-1])
    for i in range(a.shape[0]):
        for g in range(a.shape[1]):
            p = np.where(a[i, g].sum(-1, keepdims=True) < 0.5, v[i][None], a[i, g])
            out[i, g] = np.linalg.solve((np.eye(t) - alpha * p).T, (1 - alpha) * v[i])
    return out if graph == "group" else out.reshape(a.shape[0], k.shape[1], -1, t).mean(2)


@pytest.mark.parametrize("graph,alpha,heads,block", [
    ("group", 0.85, (4, 2), 32), ("group", 0.95, (6, 2), 16), ("head", 0.85, (4, 2), 64),
    ("head", 0.5, (3, 1), 128),
])
def test_exact_solve_is_the_fixed_point(graph, alpha, heads, block):
    # Back-substitution gives the chain's fixed point to float32 rounding, where power steps
    # stop alpha ** iters short of it: 50 steps of 0.95 are 0.08 away in L1 here.
    h, hkv = heads
    q, k, v, pos = layer(h=h, hkv=hkv)                      # row 1 right-padded (position -1)
    truth = float64_fixed_point(q, k, v, pos, alpha=alpha, graph=graph)
    got = np.asarray(PR.attention_pagerank_exact(q, k, v, positions=pos, alpha=alpha,
                                                 graph=graph, block=block))
    assert got.shape == (2, hkv, 150)
    assert np.abs(got - truth).max() <= 1e-6
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    assert np.abs(got[1, :, 97:]).max() == 0.0             # padding receives no mass
    dense = np.asarray(prkv_scores(softmax_attention(q, k, pos)[None], v, hkv, alpha=alpha,
                                   graph=graph, solver="exact")[0])  # prkv_dense's solve
    assert np.abs(dense - truth).max() <= 1e-6
    power = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, alpha=alpha,
                                                       graph=graph, iters=50))
    if alpha ** 50 > 1e-4:                                  # not converged in 50 steps
        gap = np.abs(power - truth).sum(-1).max()
        assert gap > 10 * np.abs(got - truth).sum(-1).max()
    long = np.asarray(PR.attention_pagerank_reference(q, k, v, positions=pos, alpha=alpha,
                                                      graph=graph, iters=600))
    assert np.abs(long - got).max() <= 2e-6                 # power iteration converges to it


def test_exact_solve_with_left_padding_under_jit_and_its_promise():
    # A batch left-padded (padding first, as lab.infer pads prompts) and a restart with mass
    # on a padding slot: the dangling row sends its mass back to v, as in the power iteration.
    q, k, _, _ = layer(t=90, lengths=(90, 90), seed=4)
    pos = np.tile(np.arange(90), (2, 1))
    pos[1, :30], pos[1, 30:] = -1, np.arange(60)
    v = np.zeros((2, 90), np.float32)
    v[:, -8:] = 1 / 8
    v[1, -8:], v[1, 5] = 0.1, 0.2                           # slot 5 is padding in row 1
    pos = jnp.asarray(pos, jnp.int32)
    truth = float64_fixed_point(q, k, v, pos, alpha=0.85)
    got = jax.jit(lambda *a: PR.attention_pagerank_exact(*a[:3], positions=a[3]))(q, k, v, pos)
    assert np.abs(np.asarray(got) - truth).max() <= 1e-6
    shuffled = pos.at[0, 5].set(7)
    with pytest.raises(ValueError, match="causal_slots=True but .* strictly increasing"):
        PR.attention_pagerank_exact(q, k, jnp.asarray(v), positions=shuffled)
