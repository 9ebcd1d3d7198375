"""lab.methods.cot_geometry: functionals on curves of known spectrum and kinematics, batching
with masks, the exact AUC against the pairwise Mann-Whitney count, the logistic predictor,
trajectories from lab.infer, and the errors on bad input."""

import dataclasses

import jax
import numpy as np
import pytest
import scipy.linalg
from flax import nnx

from lab import infer
from lab.data import ByteTokenizer
from lab.methods import cot_geometry as cg
from lab.nn import Transformer, TransformerConfig


def known_spectrum(lam, d=12, t=64, seed=0):
    """``[t, d]`` points whose centred covariance (1/n) has eigenvalues exactly ``lam``: the
    orthogonal zero-mean +-1 columns of a Hadamard matrix scaled by sqrt(lam), rotated by a
    random orthogonal matrix and shifted."""
    h = scipy.linalg.hadamard(t)[:, 1:len(lam) + 1].astype(np.float64)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    x = (h * np.sqrt(lam)) @ q[:len(lam)]
    return (x + np.random.default_rng(seed + 1).normal(size=d)).astype(np.float32)


def brute_d_rho(lam, rho):
    c = np.cumsum(np.sort(lam)[::-1]) / np.sum(lam)
    return int(np.argmax(c >= rho - 1e-9) + 1)


LAM = np.array([5.0, 3.0, 1.0, 0.5, 0.25, 0.25])


def test_spectrum_d_rho_and_participation_ratio_on_a_known_spectrum():
    x = known_spectrum(LAM)
    np.testing.assert_allclose(cg.spectrum(x)[:6], LAM, rtol=1e-4)
    np.testing.assert_allclose(cg.spectrum(x)[6:], 0, atol=1e-4)
    for rho in (0.1, 0.5, 0.51, 0.8, 0.9, 0.95, 0.99, 1.0):
        assert int(cg.effective_dimension(x, rho)) == brute_d_rho(LAM, rho), rho
    # exactly at a boundary: 5 / 10 = 0.5 -> one component; (5 + 3) / 10 = 0.8 -> two
    assert int(cg.effective_dimension(x, 0.5)) == 1
    assert int(cg.effective_dimension(x, 0.8)) == 2
    assert float(cg.participation_ratio(x)) == pytest.approx(LAM.sum() ** 2 / (LAM ** 2).sum(),
                                                             rel=1e-4)
    # k equal eigenvalues: PR = k, d_rho(rho) = ceil(k rho); the Gram path (T < d) agrees
    flat = known_spectrum(np.ones(4), d=40, t=8)
    assert float(cg.participation_ratio(flat)) == pytest.approx(4.0, rel=1e-4)
    assert [int(cg.effective_dimension(flat, r)) for r in (0.25, 0.5, 0.6, 1.0)] == [1, 2, 3, 4]


def test_circle_and_line_kinematics():
    t = np.arange(40, dtype=np.float32)
    theta = 2 * np.pi * t / 40
    circle = np.zeros((40, 6), np.float32)
    circle[:, 0], circle[:, 1] = 3 * np.cos(theta), 3 * np.sin(theta)
    np.testing.assert_allclose(cg.spectrum(circle)[:3], [4.5, 4.5, 0], atol=1e-4)
    assert int(cg.effective_dimension(circle, 0.5)) == 1
    assert int(cg.effective_dimension(circle, 0.9)) == 2
    k = cg.kinematics(circle)
    chord = 2 * 3 * np.sin(np.pi / 40)
    assert float(k["mean_speed"]) == pytest.approx(chord, rel=1e-4)
    assert float(k["speed_dispersion"]) == pytest.approx(0, abs=1e-4)
    assert float(k["dispersion"]) == pytest.approx(9.0, rel=1e-4)
    # a straight line at constant velocity v from x0
    x0, v = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.4, 0.0])
    line = (x0 + t[:, None] * v).astype(np.float32)
    k = cg.kinematics(line)
    np.testing.assert_allclose(k["mean_velocity"], v, atol=1e-5)
    np.testing.assert_allclose(k["initial_state"], x0, atol=1e-6)
    np.testing.assert_allclose(k["mean_position"], x0 + v * t.mean(), atol=1e-4)
    assert float(k["mean_speed"]) == pytest.approx(0.5, rel=1e-5)
    assert float(k["speed_dispersion"]) == pytest.approx(0, abs=1e-5)
    assert float(k["dispersion"]) == pytest.approx(0.25 * t.var(), rel=1e-4)
    assert int(cg.effective_dimension(line, 1.0)) == 1


