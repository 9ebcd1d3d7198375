"""GridProbe's real-model path: a tiny random Qwen3-VL directory (written by `transformers`,
with a word-level tokenizer.json and the image processor's preprocessor_config.json) read
by :class:`lab.methods.gridprobe.QwenVLReader`; its option posteriors against
`transformers` on the same prompt with Hugging Face's processed pixels, the grid probes
run through it, its embeddings and FLOPs against a hand count, bad input, and the
experiment's real path (``--config.model=<dir>``) end to end on Video-MME records written
by the test over .npy frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lab.hf import qwen3_vl_inputs as qi  # noqa: E402
from lab.methods import gridprobe as gp  # noqa: E402
from lab.nn.flops import transformer_flops, vlm_config_flops  # noqa: E402
from tests.hf.test_qwen3_vl import IMG, VID, hf_model  # noqa: E402

PROC = dict(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=64,
            max_pixels=24 * 24, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
WORDS = ("user assistant A B C D . ? ' Which object is red blue green yellow circle square "
         "Answer with the option s letter from given choices directly "
         "< > seconds 0 1 2 3 4 5 6 7 8 9").split()
VIDEO_PROC = dict(patch_size=4, temporal_patch_size=2, merge_size=2, fps=2.0,
                  size={"shortest_edge": 64, "longest_edge": 4 * 24 * 24},
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def _tokenizer_json(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    assert tok.get_vocab_size() < IMG                        # below the vision token ids
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_reader")
    ref = hf_model()
    ref.save_pretrained(str(path))
    _tokenizer_json(path)
    proc_cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or \
        transformers.Qwen2VLImageProcessor
    proc = proc_cls(**PROC)
    proc.save_pretrained(str(path))
    # the video processor's settings as transformers writes them (its class needs torchvision)
    (path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PROC))
    return ref, proc, gp.QwenVLReader.from_pretrained(str(path)), str(path)


def _videos(b=2, n=4, size=20, seed=0):
    return (np.random.default_rng(seed).random((b, n, size, size, 3)) * 255).astype(np.uint8)


def _hf_posterior(ref, inputs, letters):
    ids = inputs["input_ids"]
    types = torch.tensor(np.where(ids == IMG, 1, np.where(ids == VID, 2, 0)))
    kw = {k: torch.tensor(v) for k, v in inputs.items() if k != "input_ids"}
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(ids, dtype=torch.long), mm_token_type_ids=types,
                     **kw).logits[0, -1].numpy()
    want = np.exp(logits[letters] - logits[letters].max())
    return want / want.sum()


def test_posteriors_match_transformers_on_the_same_prompt(ckpt):
    ref, proc, reader, _ = ckpt
    videos = _videos()
    masks = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], bool)        # 3 frames; the question alone
    qs = ["Which object is red?", "Which object is blue?"]
    opts = [["circle", "square", "green", "yellow"]] * 2
    got = reader.posteriors(videos, masks, qs, opts)
    letters = qi.letter_ids(reader.tokenizer, 4)
    for b in range(2):
        frames = list(videos[b][masks[b]])
        inputs = {"input_ids": reader.inputs(frames, qs[b], opts[b])["input_ids"]}
        if frames:                                  # Hugging Face's processor's pixels
            px = proc(images=frames, return_tensors="np")
            inputs.update(pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
        np.testing.assert_allclose(got[b], _hf_posterior(ref, inputs, letters), atol=1e-4)
        assert abs(got[b].sum() - 1) < 1e-5
    # 20x20 frames are resized to 16x16 (20 / 8 = 2.5 rounds half to even, as in
    # transformers): 4x4 patches of 4 pixels, 4 merged tokens per frame
    ids = reader.inputs(list(videos[0][:3]), qs[0], opts[0])["input_ids"]
    assert int(np.sum(ids == IMG)) == 3 * 4


def test_grid_probes_run_through_the_reader(ckpt):
    _, _, reader, _ = ckpt
    videos = _videos(b=2, n=4)
    out = gp.probe(reader, videos, ["Which object is red?"] * 2,
                   [["circle", "square", "green", "yellow"]] * 2, 2)
    assert out["posteriors"].shape == (2, 4, 4) and out["map"].shape == (2, 4)
    direct = reader.posteriors(videos[:, [0, 1]], np.ones((2, 2), bool),
                               ["Which object is red?"] * 2,
                               [["circle", "square", "green", "yellow"]] * 2)
    np.testing.assert_allclose(out["posteriors"][:, 0], direct, atol=1e-6)   # row probe 0


def test_video_mode_matches_transformers_on_the_same_prompt(ckpt):
    """Frames as one Qwen3-VL video: pairs of frames per temporal patch, each pair's mean
    time written before its tokens; the posterior equals transformers' on the same ids and
    video patches (the patches themselves are checked against transformers' video processor
    in tests/hf/test_qwen3_vl_inputs.py)."""
    ref, _, _, path = ckpt
    reader = gp.QwenVLReader.from_pretrained(path, video=True)
    assert reader.video == qi.VideoProcessing(patch_size=4, min_pixels=64,
                                              max_pixels=4 * 24 * 24, fps=2.0)
    videos = _videos()
    masks = np.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool)
    times = np.array([[0.5, 1.5, 2.5, 3.5], [0.0, 2.0, 4.0, 6.0]])
    qs = ["Which object is red?", "Which object is blue?"]
    opts = [["circle", "square", "green", "yellow"]] * 2
    got = reader.posteriors(videos, masks, qs, opts, times=times)
    letters = qi.letter_ids(reader.tokenizer, 4)
    for b in range(2):
        keep = np.flatnonzero(masks[b])
        inputs = reader.inputs(list(videos[b][keep]), qs[b], opts[b], times=times[b][keep])
        assert set(inputs) == {"input_ids", "pixel_values_videos", "video_grid_thw"}
        np.testing.assert_allclose(got[b], _hf_posterior(ref, inputs, letters), atol=1e-4)
    # frames at 0.5, 2.5 and 3.5 s (the last repeated): patches at 1.5 and 3.5 s; the clip of
    # 3 frames of 20x20 fits 4 x 24 x 24 pixels at 16x16 (4 merged tokens per patch)
    inputs = reader.inputs(list(videos[0][[0, 2, 3]]), qs[0], opts[0], times=[0.5, 2.5, 3.5])
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    ids = inputs["input_ids"][0].tolist()
    want = qi.video_prompt(reader.tokenizer, reader.config, [1.5, 3.5], 4)
    assert any(ids[i:i + len(want)] == want for i in range(len(ids)))
    # the times reach the prompt: other times, other ids and another posterior
    other = reader.posteriors(videos, masks, qs, opts, times=times + 5)
    assert np.abs(other - got).max() > 1e-4
    with pytest.raises(ValueError, match="times has shape"):
        reader.inputs(list(videos[0][:3]), qs[0], opts[0], times=[0.5, 1.0])


def test_grid_probes_carry_frame_times_to_a_video_reader(ckpt):
    _, _, reader, path = ckpt
    video = gp.QwenVLReader.from_pretrained(path, video=True)
    videos = _videos(b=1, n=4)
    q, o = ["Which object is red?"], [["circle", "square", "green", "yellow"]]
    times = np.array([[1.0, 3.0, 5.0, 7.0]])
    out = gp.probe(video, videos, q, o, 2, times=times)
    for probe_row, slots in ((0, [0, 1]), (2, [0, 2])):      # row probe 0, column probe 0
        direct = video.posteriors(videos[:, slots], np.ones((1, 2), bool), q, o,
                                  times=times[:, slots])
        np.testing.assert_allclose(out["posteriors"][:, probe_row], direct, atol=1e-6)
    with pytest.raises(ValueError, match="only a QwenVLReader reads frame times"):
        gp.probe(object(), videos, q, o, 2, times=times)


def test_video_mode_flops(ckpt):
    _, _, _, path = ckpt
    video = gp.QwenVLReader.from_pretrained(path, video=True)
    images = gp.QwenVLReader.from_pretrained(path)
    # 3 frames of 20x20: one clip of 16x16 frames (3 x 16 x 16 within 4 x 24 x 24 pixels),
    # the last frame repeated: 2 temporal patches of 4 merged tokens; the prompt holds the
    # patches' times (frames at 0, 0.5, 1 s by default: patches at 0.25 and 1.0) and markers
    assert qi.video_smart_resize(3, 20, 20, video.video) == (16, 16)
    text = len(qi.choice_prompt(video.tokenizer, video.config, [], "question", ["option"] * 4,
                                video=([0.25, 1.0], 0)))
    want = vlm_config_flops(video.config, 1, 4, 16, 16, text)
    assert want["visual_tokens"] == 8
    assert video.forward_flops(3, 20, 4) == want["total"]
    # a pair of frames shares one temporal patch: 4 frames cost the ViT half of 4 images
    assert video.forward_flops(4, 20, 4) < images.forward_flops(4, 20, 4)


def test_embeddings_and_flops(ckpt):
    _, _, reader, _ = ckpt
    emb = reader.frame_embeddings(_videos(b=2, n=3))
    assert emb.shape == (2, 3, reader.config.text.d_model) and np.isfinite(emb).all()
    q = reader.question_embeddings(["Which object is red?", "Which object is blue?"])
    assert q.shape == (2, reader.config.text.d_model) and not np.allclose(q[0], q[1])
    # 20x20 frames become 16x16 (sides to multiples of patch 4 x merge 2 = 8): 4x4 patches,
    # 4 merged tokens per frame; the chat prompt of a 4-option question plus 2 markers per
    # frame; each frame is one temporal patch of 2 copies
    text = len(qi.choice_prompt(reader.tokenizer, reader.config, [], "question",
                                ["option"] * 4))
    for frames in (1, 3):
        want = vlm_config_flops(reader.config, 1, 2 * frames, 16, 16, text + 2 * frames)
        assert want["visual_tokens"] == 4 * frames
        assert reader.forward_flops(frames, 20, 4) == want["total"]
    assert reader.forward_flops(3, 20, 4) > reader.forward_flops(1, 20, 4)
    # the question alone (KL confidences' prior pass): the decoder over the chat prompt
    assert reader.forward_flops(0, 20, 4) == transformer_flops(reader.config.text, 1,
                                                               text)["total"]
    # the similarity selector's cost: the ViT alone over every frame
    assert reader.vision_flops(3, 20) == vlm_config_flops(reader.config, 1, 6, 16, 16,
                                                          0)["vision"] > 0
    assert reader.vision_flops(3, 20, width=28) == vlm_config_flops(
        reader.config, 1, 6, 16, 32, 0)["vision"]                  # 20x28 -> 16x32


def test_bad_input(ckpt, tmp_path):
    _, _, reader, _ = ckpt
    with pytest.raises(ValueError, match="expected a lab.nn.VLM"):
        gp.QwenVLReader(object(), reader.tokenizer)
    with pytest.raises(ValueError, match="patch_size"):
        gp.QwenVLReader(reader.model, reader.tokenizer, qi.ImageProcessing(patch_size=8))
    with pytest.raises(ValueError, match=r"images\[0\]"):
        reader.posteriors(_videos().astype(np.float32), np.ones((2, 4), bool), ["q", "q"],
                          [["a", "b"]] * 2)


def _videomme(tmp_path, n_videos=2, frames=6, size=(20, 28)):
    import json
    rng = np.random.default_rng(3)
    records = []
    for v in range(n_videos):
        folder = tmp_path / "frames" / f"yt{v}"
        folder.mkdir(parents=True)
        for f in range(frames):
            np.save(folder / f"frame_{f}.npy",
                    (rng.random((*size, 3)) * 255).astype(np.uint8))
        for j in range(2 if v == 0 else 1):
            records.append({"video_id": f"{v:03d}", "videoID": f"yt{v}",
                            "duration": ("short", "medium", "long")[v % 3],
                            "domain": "d", "sub_category": "s",
                            "question_id": f"{v:03d}-{j}", "task_type": "Object Recognition",
                            "question": "Which object is red?",
                            "options": ["A. circle", "B. square", "C. green", "D. yellow"],
                            "answer": "ABCD"[(v + j) % 4]})
    (tmp_path / "records.json").write_text(json.dumps(records))
    return str(tmp_path / "records.json"), str(tmp_path / "frames")


def test_the_experiments_real_path_end_to_end(ckpt, tmp_path):
    import json
    import os

    from configs.gridprobe import get_config
    from experiments import gridprobe as exp
    records, frames = _videomme(tmp_path)
    c = get_config("test")
    c.k = 2
    _, _, reader, path = ckpt
    c.model, c.records, c.frames_dir = path, records, frames
    results = exp.run(c, str(tmp_path / "out"))
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert on_disk["claims"] == results["claims"]
    assert os.path.exists(tmp_path / "out" / "report.md")
    rows = {(r["pair"], r["selector"]): r for r in results["table"]}
    assert set(rows) == {("large/large", s) for s in gp.SELECTORS}      # one model
    assert rows[("large/large", "monolithic")]["frames"] == 4
    assert results["real"]["n"] == 3 and len(results["regime"]) == 1
    # every selector's GFLOPs: the QA pass, plus 2K probes of K frames for GridProbe's
    mono = rows[("large/large", "monolithic")]["gflops"]
    assert mono == pytest.approx(reader.forward_flops(4, 20, 4, width=28) / 1e9)
    fixed = rows[("large/large", "gridprobe_fixed")]
    m = results["fixed_m"]["large/large"]
    want = (reader.forward_flops(m, 20, 4, width=28)
            + 4 * reader.forward_flops(2, 20, 4, width=28)) / 1e9
    assert fixed["gflops"] == pytest.approx(want)
    sim = rows[("large/large", "similarity")]
    assert sim["gflops"] == pytest.approx((reader.vision_flops(4, 20, width=28) + reader
                                           .forward_flops(m, 20, 4, width=28)) / 1e9)
    claims = [x["claim"] for x in results["claims"]]
    assert any("videomme duration class" in x for x in claims)
    # the frames as one Qwen3-VL video, timestamped at the extraction rate; KL confidences,
    # whose probes cost the question alone once more
    c.qwen_input, c.frames_fps, c.confidence = "video", 0.5, "kl"
    results = exp.run(c, str(tmp_path / "out_video"))
    video = gp.QwenVLReader.from_pretrained(path, video=True)
    rows = {(r["pair"], r["selector"]): r for r in results["table"]}
    assert results["real"]["input"] == "video" and results["real"]["confidence"] == "kl"
    assert rows[("large/large", "monolithic")]["gflops"] == pytest.approx(
        video.forward_flops(4, 20, 4, width=28) / 1e9)
    m = results["fixed_m"]["large/large"]
    assert rows[("large/large", "gridprobe_fixed")]["gflops"] == pytest.approx(
        (video.forward_flops(m, 20, 4, width=28) + 4 * video.forward_flops(2, 20, 4, width=28)
         + video.forward_flops(0, 20, 4, width=28)) / 1e9)
    assert "one video, timestamped at 0.5 extracted frames per second" in (
        tmp_path / "out_video" / "report.md").read_text()
    for field, value in (("qwen_input", "audio"), ("frames_fps", 0.0)):
        bad = get_config("test")
        bad.update({"k": 2, "model": path, "records": records, "frames_dir": frames,
                    field: value})
        with pytest.raises(ValueError, match=field):
            exp.run(bad, str(tmp_path / "out_bad"))
    c.qwen_input, c.confidence = "images", "peak"
    # too few extracted frames for the grid: a clear error naming the video
    c.k = 3
    with pytest.raises(ValueError, match="video '000' has 6 extracted frames"):
        exp.run(c, str(tmp_path / "out3"))
    c.k, c.records = 2, ""
    with pytest.raises(ValueError, match="records"):
        exp.run(c, str(tmp_path / "out4"))
    c.records, c.model = records, str(tmp_path / "no_such_dir")
    with pytest.raises(ValueError, match="model.*Qwen3-VL checkpoint directory"):
        exp.run(c, str(tmp_path / "out5"))
