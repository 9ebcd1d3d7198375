"""GridProbe's real-model path: a tiny random Qwen3-VL directory (written by `transformers`,
with a word-level tokenizer.json and the image processor's preprocessor_config.json) read
by :class:`lab.methods.gridprobe.QwenVLReader`; its option posteriors against
`transformers` on the same prompt with Hugging Face's processed pixels, the grid probes
run through it, its embeddings and FLOPs against a hand count, bad input, and the
experiment's real path (``--config.model=<dir>``) end to end on Video-MME records written
by the test over .npy frames."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lab.hf import qwen3_vl_inputs as qi  # noqa: E402
from lab.methods import gridprobe as gp  # noqa: E402
from lab.nn.flops import vlm_config_flops  # noqa: E402
from tests.hf.test_qwen3_vl import IMG, VID, hf_model  # noqa: E402

PROC = dict(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=64,
            max_pixels=24 * 24, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
WORDS = ("user assistant A B C D . ? ' Which object is red blue green yellow circle square "
         "Answer with the option s letter from given choices directly").split()


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
    return ref, proc, gp.QwenVLReader.from_pretrained(str(path)), str(path)


def _videos(b=2, n=4, size=20, seed=0):
    return (np.random.default_rng(seed).random((b, n, size, size, 3)) * 255).astype(np.uint8)


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
        ids = reader.inputs(frames, qs[b], opts[b])["input_ids"]
        kw = {}
        if frames:
            px = proc(images=frames, return_tensors="np")
            kw = {"pixel_values": torch.tensor(px["pixel_values"]),
                  "image_grid_thw": torch.tensor(px["image_grid_thw"])}
        types = torch.tensor(np.where(ids == IMG, 1, np.where(ids == VID, 2, 0)))
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor(ids, dtype=torch.long), mm_token_type_ids=types,
                         **kw).logits[0, -1].numpy()
        want = np.exp(logits[letters] - logits[letters].max())
        want /= want.sum()
        np.testing.assert_allclose(got[b], want, atol=1e-4)
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
