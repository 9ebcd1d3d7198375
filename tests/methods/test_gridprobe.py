"""GridProbe: Shape-Adaptive Selection on hand-built maps, the alternative rules, top-M and
the baselines' masks, grid layout, the FLOPs of each selector against a hand count, bad
input, a tiny VLM's probes end to end, and a zoo VLM as selector / QA model."""

import math

import jax
import numpy as np
import pytest
from flax import nnx

from lab.data import oracle_answer, video_qa
from lab.methods import gridprobe as gp
from lab.methods.gridprobe import models as gm
from lab.nn.flops import transformer_flops, vision_dims, vit_flops


def _moments(v):
    v = np.asarray(v, np.float64)
    d = v - v.mean()
    sd = np.sqrt((d ** 2).mean())
    return (d ** 3).mean() / sd ** 3, (d ** 4).mean() / sd ** 4 - 3


def test_shape_rule_on_hand_built_maps():
    k2 = 64
    assert int(gp.shape_adaptive_m(np.full(k2, 0.3))) == k2          # zero spread keeps all
    peak = np.full(k2, 0.01)
    peak[17] = 1.0
    s, k = _moments(peak)
    want = math.ceil(k2 / (1 + 3 * (abs(s) + 0.5 * max(0, k))))
    assert int(gp.shape_adaptive_m(peak)) == want <= 2               # one sharp peak keeps few
    # a symmetric two-level map (skew 0, excess kurtosis -2) keeps all; clipping applies
    two = np.array([0.2, 0.8] * 32)
    assert int(gp.shape_adaptive_m(two)) == k2
    assert int(gp.shape_adaptive_m(two, m_max=10)) == 10
    assert int(gp.shape_adaptive_m(peak, m_min=5)) == 5
    # an outer product of row / column confidences, batched; scale=0 keeps all
    rng = np.random.default_rng(0)
    rows, cols = rng.uniform(0.25, 1, (3, 8)), rng.uniform(0.25, 1, (3, 8))
    maps = np.asarray(gp.importance_map(rows, cols))
    assert np.allclose(maps[1].reshape(8, 8), np.outer(rows[1], cols[1]))
    got = np.asarray(gp.shape_adaptive_m(maps))
    for i in range(3):
        s, k = _moments(maps[i])
        assert got[i] == min(k2, max(1, math.ceil(k2 / (1 + 3 * (abs(s) + 0.5 * max(0, k))))))
    assert np.all(np.asarray(gp.shape_adaptive_m(maps, scale=0.0)) == k2)


def test_alternative_rules():
    peak = np.full(16, 0.01)
    peak[3] = 1.0
    flat = np.full(16, 0.5)
    for rule in gp.RULES:
        assert int(gp.select_m(flat, rule)) == 16, rule
        assert int(gp.select_m(peak, rule)) <= 2, rule
    # participation ratio: two equal peaks -> 2; capped by the 90%-mass count
    two = np.zeros(16)
    two[[1, 9]] = 1.0
    assert int(gp.select_m(two, "participation")) == 2
    skew = np.zeros(16)
    skew[:4] = [10, 1, 1, 1]       # PR = 169/103 -> 2, but 90% mass needs 3 frames
    assert int(gp.select_m(skew, "participation")) == 2
    assert int(gp.select_m(skew, "participation", mass=0.5)) == 1
    # mean threshold counts values above the mean; Otsu splits two clusters
    v = np.array([0.9, 0.85, 0.8, 0.1, 0.1, 0.12, 0.1, 0.11, 0.1])
    assert int(gp.select_m(v, "mean")) == 3 and int(gp.select_m(v, "otsu")) == 3


