"""Parity of lab.hf's Qwen3-VL interop with `transformers`' Qwen3VLForConditionalGeneration.

A tiny random Qwen3-VL (GQA decoder with M-RoPE and q/k norm, a 2-block ViT with
learned positions, 2-D rope and a DeepStack tap) is built by `transformers`, every
weight randomised (norms and biases too), saved and loaded by
`lab.hf.load_pretrained`. The inputs come from Hugging Face's Qwen2-VL image
processor (what Qwen3-VL's processor uses for images); video patches are random.
Float32 logits within 1e-4, greedy tokens identical.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lab import hf, infer  # noqa: E402
from lab.nn import VLM  # noqa: E402

ATOL = 1e-4
IMG, VID, VS, VE = 100, 101, 102, 103
TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [2, 3, 3], "mrope_interleaved": True})
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=32,
              num_position_embeddings=16, deepstack_visual_indexes=[0])


def hf_model(**overrides):
    cfg = transformers.Qwen3VLConfig(text_config={**TEXT, **overrides.pop("text", {})},
                                     vision_config=VISION, image_token_id=IMG,
                                     video_token_id=VID, vision_start_token_id=VS,
                                     vision_end_token_id=VE, **overrides)
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if ("norm" in name and "weight" in name) else 0.2
            base = 1.0 if ("norm" in name and "weight" in name) else 0.0
            p.copy_(base + scale * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("q3vl") / "ckpt")
    model = hf_model()
    model.save_pretrained(path)
    return model, path, hf.load_pretrained(path)


def image_inputs():
    """The image processor's patches for two images, and a prompt with both."""
    try:
        proc_cls = transformers.Qwen2VLImageProcessorPil
    except AttributeError:
        proc_cls = transformers.Qwen2VLImageProcessor
    proc = proc_cls(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=64,
                    max_pixels=32 * 32)
    rng = np.random.default_rng(0)
    images = [(rng.random((20, 28, 3)) * 255).astype(np.uint8),
              (rng.random((16, 16, 3)) * 255).astype(np.uint8)]
    out = proc(images=images, return_tensors="np")
    grid = out["image_grid_thw"]
    n = [int(np.prod(g)) // 4 for g in grid]
    ids = [5, 6, VS] + [IMG] * n[0] + [VE, 7, 8, VS] + [IMG] * n[1] + [VE, 9, 10, 11]
    return np.array([ids]), out["pixel_values"].astype(np.float32), grid


def run_hf(model, ids, **kw):
    types = np.where(ids == IMG, 1, np.where(ids == VID, 2, 0))
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), mm_token_type_ids=torch.tensor(types),
                     **{k: torch.tensor(v) for k, v in kw.items()}).logits.numpy()


def test_image_text_logits_match_transformers(saved):
    ref, _, model = saved
    ids, pixels, grid = image_inputs()
    want = run_hf(ref, ids, pixel_values=pixels, image_grid_thw=grid)
    got = np.asarray(model(ids, pixel_values=pixels, image_grid_thw=grid))
    assert got.shape == want.shape == (1, ids.shape[1], 128)
    err = np.abs(got - want).max()
    assert err < ATOL, err
    # jax arrays are accepted too, with the same numbers
    got_j = model(jnp.asarray(ids), pixel_values=jnp.asarray(pixels),
                  image_grid_thw=jnp.asarray(grid))
    np.testing.assert_allclose(np.asarray(got_j), got, atol=1e-6)
    # a batch of two prompts, four images in row order
    batch = np.concatenate([ids, np.where(ids < 64, ids + 20, ids)])
    px2, grid2 = np.concatenate([pixels, pixels[::-1]]), np.concatenate([grid, grid])
    want2 = run_hf(ref, batch, pixel_values=px2, image_grid_thw=grid2)
    got2 = np.asarray(model(batch, pixel_values=px2, image_grid_thw=grid2))
    assert np.abs(got2 - want2).max() < ATOL


def test_video_logits_match_transformers(saved):
    ref, _, model = saved
    grid = np.array([[2, 4, 4]])                      # 2 temporal patches of 4x4 patches
    pixels = np.random.default_rng(1).standard_normal((32, 96)).astype(np.float32)
    frame = [VS] + [VID] * 4 + [VE]
    ids = np.array([[5, 6] + frame + [7] + frame + [8, 9]])   # a timestamp token between frames
    want = run_hf(ref, ids, pixel_values_videos=pixels, video_grid_thw=grid)
    got = np.asarray(model(ids, pixel_values_videos=pixels, video_grid_thw=grid))
    assert np.abs(got - want).max() < ATOL


def test_greedy_tokens_match_transformers(saved):
    ref, _, model = saved
    ids, pixels, grid = image_inputs()
    types = torch.tensor(np.where(ids == IMG, 1, 0))
    with torch.no_grad():
        out = ref.generate(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels),
                           image_grid_thw=torch.tensor(grid), mm_token_type_ids=types,
                           attention_mask=torch.ones(ids.shape, dtype=torch.long),
                           max_new_tokens=16, do_sample=False, pad_token_id=0)
    want = out[0, ids.shape[1]:].numpy()
    emb = model.embed(ids, pixel_values=pixels, image_grid_thw=grid)
    got = infer.generate(model, ids, max_new_tokens=16, embedded=emb)
    np.testing.assert_array_equal(np.asarray(got.tokens[0]), want)


def test_save_pretrained_round_trip_loads_in_transformers(saved, tmp_path):
    ref, _, model = saved
    path = hf.save_pretrained(model, str(tmp_path / "out"))
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["model_type"] == "qwen3_vl"
    back = transformers.Qwen3VLForConditionalGeneration.from_pretrained(path).eval()
    ids, pixels, grid = image_inputs()
    want = run_hf(ref, ids, pixel_values=pixels, image_grid_thw=grid)
    got = run_hf(back, ids, pixel_values=pixels, image_grid_thw=grid)
    assert np.abs(got - want).max() < 1e-5
    again = hf.load_pretrained(path)
    assert isinstance(again, VLM)
    np.testing.assert_allclose(np.asarray(again(ids, pixel_values=pixels, image_grid_thw=grid)),
                               want, atol=ATOL)


def test_tied_embeddings_and_attention_bias(tmp_path):
    ref = hf_model(tie_word_embeddings=True, text={"attention_bias": True})
    ref.save_pretrained(str(tmp_path))
    model = hf.load_pretrained(str(tmp_path))
    assert model.config.text.tie_embeddings and model.config.text.o_bias
    ids, pixels, grid = image_inputs()
    want = run_hf(ref, ids, pixel_values=pixels, image_grid_thw=grid)
    got = np.asarray(model(ids, pixel_values=pixels, image_grid_thw=grid))
    assert np.abs(got - want).max() < ATOL


def test_decoder_alone_not_saved_as_a_text_family(saved, tmp_path):
    _, _, model = saved
    with pytest.raises(ValueError, match="M-RoPE decoder.*saves as qwen3_vl"):
        hf.save_pretrained(model.language_model, str(tmp_path))


def test_moe_config_refused(tmp_path):
    cfg = {"model_type": "qwen3_vl_moe", "text_config": {**TEXT, "num_experts": 4},
           "vision_config": VISION}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        hf.load_pretrained(str(tmp_path))


def test_checkpoint_mismatch_named(saved, tmp_path):
    _, path, _ = saved
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["vision_config"]["intermediate_size"] = 40
    os.symlink(os.path.join(path, "model.safetensors"), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"linear_fc1.weight.*\(40, 32\)"):
        hf.load_pretrained(str(tmp_path))