def test_batched_masked_features_equal_each_trajectory_alone():
    rng = np.random.default_rng(3)
    lengths = [7, 20, 2]
    x = rng.normal(size=(3, 20, 5)).astype(np.float32)
    mask = np.arange(20)[None] < np.array(lengths)[:, None]
    x_padded = np.where(mask[..., None], x, 1e3)  # garbage in the padding
    batch = cg.features(x_padded, mask, rho=0.8)
    for b, n in enumerate(lengths):
        alone = cg.features(x[b, :n], rho=0.8)
        for name in (*cg.SCALAR_FEATURES, *cg.VECTOR_FEATURES):
            np.testing.assert_allclose(batch[name][b], alone[name], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name}, row {b}")
    # under jit too (the checks skip traced inputs)
    jitted = jax.jit(lambda x, m: cg.features(x, m, rho=0.8)["d_rho"])(x_padded, mask)
    np.testing.assert_array_equal(jitted, batch["d_rho"])
    np.testing.assert_array_equal(cg.effective_dimension(x_padded, 0.8, mask), batch["d_rho"])


def test_prefix_mask_and_windowed_d_rho():
    mask = np.arange(10)[None] < np.array([10, 3, 6])[:, None]
    assert np.asarray(cg.prefix_mask(mask, 0.2, 2)).sum(1).tolist() == [2, 2, 2]
    assert np.asarray(cg.prefix_mask(mask, 0.5, 2)).sum(1).tolist() == [5, 2, 3]
    # windows of 4: a trajectory of two windows, one flat (d=1) and one plane-filling (d=2)
    w1 = np.array([[0, 0], [1, 0], [2, 0], [3, 0]], np.float32)
    w2 = np.array([[0, 0], [1, 0], [0, 1], [1, 1]], np.float32)
    x = np.zeros((2, 10, 2), np.float32)
    x[0, :8] = np.concatenate([w1, w2])
    x[1, :4] = w2
    m = np.zeros((2, 10), bool)
    m[0, :9] = True   # the third window reaches into padding: left out
    m[1, :3] = True   # shorter than a window: NaN
    mean, count = cg.windowed_effective_dimension(x, 4, 1.0, m)
    assert float(mean[0]) == pytest.approx(1.5) and count.tolist() == [2, 0]
    assert np.isnan(float(mean[1]))


def test_bad_input_names_the_problem():
    x = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match=r"have \[1\] valid steps; a trajectory needs at least 2"):
        cg.effective_dimension(x)
    batch = np.random.default_rng(0).normal(size=(3, 5, 4))
    mask = np.ones((3, 5), bool)
    mask[2, 1:] = False
    with pytest.raises(ValueError, match=r"trajectories \[2\] \(of 3\)"):
        cg.features(batch, mask)
    for rho in (0, 0.0, -0.1, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match=r"rho=.*expected .*\(0, 1\]"):
            cg.effective_dimension(batch, rho)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 4\); expected \(3, 5\)"):
        cg.spectrum(batch, np.ones((3, 4), bool))
    with pytest.raises(ValueError, match="expected a trajectory"):
        cg.spectrum(np.zeros(5))
    with pytest.raises(ValueError, match="window=1"):
        cg.windowed_effective_dimension(batch, 1)
    with pytest.raises(ValueError, match="fraction=0"):
        cg.prefix_mask(mask, 0)


def pairwise_auc(s, y):
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


def test_auc_is_the_mann_whitney_statistic_with_ties_as_half():
    assert cg.auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert cg.auc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0
    assert cg.auc([5, 5, 5, 5], [0, 1, 0, 1]) == 0.5
    # pos {2, 3} vs neg {1, 2}: 1 + 0.5 + 1 + 1 = 3.5 of 4 pairs
    assert cg.auc([1, 2, 2, 3], [0, 1, 0, 1]) == 0.875
    assert cg.midranks([10, 20, 20, 30, 20]).tolist() == [1, 3, 3, 5, 3]
    rng = np.random.default_rng(0)
    for _ in range(5):
        s, y = rng.integers(0, 6, 200), rng.integers(0, 2, 200)  # many ties
        assert cg.auc(s, y) == pytest.approx(pairwise_auc(s, y), abs=1e-12)
    assert np.isnan(cg.auc([1, 2], [1, 1]))
    # Hanley-McNeil: 0.5 AUC from 50 + 50 has se sqrt((0.25 + 49 (1/3 - 1/4) 2) / 2500)
    assert cg.auc_se(0.5, 50, 50) == pytest.approx(np.sqrt((0.25 + 98 / 12) / 2500), rel=1e-9)
    with pytest.raises(ValueError, match="differ in length"):
        cg.auc([1, 2, 3], [0, 1])
    with pytest.raises(ValueError, match="0/1"):
        cg.auc([1, 2], [0, 2])


def test_auc_matches_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    s, y = np.round(rng.normal(size=300), 1), rng.integers(0, 2, 300)
    assert cg.auc(s, y) == pytest.approx(metrics.roc_auc_score(y, s), abs=1e-12)


