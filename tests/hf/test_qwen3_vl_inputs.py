"""lab.hf.qwen3_vl_inputs against `transformers`' Qwen2-VL image processor (PIL backend,
what Qwen3-VL's processor uses for images): the same pixel values and grids, resized or
not; the settings read from the processor's own preprocessor_config.json; the chat
prompt's layout; bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lab.hf import qwen3_vl_inputs as qi

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def hf_processor(**kw):
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or \
        transformers.Qwen2VLImageProcessor
    return cls(**kw)


SETTINGS = dict(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=64,
                max_pixels=48 * 48)


@pytest.mark.parametrize("sizes", [((16, 24), (8, 8)),          # multiples of 8: no resize
                                   ((20, 28), (37, 19), (90, 70))])   # resized (bicubic)
def test_pixel_values_and_grids_match_the_hf_processor(sizes):
    rng = np.random.default_rng(0)
    images = [(rng.random((*s, 3)) * 255).astype(np.uint8) for s in sizes]
    want = hf_processor(**SETTINGS, image_mean=[0.48, 0.46, 0.41],
                        image_std=[0.27, 0.26, 0.28])(images=images, return_tensors="np")
    proc = qi.ImageProcessing(**SETTINGS, image_mean=(0.48, 0.46, 0.41),
                              image_std=(0.27, 0.26, 0.28))
    pixels, grid = qi.image_inputs(images, proc)
    np.testing.assert_array_equal(grid, want["image_grid_thw"])
    assert pixels.shape == want["pixel_values"].shape and pixels.dtype == np.float32
    np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-5)
    assert qi.image_token_counts(grid, 2) == [int(np.prod(g)) // 4 for g in grid]


def test_smart_resize_matches_the_hf_rule():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    for h, w in [(20, 28), (37, 19), (1, 150), (500, 300), (2000, 3000), (28, 28)]:
        for lo, hi in [(64, 48 * 48), (56 * 56, 28 * 28 * 1280), (65_536, 16_777_216)]:
            assert qi.smart_resize(h, w, 28, lo, hi) == smart_resize(h, w, 28, lo, hi), (h, w)


def test_settings_are_read_from_the_processors_preprocessor_config(tmp_path):
    hf_processor(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=4096,
                 max_pixels=200_000, image_mean=[0.5, 0.5, 0.5],
                 image_std=[0.5, 0.5, 0.5]).save_pretrained(str(tmp_path))
    got = qi.ImageProcessing.from_pretrained(str(tmp_path))
    assert got == qi.ImageProcessing(patch_size=16, min_pixels=4096, max_pixels=200_000)
    assert qi.ImageProcessing.from_pretrained(str(tmp_path / "none")) == qi.ImageProcessing()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "preprocessor_config.json").write_text(json.dumps({"patch_size": 0}))
    with pytest.raises(ValueError, match="patch_size=0"):
        qi.ImageProcessing.from_pretrained(str(bad))


class _WordTokenizer:
    """Whitespace words and single punctuation marks; ``<|...|>`` specials whole."""

    def __init__(self):
        self.vocab = {}

    def encode(self, text):
        import re
        return [self.vocab.setdefault(t, len(self.vocab))
                for t in re.findall(r"<\|[a-z_]+\|>|\w+|[^\w\s]|\n", text)]


def test_choice_prompt_layout():
    from lab.nn import VLMConfig
    cfg = VLMConfig()            # image 60, vision start 62, end 63
    tok = _WordTokenizer()
    ids = qi.choice_prompt(tok, cfg, [3, 2], "Which colour?", ["red", "blue"])
    v = tok.vocab
    words = {j: k for k, j in v.items()}
    assert [words[i] for i in ids[:3]] == ["<|im_start|>", "user", "\n"]
    assert ids[3:12] == [62, 60, 60, 60, 63, 62, 60, 60, 63]
    text = [words[i] for i in ids[12:]]
    assert text[:9] == ["Which", "colour", "?", "\n", "A", ".", "red", "\n", "B"]
    assert text[-5:] == ["<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]
    assert qi.letter_ids(tok, 2) == [v["A"], v["B"]]
    with_system = qi.choice_prompt(tok, cfg, [3, 2], "Which colour?", ["red", "blue"],
                                   system="Be brief.")
    words = {j: k for k, j in v.items()}
    head = [words[i] for i in with_system[:8]]
    assert head == ["<|im_start|>", "system", "\n", "Be", "brief", ".", "<|im_end|>", "\n"]
    assert with_system[8:] == ids


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"images\[1\]"):
        qi.image_inputs([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.float32)])
    with pytest.raises(ValueError, match="aspect ratio"):
        qi.smart_resize(1, 500, 28, 64, 10_000)
    with pytest.raises(ValueError, match="images is empty"):
        qi.image_inputs([])
    with pytest.raises(ValueError, match="min_pixels"):
        qi.ImageProcessing(min_pixels=100, max_pixels=10)
    with pytest.raises(ValueError, match="n_options"):
        qi.letter_ids(_WordTokenizer(), 1)


# Qwen3-VL's video input against transformers' Qwen3VLVideoProcessor and Qwen3VLProcessor.

def hf_video_module():
    """transformers' video_processing_qwen3_vl, its own code. transformers exports a
    placeholder for the class when torchvision is missing (the torchvision wheel on the
    package index is built against CUDA torch, not the CPU wheel pinned here), so the
    module is loaded from its source file; the functions tested use torch alone."""
    import importlib.util
    import sys

    import transformers.models.qwen3_vl as pkg
    name = "transformers.models.qwen3_vl._video_processing_for_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(pkg.__path__[0], "video_processing_qwen3_vl.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_frame_sampling_matches_the_hf_video_processor():
    from types import SimpleNamespace

    from transformers.video_utils import VideoMetadata
    sample = hf_video_module().Qwen3VLVideoProcessor.sample_frames
    for total, fps in [(100, 30.0), (7, 1.0), (5000, 25.0), (3, 2.0), (40, 2.0)]:
        for rate in (2.0, 1.0, 0.5):
            me = SimpleNamespace(fps=rate, min_frames=4, max_frames=768)
            want = sample(me, VideoMetadata(total_num_frames=total, fps=fps))
            got = qi.sample_frames(total, fps, qi.VideoProcessing(fps=rate))
            np.testing.assert_array_equal(got, want)
        want = sample(me, VideoMetadata(total_num_frames=total, fps=fps), num_frames=6)
        np.testing.assert_array_equal(qi.sample_frames(total, fps, num_frames=6), want)
    # a long video at 2 fps hits max_frames
    assert len(qi.sample_frames(100_000, 30.0, qi.VideoProcessing(max_frames=64))) == 64


@pytest.mark.parametrize("cap", [False, True])
def test_video_sizes_match_the_hf_rule(cap):
    resize = hf_video_module().smart_resize
    proc = qi.VideoProcessing(cap_pixels_per_frame=cap)
    f = proc.factor
    for t in (2, 3, 4, 9, 64, 300):
        bound = proc.max_pixels
        if cap:
            bound = t * max(min(proc.max_video_tokens * f * f, proc.max_pixels // t),
                            int(proc.min_pixels * 1.05))
        for h, w in [(20, 28), (360, 640), (1080, 1920), (50, 3000), (10, 12)]:
            want = resize(t, h, w, temporal_factor=2, factor=f, min_pixels=proc.min_pixels,
                          max_pixels=bound)
            assert qi.video_smart_resize(t, h, w, proc) == want, (t, h, w)
    # one frame is sized as one temporal patch (transformers refuses a one-frame clip)
    assert qi.video_smart_resize(1, 360, 640, proc) == qi.video_smart_resize(2, 360, 640, proc)


@pytest.mark.parametrize("frames", [4, 5, 1])
def test_video_patches_match_the_hf_video_processor(frames):
    """At a size that needs no resizing: the processor's normalisation (fused, as its torch
    backend computes it) and its own patchify; an odd count repeats the last frame."""
    proc = qi.VideoProcessing(patch_size=4, min_pixels=64, max_pixels=10 ** 6,
                              image_mean=(0.48, 0.46, 0.41), image_std=(0.27, 0.26, 0.28))
    video = (np.random.default_rng(frames).random((frames, 16, 24, 3)) * 255).astype(np.uint8)
    assert qi.video_smart_resize(frames, 16, 24, proc) == (16, 24)
    x = torch.tensor(video).permute(0, 3, 1, 2)[None].float()
    mean = torch.tensor(proc.image_mean)[None, None, :, None, None] * 255
    std = torch.tensor(proc.image_std)[None, None, :, None, None] * 255
    want, gt, gh, gw = hf_video_module().Qwen3VLVideoProcessor.patchify(
        None, (x - mean) / std, patch_size=4, merge_size=2, temporal_patch_size=2)
    got, grid = qi.video_inputs(video, proc)
    assert grid.tolist() == [[gt, gh, gw]] == [[(frames + 1) // 2, 4, 6]]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want[0].numpy(), atol=1e-5)
    assert qi.video_frame_tokens(grid[0], 2) == 6
    # a clip that needs resizing: 3 frames of 20x30 become 2 temporal patches at 16x32
    # (sides rounded to multiples of 8, 2.5 half to even)
    clip = (np.random.default_rng(9).random((3, 20, 30, 3)) * 255).astype(np.uint8)
    assert qi.video_smart_resize(3, 20, 30, proc) == (16, 32)
    px, grid = qi.video_inputs(clip, proc)
    assert grid.tolist() == [[2, 4, 8]] and px.shape == (2 * 4 * 8, 3 * 2 * 4 * 4)


def test_timestamps_and_video_prompt_match_the_hf_processor():
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    from lab.nn import VLMConfig
    cfg = VLMConfig()
    for indices, fps in [([0, 15, 30, 45], 30.0), ([3, 9, 12], 2.0), ([7], 1.0),
                         (list(range(0, 400, 25)), 24.0)]:
        stamps = qi.frame_timestamps(indices, fps, 2)
        np.testing.assert_allclose(
            stamps, Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2))
        grid = np.array([[len(stamps), 4, 6]])
        hf = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                             vision_start_token="<|vision_start|>", video_token="<|video_pad|>",
                             vision_end_token="<|vision_end|>")
        hf._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(None, *a)
        text = Qwen3VLProcessor.replace_video_token(hf, {
            "video_grid_thw": grid,
            "video_metadata": [VideoMetadata(total_num_frames=500, fps=fps,
                                             frames_indices=list(indices))]}, 0)
        tok = _WordTokenizer()
        tok.vocab.update({"<|vision_start|>": cfg.vision_start_token_id,
                          "<|video_pad|>": cfg.video_token_id,
                          "<|vision_end|>": cfg.vision_end_token_id})
        assert qi.video_prompt(tok, cfg, stamps, qi.video_frame_tokens(grid[0], 2)) == \
            tok.encode(text)


def test_choice_prompt_with_a_video():
    from lab.nn import VLMConfig
    cfg = VLMConfig()
    tok = _WordTokenizer()
    ids = qi.choice_prompt(tok, cfg, [], "Which colour?", ["red", "blue"],
                           video=([0.5, 1.5], 2))
    words = {j: k for k, j in tok.vocab.items()}
    s, v, e = cfg.vision_start_token_id, cfg.video_token_id, cfg.vision_end_token_id
    stamp = [words[i] for i in ids[3:9]]
    assert stamp == ["<", "0", ".", "5", "seconds", ">"]
    assert ids[9:13] == [s, v, v, e] and ids[19:23] == [s, v, v, e]
    assert [words[i] for i in ids[23:26]] == ["Which", "colour", "?"]
    assert ids[23:] == qi.choice_prompt(tok, cfg, [], "Which colour?", ["red", "blue"])[3:]


def test_video_settings_are_read_from_the_video_preprocessor_config(tmp_path):
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({
        "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
        "temporal_patch_size": 2, "merge_size": 2, "fps": 2, "min_frames": 4,
        "max_frames": 768, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "video_processor_type": "Qwen3VLVideoProcessor"}))
    got = qi.VideoProcessing.from_pretrained(str(tmp_path))
    assert got == qi.VideoProcessing(min_pixels=4096, max_pixels=25165824)
    assert qi.VideoProcessing.from_pretrained(str(tmp_path / "none")) == qi.VideoProcessing()
    # the image processor's file is a different one
    assert qi.ImageProcessing.from_pretrained(str(tmp_path)) == qi.ImageProcessing()


def test_bad_video_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="VideoProcessing.min_frames=0"):
        qi.VideoProcessing(min_frames=0)
    with pytest.raises(ValueError, match="VideoProcessing.fps=0"):
        qi.VideoProcessing(fps=0)
    with pytest.raises(ValueError, match="VideoProcessing.min_pixels"):
        qi.VideoProcessing(min_pixels=100, max_pixels=10)
    with pytest.raises(ValueError, match=r"frames\[1\]"):
        qi.video_inputs([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 16, 3), np.uint8)])
    with pytest.raises(ValueError, match="frames is empty"):
        qi.video_inputs([])
    with pytest.raises(ValueError, match="video_fps"):
        qi.sample_frames(10, 0.0)
    with pytest.raises(ValueError, match="total_frames"):
        qi.sample_frames(0, 30.0)
    with pytest.raises(ValueError, match="indices is empty"):
        qi.frame_timestamps([], 2.0)
