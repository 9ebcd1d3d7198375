"""lab.nn.VLM: Qwen3-VL's structure on Lab's Transformer (shapes, per-frame vision attention,
M-RoPE, image-prefix generation, the one-forward option posterior, bad input, learning)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lab import infer
from lab.nn import (
    VLM,
    Transformer,
    TransformerConfig,
    VisionConfig,
    VisionEncoder,
    VLMConfig,
    choice_posterior,
    patchify,
    rope_index,
)
from lab.nn.vision import patch_positions

IMG, VID, VS, VE = 60, 61, 62, 63
CFG = VLMConfig(vision=VisionConfig(deepstack_layers=(0,)))


@pytest.fixture(scope="module")
def model():
    return VLM(CFG, rngs=nnx.Rngs(0))


def pixels(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, CFG.vision.patch_dim)).astype(
        np.float32)


def prompt(*runs, text=(5, 6)):
    """``text, [VS, placeholder * n, VE, 7]`` per run, then ``8, 9``."""
    ids = list(text)
    for token, n in runs:
        ids += [VS] + [token] * n + [VE, 7]
    return np.array([ids + [8, 9]])


def test_shapes(model):
    grid = np.array([[1, 4, 4], [1, 2, 4]])      # 16 + 8 patches -> 4 + 2 tokens
    tokens, deep = model.visual(pixels(24), grid)
    assert tokens.shape == (6, 64) and deep.shape == (1, 6, 64)
    ids = prompt((IMG, 4), (IMG, 2))
    assert model(ids, pixel_values=pixels(24), image_grid_thw=grid).shape == (1, 16, 64)
    e = model.embed(ids, pixel_values=pixels(24), image_grid_thw=grid)
    assert e.inputs_embeds.shape == (1, 16, 64) and e.deepstack.shape == (1, 1, 16, 64)
    # DeepStack features sit at the visual tokens only.
    assert np.all(np.asarray(e.deepstack)[0, 0, ids[0] != IMG] == 0)


def test_last_only_is_the_last_column_of_the_logits(model):
    grid = np.array([[1, 4, 4]])
    ids = prompt((IMG, 4))
    full = model(ids, pixel_values=pixels(16), image_grid_thw=grid)
    last = model(ids, pixel_values=pixels(16), image_grid_thw=grid, last_only=True)
    assert last.shape == (1, 1, full.shape[-1])
    np.testing.assert_allclose(np.asarray(last[:, 0]), np.asarray(full[:, -1]), atol=1e-5)


def test_tower_without_position_table_or_rope():
    """The learned table and the 2-D rope are each optional; without either, permuting the
    merge blocks of an image permutes its tokens (nothing else knows where a patch is)."""
    cfg = VisionConfig(d_model=32, n_heads=2, d_ff=64, out_dim=32, rope=False,
                       num_position_embeddings=0, init_std=0.3)  # sharp attention
    tower = VisionEncoder(cfg, rngs=nnx.Rngs(0))
    px = pixels(16)
    out, deep = tower(px, np.array([[1, 4, 4]]))
    assert out.shape == (4, 32) and deep is None
    perm = np.array([2, 0, 3, 1])                  # reorder the 4 blocks of 4 patches
    swapped, _ = tower(px.reshape(4, 4, -1)[perm].reshape(16, -1), np.array([[1, 4, 4]]))
    err = np.abs(np.asarray(swapped) - np.asarray(out)[perm]).max()
    assert err < 1e-4 * np.abs(np.asarray(out)).max()
    rope = VisionEncoder(cfg.replace(rope=True), rngs=nnx.Rngs(0))
    a, _ = rope(px, np.array([[1, 4, 4]]))
    b, _ = rope(px.reshape(4, 4, -1)[perm].reshape(16, -1), np.array([[1, 4, 4]]))
    assert np.abs(np.asarray(b) - np.asarray(a)[perm]).max() > 0.01 * np.abs(np.asarray(a)).max()


def test_frames_attend_within_themselves(model):
    """Two images of different sizes encoded together equal each encoded alone."""
    a, b = pixels(16, 1), pixels(8, 2)
    both, _ = model.visual(np.concatenate([a, b]), np.array([[1, 4, 4], [1, 2, 4]]))
    one, _ = model.visual(a, np.array([[1, 4, 4]]))
    two, _ = model.visual(b, np.array([[1, 2, 4]]))
    np.testing.assert_allclose(both, np.concatenate([one, two]), atol=1e-5)


def test_rope_index_follows_qwen3_vl():
    ids = prompt((IMG, 4))                        # 2x2 merged tokens after 3 text tokens
    pos, nxt = rope_index(ids, CFG, np.array([[1, 4, 4]]))
    np.testing.assert_array_equal(pos[:, 0, 3:7], [[3, 3, 3, 3], [3, 3, 4, 4], [3, 4, 3, 4]])
    np.testing.assert_array_equal(pos[:, 0, 7:], np.broadcast_to(np.arange(5, 9), (3, 4)))
    assert nxt.tolist() == [9]


def test_mrope_with_equal_rows_is_plain_rope():
    cfg = CFG.text
    lm = Transformer(cfg, rngs=nnx.Rngs(1))
    x = jax.random.randint(jax.random.key(0), (2, 9), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(9), (3, 2, 9))
    np.testing.assert_allclose(lm(x, rope_positions=pos), lm(x), atol=1e-6)


def test_generate_continues_positions_after_image(model):
    """Decoding after the image equals one teacher-forced forward whose generated tokens sit
    at ``next_position + i`` (Qwen3-VL's positions after the prompt)."""
    grid = np.array([[1, 4, 4]])
    ids, px = prompt((IMG, 4)), pixels(16)
    e = model.embed(ids, pixel_values=px, image_grid_thw=grid)
    out = infer.generate(model, ids, max_new_tokens=6, embedded=e)
    gen = np.asarray(out.tokens)
    lm, t = model.language_model, ids.shape[1]
    pos = jnp.concatenate([e.positions, e.next_position[:, None] + jnp.arange(6)], axis=1)
    rope = jnp.concatenate([e.rope_positions, jnp.broadcast_to(pos[:, t:], (3, 1, 6))], axis=2)
    logits = lm(inputs_embeds=jnp.concatenate([e.inputs_embeds, lm.embed(gen)], axis=1),
                positions=pos, rope_positions=rope,
                deepstack=jnp.pad(e.deepstack, ((0, 0), (0, 0), (0, 6), (0, 0))))
    np.testing.assert_array_equal(np.argmax(logits[0, t - 1:-1], -1), gen[0])
    # prefill on the embedded prompt gives the forward's logits and the next position
    first, cache = infer.prefill(model, ids, embedded=e)
    np.testing.assert_allclose(first, logits[:, :t], atol=1e-5)
    assert cache.next_position.tolist() == [int(rope_index(ids, CFG, grid)[1][0])]
    with pytest.raises(ValueError,
                       match=r"embedded.inputs_embeds has shape \(1, 11, 64\).*needs \(1, 10"):
        infer.generate(model, ids[:, :-1], max_new_tokens=2, embedded=e)


def test_padded_batch_generates_as_each_row_alone(model):
    grid = np.array([[1, 4, 4], [1, 2, 4]])
    px = pixels(24)
    long, short = prompt((IMG, 4)), prompt((IMG, 2), text=(5,))
    ids = np.zeros((2, long.shape[1]), np.int64)
    ids[0], ids[1, :short.shape[1]] = long[0], short[0]
    lens = np.array([long.shape[1], short.shape[1]])
    e = model.embed(ids, pixel_values=px, image_grid_thw=grid, lengths=lens)
    both = infer.generate(model, ids, lengths=lens, max_new_tokens=5, embedded=e)
    for row, (one, p, g) in enumerate([(long, px[:16], grid[:1]), (short, px[16:], grid[1:])]):
        alone = infer.generate(model, one, max_new_tokens=5,
                               embedded=model.embed(one, pixel_values=p, image_grid_thw=g))
        np.testing.assert_array_equal(both.tokens[row], alone.tokens[0])


def test_choice_posterior_is_one_forward_of_each_option(model):
    grid, px = np.array([[1, 4, 4]]), pixels(16)
    ids = prompt((IMG, 4))
    options = [[3], [4, 5, 6], [7, 8]]
    post = np.asarray(model.choice_posterior(ids, options, pixel_values=px, image_grid_thw=grid))
    scores = []
    for opt in options:                           # each option alone after the prompt
        seq = np.concatenate([ids, [opt]], axis=1)
        logp = jax.nn.log_softmax(model(seq, pixel_values=px, image_grid_thw=grid)[0])
        t = ids.shape[1]
        scores.append(sum(float(logp[t - 1 + i, o]) for i, o in enumerate(opt)))
    np.testing.assert_allclose(post[0], np.asarray(jax.nn.softmax(jnp.array(scores))),
                               atol=1e-5)
    lm_post = choice_posterior(model.language_model, [5, 6, 7], [[1], [2]])
    assert lm_post.shape == (1, 2) and abs(float(lm_post.sum()) - 1) < 1e-6


@pytest.mark.parametrize("case, match", [
    ("pixels_shape", r"pixel_values has shape \(16, 95\).*needs \(16, 96\)"),
    ("pixels_dtype", r"pixel_values has dtype int32; expected floating"),
    ("grid_merge", r"image_grid_thw=\[\[1, 3, 4\]\].*multiples of .*spatial_merge_size=2"),
    ("placeholders", r"a run of 3 image tokens.*gives 4 merged tokens"),
    ("frames", r"video frames\) > TransformerConfig.max_len=1024.*position budget"),
])
def test_bad_inputs_named(model, case, match):
    ids, grid, px = prompt((IMG, 4)), np.array([[1, 4, 4]]), pixels(16)
    kw = dict(pixel_values=px, image_grid_thw=grid)
    if case == "pixels_shape":
        kw["pixel_values"] = px[:, :95]
    elif case == "pixels_dtype":
        kw["pixel_values"] = px.astype(np.int32)
    elif case == "grid_merge":
        kw["image_grid_thw"] = np.array([[1, 3, 4]])
    elif case == "placeholders":
        ids = prompt((IMG, 3))
    elif case == "frames":                        # 300 frames of 4 tokens: 1,800+ tokens
        ids = prompt(*[(VID, 4)] * 300)
        kw = dict(pixel_values_videos=pixels(300 * 16), video_grid_thw=np.array([[300, 4, 4]]))
    with pytest.raises(ValueError, match=match):
        model(ids, **kw)


def test_option_lists_checked(model):
    with pytest.raises(ValueError, match="options has 1 option.*at least 2"):
        model.choice_posterior(prompt(), [[3]])
    with pytest.raises(ValueError, match=r"options\[1\]=\[\]; expected a non-empty"):
        model.choice_posterior(prompt(), [[3], []])


def test_configs_validated():
    with pytest.raises(ValueError, match="mrope_section=.*summing to head_dim / 2 = 8"):
        TransformerConfig(head_dim=16, mrope_section=(2, 2, 2))
    with pytest.raises(ValueError, match="vision.out_dim=32 differs from text.d_model=64"):
        VLMConfig(vision=VisionConfig(out_dim=32))
    with pytest.raises(ValueError, match="text.mrope_section=None"):
        VLMConfig(text=CFG.text.replace(mrope_section=None))
    with pytest.raises(ValueError, match=r"deepstack_layers=\(2,\).*\[0, 2\)"):
        VisionConfig(deepstack_layers=(2,))
    with pytest.raises(ValueError, match="num_position_embeddings=10.*perfect square"):
        VisionConfig(num_position_embeddings=10)
    # The new decoder fields stay out of to_dict at their defaults (zoo digests unchanged).
    assert "mrope_section" not in TransformerConfig().to_dict()
    assert TransformerConfig(**CFG.text.to_dict()) == CFG.text


def test_patchify_lays_out_patches_where_patch_positions_says():
    """Each row of ``patchify`` holds one patch's pixels (channel, frame, pixel row, pixel
    column) at the row and column ``patch_positions`` gives it; an odd clip repeats its last
    frame; the values are ``(x / 255 - mean) / std`` per channel."""
    p, m, tp = 2, 2, 2
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 8, 12, 3)).astype(np.uint8)      # 3 frames -> 2 patches
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    x = patchify(frames, patch_size=p, merge_size=m, temporal_patch_size=tp, mean=mean, std=std)
    grid = np.array([[2, 4, 6]])
    assert x.shape == (2 * 4 * 6, 3 * tp * p * p) and x.dtype == np.float32
    norm = (frames / 255.0 - np.array(mean)) / np.array(std)
    norm = np.concatenate([norm, norm[-1:]])                          # the last frame repeated
    rows, cols = patch_positions(grid, m)
    for k in range(len(x)):
        t = k // 24
        want = norm[t * tp:(t + 1) * tp, rows[k] * p:(rows[k] + 1) * p,
                    cols[k] * p:(cols[k] + 1) * p]                    # [tp, p, p, c]
        np.testing.assert_allclose(x[k], want.transpose(3, 0, 1, 2).reshape(-1), atol=1e-6)
    with pytest.raises(ValueError, match="6x12 pixels; expected multiples of .* = 4"):
        patchify(frames[:, :6], patch_size=p, merge_size=m)
    with pytest.raises(ValueError, match=r"shape \(8, 12, 3\); expected \[T, H, W, C\]"):
        patchify(frames[0], patch_size=p, merge_size=m)


