"""lab.hf.qwen3_vl_inputs against `transformers`' Qwen2-VL image processor (PIL backend,
what Qwen3-VL's processor uses for images): the same pixel values and grids, resized or
not; the settings read from the processor's own preprocessor_config.json; the chat
prompt's layout; bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.hf import qwen3_vl_inputs as qi

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")


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
