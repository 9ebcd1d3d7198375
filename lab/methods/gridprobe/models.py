"""Small :class:`lab.nn.VLM` selectors / QA models for :mod:`lab.data.synthetic.video`'s
multiple-choice questions, the prompts they read, their training, and their FLOPs.

A prompt is, per shown frame, ``<vision_start> <video> x t <vision_end>`` (Qwen3-VL's
frame layout without timestamps), then the question's words; the options are single
tokens (a colour or digit name) scored by :func:`lab.nn.choice_posterior`. A set of
``m`` frames is run as ``bucket(m)`` frame slots (the next power of two, at most the
grid's ``N``), the selected frames first in time order and blank (black) frames after,
so one program serves every ``m`` of a bucket; the model is trained on the same layout
with random subsets, so a blank slot reads as "nothing shown". FLOPs are counted for the
``m`` frames a method keeps (:func:`forward_flops`), not the blank slots.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.data.synthetic.render import COLOUR_NAMES, KINDS
from lab.nn import VLM, TransformerConfig, VisionConfig, VLMConfig
from lab.nn.flops import vlm_config_flops
from lab.nn.vision import patchify as nn_patchify
from lab.nn.vlm import decode

PAD, VS, VE, VID, UNK = 0, 1, 2, 3, 4
_WORDS = ("what", "colour", "was", "the", "which", "digit", "shown", "in")
VOCAB = {w: i + 5 for i, w in enumerate(dict.fromkeys(
    (*_WORDS, *COLOUR_NAMES, *KINDS)))}
VOCAB_SIZE = 5 + len(VOCAB)
QUESTION_LEN = 8   # questions are left-padded to this many tokens (one program per shape)


def words(text: str) -> list[int]:
    """Token ids of a question or option (lower-cased words; unknown words -> UNK)."""
    return [VOCAB.get(w, UNK) for w in re.findall(r"[a-z0-9]+", text.lower())]


def vlm_config(d_model: int, n_layers: int, *, patch_size: int = 8, max_len: int = 256,
               vision_init: float = 0.02
               ) -> VLMConfig:
    """A small VLM: ViT and decoder of width ``d_model``, ``n_layers`` each, one frame per
    temporal patch, ``2 x 2`` merge (a 32x32 frame with 8-pixel patches is 4 tokens)."""
    heads = max(2, d_model // 16)
    return VLMConfig(
        text=TransformerConfig(vocab_size=VOCAB_SIZE, d_model=d_model, n_layers=n_layers,
                               n_heads=heads, n_kv_heads=heads, head_dim=d_model // heads,
                               d_ff=2 * d_model, max_len=max_len, tie_embeddings=False,
                               mrope_section=_sections(d_model // heads)),
        vision=VisionConfig(d_model=d_model, n_layers=n_layers, n_heads=heads, d_ff=2 * d_model,
                            patch_size=patch_size, temporal_patch_size=1, spatial_merge_size=2,
                            out_dim=d_model, num_position_embeddings=16, init_std=vision_init),
        image_token_id=UNK, video_token_id=VID, vision_start_token_id=VS,
        vision_end_token_id=VE)


def _sections(head_dim: int) -> tuple[int, int, int]:
    half = head_dim // 2
    t = half - 2 * (half // 3)
    return (t, half // 3, half // 3)


def patchify(frames: np.ndarray, config: VLMConfig) -> np.ndarray:
    """``uint8 [F, H, W, 3]`` -> the tower's float32 patches (:func:`lab.nn.patchify`),
    pixels scaled to ``[-1, 1]`` (Qwen3-VL's mean 0.5, std 0.5)."""
    v = config.vision
    return nn_patchify(frames, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                       temporal_patch_size=v.temporal_patch_size)


def tokens_per_frame(config: VLMConfig, size: int) -> int:
    return (size // (config.vision.patch_size * config.vision.spatial_merge_size)) ** 2


def prompt_ids(question_ids: list[int], n_frames: int, per_frame: int) -> list[int]:
    return [VS, *([VID] * per_frame), VE] * n_frames + list(question_ids)


def batch_inputs(config: VLMConfig, frames: np.ndarray, questions: list[list[int]]):
    """``frames uint8 [B, F, H, W, 3]`` and per-row question ids (right-aligned to one
    length by left PAD tokens before the frames) -> ``(ids [B, T], pixels, grid)``."""
    b, f, h = frames.shape[:3]
    per = tokens_per_frame(config, h)
    longest = max(QUESTION_LEN, *(len(q) for q in questions))
    ids = np.array([[PAD] * (longest - len(q)) + prompt_ids(q, f, per) for q in questions])
    g = h // config.vision.patch_size
    grid = np.array([[f, g, g]] * b)
    return ids, patchify(frames.reshape(b * f, *frames.shape[2:]), config), grid


def bucket(m: int, n: int) -> int:
    return int(min(n, 1 << int(np.ceil(np.log2(max(int(m), 1))))))


def gather_frames(videos: np.ndarray, masks: np.ndarray, slots: int, fill=0) -> np.ndarray:
    """``videos [B, N, H, W, 3]``, ``masks [B, N]`` -> ``[B, slots, ...]``: each row's
    selected frames in time order, then blank frames of ``fill`` (a value or an RGB colour:
    black for these models, the zoo's empty canvas for :class:`.zoo_reader.ZooReader`)."""
    out = np.empty((videos.shape[0], slots, *videos.shape[2:]), videos.dtype)
    out[:] = fill
    for i in range(videos.shape[0]):
        idx = np.flatnonzero(masks[i])[:slots]
        out[i, :len(idx)] = videos[i, idx]
    return out


def posteriors(model: VLM, videos: np.ndarray, masks: np.ndarray, questions, options,
               *, chunk: int = 64) -> np.ndarray:
    """Posterior ``[B, n_options]`` of each question from its ``masks[b]`` frames of
    ``videos [B, N, H, W, 3]`` (grouped by :func:`bucket` of the frame count; a row with
    no frame gets every slot blank). ``options [B, n_options]`` token ids."""
    masks = np.asarray(masks, bool)
    n = masks.shape[1]
    out = np.zeros(np.shape(options), np.float32)
    counts = masks.sum(1)
    for s in sorted({bucket(c, n) for c in counts}):
        rows = np.flatnonzero([bucket(c, n) == s for c in counts])
        for lo in range(0, len(rows), chunk):
            r = rows[lo:lo + chunk]
            pad = np.concatenate([r, np.full(chunk - len(r), r[0])])   # one shape per bucket
            got = _posterior_rows(model, gather_frames(videos[pad], masks[pad], s),
                                  [questions[i] for i in pad], np.asarray(options)[pad])
            out[r] = got[:len(r)]
    return out


def _posterior_rows(model, frames, questions, options):
    ids, pixels, grid = batch_inputs(model.config, frames, questions)
    e = model.embed(ids, pixel_values_videos=pixels, video_grid_thw=grid)
    logits = decode(model.language_model, e)[:, -1]                          # [B, V]
    sel = jnp.take_along_axis(logits, jnp.asarray(options), axis=1)
    return np.asarray(jax.nn.softmax(sel, axis=-1))


def frame_embeddings(model: VLM, videos: np.ndarray, *, chunk: int = 64,
                     to_patches=patchify) -> np.ndarray:
    """Mean merged visual token of each frame, ``[B, N, D]`` (the decoder-input space);
    ``to_patches(frames, config)`` is the model's pixel layout and normalisation (this
    module's :func:`patchify`, or :func:`lab.zoo.vlm.patchify` for a zoo model)."""
    b, n = videos.shape[:2]
    per = tokens_per_frame(model.config, videos.shape[2])
    g = videos.shape[2] // model.config.vision.patch_size
    graphdef, state = nnx.split(model.visual)
    flat = videos.reshape(b * n, *videos.shape[2:])
    out = []
    for lo in range(0, b * n, chunk):
        part = flat[lo:lo + chunk]
        pad = np.concatenate([part, np.zeros((chunk - len(part), *part.shape[1:]), part.dtype)])
        feats = _visual_jit(graphdef, state, jnp.asarray(to_patches(pad, model.config)),
                            grid=((chunk, g, g),))
        out.append(np.asarray(feats).reshape(chunk, per, -1).mean(1)[:len(part)])
    return np.concatenate(out).reshape(b, n, -1)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("grid",))
def _visual_jit(graphdef, state, pixels, *, grid):
    return nnx.merge(graphdef, state)(pixels, np.array(grid, np.int64))[0]


def question_embeddings(model: VLM, questions) -> np.ndarray:
    """Mean input embedding of each question's tokens, ``[B, D]``."""
    emb = np.asarray(model.language_model.embed(jnp.arange(VOCAB_SIZE)))
    return np.stack([emb[np.asarray(q)].mean(0) for q in questions])


def forward_flops(config: VLMConfig, frames: int, size: int, question_tokens: int,
                  n_options: int) -> int:
    """FLOPs of one question answered from ``frames`` frames: the ViT over the frames, the
    decoder over their tokens, ``2 * frames`` vision markers, the question and the
    options appended by :func:`lab.nn.choice_posterior` (:func:`lab.nn.flops.vlm_config_flops`)."""
    return int(vlm_config_flops(config, 1, frames, size, size,
                                2 * frames + question_tokens + n_options)["total"])


def train(config: VLMConfig, sample, *, steps: int, batch: int, learning_rate: float,
          seed: int, slot_choices) -> tuple[VLM, dict]:
    """Adam (warmup + cosine, clip 1) on the options' cross-entropy at the last token.

    ``sample(rng, batch, slots) -> (frames uint8 [B, slots, H, W, 3], questions, options
    [B, n_options], answer [B])``; the slot count is drawn from ``slot_choices`` per step
    (one compiled step per choice)."""
    model = VLM(config, rngs=nnx.Rngs(seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    sched = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(50, steps // 10 + 1),
                                               steps)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0))
    opt_state = opt.init(params)
    steps_fn = {}

    def make(grid):
        def loss_fn(params, ids, pixels, rope, nxt, options, answer):
            m = nnx.merge(graphdef, params, rest)
            e = m.embed(ids, pixel_values_videos=pixels, video_grid_thw=grid,
                        rope_positions=(rope, nxt))
            logits = decode(m.language_model, e, jit=False)[:, -1]
            sel = jnp.take_along_axis(logits, options, axis=1)
            lp = jax.nn.log_softmax(sel, -1)
            nll = -jnp.take_along_axis(lp, answer[:, None], axis=1)[:, 0]
            return nll.mean(), (jnp.argmax(sel, -1) == answer).mean()

        @jax.jit
        def step(params, opt_state, ids, pixels, rope, nxt, options, answer):
            (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, ids, pixels, rope, nxt, options, answer)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, acc
        return step

    from lab.nn.vlm import rope_index
    rng = np.random.default_rng(seed)
    hist = []
    for i in range(steps):
        slots = int(slot_choices[int(rng.integers(len(slot_choices)))])
        frames, questions, options, answer = sample(rng, batch, slots)
        ids, pixels, grid = batch_inputs(config, frames, questions)
        key = (slots, ids.shape[1])
        if key not in steps_fn:
            steps_fn[key] = make(grid)
        rope, nxt = rope_index(ids, config, None, grid)
        params, opt_state, loss, acc = steps_fn[key](
            params, opt_state, jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(rope),
            jnp.asarray(nxt), jnp.asarray(options), jnp.asarray(answer))
        if i % max(1, steps // 20) == 0 or i == steps - 1:
            hist.append({"step": i, "loss": float(loss), "acc": float(acc)})
    nnx.update(model, params)
    return model, {"history": hist}