def test_top_m_and_baseline_masks():
    imp = np.array([[0.1, 0.9, 0.3, 0.7], [0.5, 0.5, 0.5, 0.5]])
    mask = np.asarray(gp.top_m_mask(imp, np.array([2, 3])))
    assert mask[0].tolist() == [False, True, False, True]
    assert mask[1].tolist() == [True, True, True, False]            # ties -> earlier slots
    assert gp.select("uniform", n=16, m=4, batch=1)[0].nonzero()[0].tolist() == [2, 6, 10, 14]
    assert gp.select("monolithic", n=16, batch=2).all()
    emb = np.eye(4)[None].repeat(1, 0)                                # frame i = e_i
    sim = gp.select("similarity", n=4, m=1, frame_emb=emb, query_emb=np.array([[0, 0, 1, 0.]]))
    assert sim[0].tolist() == [False, False, True, False]
    sel = gp.select("gridprobe", n=4, importance=imp[:1])
    assert sel.sum() == int(gp.shape_adaptive_m(imp[0]))


def test_grid_layout_and_bad_input():
    assert gp.grid_frames(64, 4).tolist() == list(range(2, 64, 4))
    slots = gp.probe_slots(3)
    assert slots[0].tolist() == [0, 1, 2] and slots[3].tolist() == [0, 3, 6]
    with pytest.raises(ValueError, match=r"k=8 needs K\^2=64 distinct frames but the video "
                                         r"has 32"):
        gp.grid_frames(32, 8)
    with pytest.raises(ValueError, match="rule='median'"):
        gp.select_m(np.ones(4), "median")
    with pytest.raises(ValueError, match="m_min=0"):
        gp.shape_adaptive_m(np.ones(4), m_min=0)
    with pytest.raises(ValueError, match="m_max=9"):
        gp.shape_adaptive_m(np.ones(4), m_max=9)
    with pytest.raises(ValueError, match="importance_map has shape"):
        gp.shape_adaptive_m(np.ones((2, 2, 2, 2)))
    with pytest.raises(ValueError, match="m=20"):
        gp.select("uniform", n=16, m=20, batch=1)


def test_selector_flops_against_hand_count():
    """forward_flops = ViT over the frames + decoder over their tokens, markers, question
    and options; GridProbe's probes are 2K forwards of K frames (K=4, 32-pixel frames)."""
    cfg = gm.vlm_config(32, 1)
    size, q, o, k = 32, gm.QUESTION_LEN, 4, 4
    dims = vision_dims(cfg.vision, size, size)
    per = dims.tokens_out                                          # 4 merged tokens / frame
    assert per == 4

    def hand(m):
        v = vit_flops(dims, m)["total"]
        lm = transformer_flops(cfg.text, 1, m * per + 2 * m + q + o)["total"]
        return v + lm

    for m in (1, 4, 16):
        assert gm.forward_flops(cfg, m, size, q, o) == hand(m)
    # by hand, the ViT's patch embedding alone: 16 patches x 2 x 192 x 32 per frame
    assert vit_flops(dims, 1)["patch_embed"] == 16 * 2 * 192 * 32
    probes = 2 * k * gm.forward_flops(cfg, k, size, q, o)
    assert probes == 8 * hand(4)
    # GridProbe at M frames costs its probes + QA(M): the monolithic pass is QA(16)
    assert probes + hand(2) > hand(16) * 0.5


def _tiny_vlm_on_lookup(n: int, seed: int):
    """A random tiny VLM (its config too) and ``n`` lookup questions: videos, question ids
    and one option token each."""
    from lab.data import render_videos
    cfg = gm.vlm_config(16, 1)
    ds = video_qa(n, seed=seed, frames=16, size=32, question_types=["lookup"])
    q = [gm.words(x) for x in ds["question"]]
    o = np.array([[gm.words(x)[0] for x in opts] for opts in ds["options"]])
    return cfg, gm.VLM(cfg, rngs=nnx.Rngs(0)), render_videos(ds), q, o