def test_logistic_regression_recovers_a_planted_direction():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5)) * [1, 10, 0.1, 1, 1] + [0, 5, -3, 0, 0]
    z = (x - x.mean(0)) / x.std(0)
    y = (z[:, 1] - 2 * z[:, 2] + 0.3 * rng.normal(size=400) > 0).astype(int)
    m = cg.fit_logistic(x[:300], y[:300], l2=1e-3, steps=300)
    assert m.w[1] > 0 and m.w[2] < 0 and abs(m.w[0]) < 0.3 * abs(m.w[2])
    assert cg.auc(cg.predict_logistic(m, x[300:]), y[300:]) > 0.95
    # 0/1 weights fit on the subset: the same predictor as fitting on those rows alone
    sub = cg.fit_logistic(x, y, weights=np.arange(400) < 300, l2=1e-3, steps=300)
    np.testing.assert_allclose(sub.w, m.w, rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="non-negative weights"):
        cg.fit_logistic(x, y, weights=np.zeros(400))
    with pytest.raises(ValueError, match="fitted on 5"):
        cg.predict_logistic(m, x[:, :4])
    with pytest.raises(ValueError, match=r"labels have shape \(3,\)"):
        cg.fit_logistic(x[:4], y[:3])
    with pytest.raises(ValueError, match="NaN or inf"):
        cg.fit_logistic(np.full((4, 2), np.nan), y[:4])


CFG = TransformerConfig(vocab_size=264, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                        head_dim=16, d_ff=64, max_len=64)


@dataclasses.dataclass
class StopAt:
    """ByteTokenizer's ids with another token as EOS (so a random model stops early)."""

    eos_id: int
    bos_id: int = ByteTokenizer().bos_id
    pad_id: int = ByteTokenizer().pad_id

    def encode(self, text, add_bos=False):
        return ByteTokenizer().encode(text, add_bos=add_bos)

    def decode(self, ids):
        return ByteTokenizer().decode(ids)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def test_trajectories_are_the_generated_tokens_hidden_states(model):
    prompts = ["12+3=?\n", "7-45+6=?\n", "1+1=?\n"]
    ids = [ByteTokenizer().encode(p, add_bos=True) for p in prompts]
    # row 0's first two greedy tokens, from one compiled forward (causal: the logits at the
    # prompt's last position do not see the token after it)
    fwd = nnx.jit(lambda m, x: m(x)[0, -2:])
    t0 = int(np.argmax(fwd(model, np.array([ids[0] + [0]]))[0]))
    stop = int(np.argmax(fwd(model, np.array([ids[0] + [t0]]))[1]))
    tok = StopAt(eos_id=stop)
    tr = cg.trajectories(model, [{"prompt": p} for p in prompts], tokenizer=tok, layer=[-1, 0],
                         max_new_tokens=6, batch_size=2)
    assert tr.layers == (1, 0) and tr.hidden.shape == (2, 3, 6, 32)
    assert tr.lengths[0] == (1 if t0 == stop else 2)
    np.testing.assert_array_equal(tr.mask, np.arange(6)[None] < tr.lengths[:, None])
    assert np.all(tr.hidden[:, ~tr.mask] == 0) and np.all(tr.logprobs[~tr.mask] == 0)
    # the same rows through lab.infer.generate (batches of two, padded to the longest prompt)
    width = max(len(x) for x in ids)
    batch = np.full((3, width), tok.pad_id, np.int32)
    for i, x in enumerate(ids):
        batch[i, :len(x)] = x
    lens = np.array([len(x) for x in ids], np.int32)
    for rows in ([0, 1], [2, 2]):
        ref = infer.generate(model, batch[rows], lengths=lens[rows], max_new_tokens=6,
                             stop_tokens=(stop,), capture=("hidden",), pad_id=tok.pad_id)
        for k, layer in enumerate(tr.layers):
            np.testing.assert_allclose(tr.hidden[k, rows], np.asarray(ref.hidden[layer]),
                                       atol=1e-5)
        np.testing.assert_array_equal(tr.lengths[rows], ref.lengths)
    np.testing.assert_allclose(tr.at(0), tr.hidden[1])
    n0 = tr.lengths[0]
    assert tr.texts[0] == ByteTokenizer().decode(tr.tokens[0, :n0 - 1].tolist())
    assert tr.prompt_lengths.tolist() == lens.tolist()


def test_trajectories_bad_arguments(model):
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match=r"layer=2 is outside the model's layers 0..1"):
        cg.trajectories(model, ["1+1=?\n"], tokenizer=tok, layer=2)
    with pytest.raises(ValueError, match=r"layer=-3 is outside"):
        cg.resolve_layers(-3, 1)
    with pytest.raises(ValueError, match="expected an int, a list of ints or 'all'"):
        cg.resolve_layers("last", 2)
    assert cg.resolve_layers(-1, 2) == (2,) and cg.resolve_layers("all", 2) == (0, 1, 2)
    with pytest.raises(ValueError, match="exceeds the model's max_len=64"):
        cg.trajectories(model, ["1+1=?\n"], tokenizer=tok, max_new_tokens=60)
    with pytest.raises(ValueError, match="problem 0 is int"):
        cg.trajectories(model, [3], tokenizer=tok)