@pytest.mark.deep
def test_learns_the_colour_of_an_image():
    """A tiny VLM learns to answer an image's colour (one of 4) as a token."""
    vision = VisionConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, out_dim=32,
                          num_position_embeddings=4)
    text = TransformerConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                             head_dim=16, d_ff=64, max_len=16, tie_embeddings=False,
                             mrope_section=(2, 3, 3))
    cfg = VLMConfig(text=text, vision=vision, image_token_id=10, video_token_id=11,
                    vision_start_token_id=12, vision_end_token_id=13)
    colours = np.array([[1, -1, -1], [-1, 1, -1], [-1, -1, 1], [1, 1, -1]], np.float32)
    rng = np.random.default_rng(0)
    b, grid = 16, np.tile([[1, 2, 2]], (16, 1))           # 8x8 images: 4 patches, 1 token
    ids = np.tile([[12, 10, 13, 14]], (b, 1))
    rope = rope_index(ids, cfg, grid)

    def batch():
        label = rng.integers(0, 4, b)
        px = colours[label][:, None, :, None] + 0.3 * rng.standard_normal((b, 4, 3, 32))
        return px.reshape(4 * b, 96).astype(np.float32), label

    model = VLM(cfg, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(5e-3), wrt=nnx.Param)

    def loss_fn(m, px, label):
        logits = m(ids, pixel_values=px, image_grid_thw=grid, rope_positions=rope)[:, -1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, label).mean()

    @nnx.jit
    def step(m, o, px, label):
        loss, grads = nnx.value_and_grad(loss_fn)(m, px, label)
        o.update(m, grads)
        return loss

    losses = [float(step(model, opt, *batch())) for _ in range(60)]
    right = 0
    for _ in range(4):                            # 64 held-out images
        px, label = batch()
        logits = model(ids, pixel_values=px, image_grid_thw=grid)[:, -1]
        right += int(np.sum(np.argmax(logits, -1) == label))
    # measured: loss 2.75 -> 0.02 (mean of the last 5 steps), 64 / 64 right
    assert losses[0] > 1.2 and np.mean(losses[-5:]) < 0.1, losses
    assert right >= 61, right


def test_docs_example_runs():
    """docs/vlm.md's API example runs as written."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "vlm.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/vlm.md", "exec"), scope)
    assert scope["logits"].shape == (1, 10, 64)
    assert scope["out"].tokens.shape == (1, 8)
    assert scope["posterior"].shape == (1, 3)
    assert abs(float(scope["posterior"].sum()) - 1) < 1e-5