def test_probes_on_a_tiny_vlm():
    """A random tiny VLM: probes give K row and K column confidences in [1/4, 1]; the map
    is their outer product; a posterior equals choice_posterior on the same prompt."""
    cfg, model, videos, q, o = _tiny_vlm_on_lookup(3, 0)
    out = gp.probe(model, videos, q, o, 4, chunk=8)
    assert out["row"].shape == (3, 4) and out["map"].shape == (3, 16)
    assert np.all(out["row"] >= 0.25 - 1e-6) and np.all(out["row"] <= 1)
    assert np.allclose(out["map"][0].reshape(4, 4), np.outer(out["row"][0], out["col"][0]),
                       atol=1e-6)
    ids, pixels, grid = gm.batch_inputs(cfg, videos[:1, :4], q[:1])
    ref = model.choice_posterior(ids, [[int(t)] for t in o[0]], pixel_values_videos=pixels,
                                 video_grid_thw=grid)
    mine = gm.posteriors(model, videos[:1, :4], np.ones((1, 4), bool), q[:1], o[:1],
                         chunk=8)                                   # the probes' program
    assert np.allclose(np.asarray(ref), mine, atol=1e-5)
    # the similarity baseline's frame embedding: the mean merged visual token of the frame
    emb = gm.frame_embeddings(model, videos[:1], chunk=5)
    tokens = jax.jit(lambda px: model.visual(px, np.array([[16, 4, 4]]))[0])(
        gm.patchify(videos[0], cfg))                     # one video of 16 frames, unchunked
    assert np.allclose(np.asarray(tokens).reshape(16, 4, -1).mean(1), emb[0], atol=1e-5)
    with pytest.raises(ValueError, match="K=3 grid needs K\\^2=9"):
        gp.probe(model, videos, q, o, 3)


def test_kl_confidence_measures_what_the_frames_add_to_the_question():
    """KL(posterior || no-frame posterior): 0 where the frames leave the question alone's
    answer as it was, however peaked; log 4 for a certain answer over a uniform prior; the
    peak posterior cannot tell the two apart."""
    prior = np.array([0.85, 0.05, 0.05, 0.05], np.float32)
    post = np.stack([prior,                                           # frames add nothing
                     [0.05, 0.85, 0.05, 0.05],                        # they move the answer
                     [1.0, 0.0, 0.0, 0.0]]).astype(np.float32)
    kl = np.asarray(gp.confidences(post, prior))
    assert kl[0] == pytest.approx(0.0, abs=1e-6)
    want = 0.85 * np.log(0.85 / 0.05) + 0.05 * np.log(0.05 / 0.85)
    assert kl[1] == pytest.approx(want, rel=1e-5)
    assert kl[2] == pytest.approx(-np.log(0.85), rel=1e-5)             # 0 log 0 = 0
    peak = np.asarray(gp.confidences(post))
    assert peak[0] == peak[1] == pytest.approx(0.85)                  # the same to the peak
    uniform = np.full(4, 0.25, np.float32)
    assert float(gp.confidences(np.eye(4, dtype=np.float32)[0], uniform)) == \
        pytest.approx(np.log(4), rel=1e-6)
    # batched: one prior per question, broadcast over its probes
    batch = np.asarray(gp.confidences(np.stack([post, post]), np.stack([prior, uniform])[:, None]))
    assert batch.shape == (2, 3) and batch[0, 0] == pytest.approx(0.0, abs=1e-6)
    assert batch[1, 0] > 0.1


def test_probes_with_kl_confidence_on_a_tiny_vlm():
    _, model, videos, q, o = _tiny_vlm_on_lookup(2, 1)
    out = gp.probe(model, videos, q, o, 4, chunk=8, confidence="kl")
    prior = gm.posteriors(model, videos, np.zeros((2, 16), bool), q, o, chunk=8)
    np.testing.assert_allclose(out["prior"], prior, atol=1e-6)
    want = np.asarray(gp.confidences(out["posteriors"], prior[:, None]))
    np.testing.assert_allclose(np.concatenate([out["row"], out["col"]], 1), want, atol=1e-6)
    assert np.all(out["row"] >= 0)
    peak = gp.probe(model, videos, q, o, 4, chunk=8)
    np.testing.assert_allclose(peak["posteriors"], out["posteriors"], atol=1e-6)
    with pytest.raises(ValueError, match="confidence='entropy'"):
        gp.probe(model, videos, q, o, 4, confidence="entropy")


def test_lookup_position_shortcuts_near_chance():
    """Position heuristics (first / last / middle frames) with perfect perception leave a
    lookup question near chance: the evidence is 1-3 of 16 frames anywhere."""
    ds = video_qa(400, seed=4, frames=16, size=32, question_types=["lookup"])
    rng = np.random.default_rng(0)
    for frames in ([0], [15], [7, 8]):
        acc = np.mean([oracle_answer(r, frames, rng) == r["answer_index"] for r in ds])
        assert acc < 0.25 + 0.75 * 3 / 16 + 0.06, (frames, acc)
    assert np.mean([oracle_answer(r, r["evidence_frames"], rng) == r["answer_index"]
                    for r in ds]) == 1.0


def test_zoo_reader_matches_the_zoo_and_counts_its_prompt():
    """A zoo VLM as selector / QA model: every frame kept gives lab.zoo.vlm.posteriors of
    the video; two kept frames run as two slots (a power of two) in time order; a row
    without frames reads one empty canvas; FLOPs count the zoo prompt's tokens by hand."""
    from lab import zoo
    from lab.data import render_videos
    from lab.zoo import vlm as zv

    model, tok = zoo.load("vlm-xs", source="shipped", progress=False)
    reader = gp.ZooReader(model, tok)
    ds = video_qa(2, seed=0, frames=16, size=32, question_types=["lookup"])
    videos = render_videos(ds)
    q, o = list(ds["question"]), [list(x) for x in ds["options"]]
    full = reader.posteriors(videos, np.ones((2, 16), bool), q, o, chunk=2)
    assert np.allclose(full, zv.posteriors(model, videos, q, o, batch_size=2), atol=1e-5)
    masks = np.zeros((2, 16), bool)
    masks[:, [3, 9]] = True
    two = reader.posteriors(videos, masks, q, o, chunk=2)
    assert np.allclose(two, zv.posteriors(model, videos[:, [3, 9]], q, o, batch_size=2),
                       atol=1e-5)
    blank = np.broadcast_to(zv.BACKGROUND, videos[:, :1].shape).copy()
    none = reader.posteriors(videos, np.zeros((2, 16), bool), q, o, chunk=2)
    assert np.allclose(none, zv.posteriors(model, blank, q, o, batch_size=2), atol=1e-5)
    out = gp.probe(reader, videos, q, o, 4, chunk=2)
    assert out["map"].shape == (2, 16) and np.all(out["row"] >= 0.25 - 1e-6)
    cfg = model.config
    dims = vision_dims(cfg.vision, 32, 32)
    per = dims.tokens_out
    for m in (1, 4, 16):      # <bos>, 16 question slots, markers, <answer>, 4 options x 5
        text = 1 + 16 + m * (per + 2) + 1 + 4 * 5
        assert reader.forward_flops(m, 32, 4) == (vit_flops(dims, m)["total"] + transformer_flops(
            cfg.text, 1, text)["total"])
        assert reader.vision_flops(m, 32) == vit_flops(dims, m)["total"]   # the ViT alone
    # the question alone runs one blank frame (the `none` posteriors above), and costs it
    assert reader.forward_flops(0, 32, 4) == reader.forward_flops(1, 32, 4)
    emb = reader.frame_embeddings(videos[:1], chunk=16)
    assert emb.shape == (1, 16, cfg.text.d_model)
    assert reader.question_embeddings(q).shape == (2, cfg.text.d_model)
