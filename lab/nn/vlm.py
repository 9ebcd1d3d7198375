"""A vision-language model with Qwen3-VL's structure (Bai et al. 2025): a
:class:`lab.nn.VisionEncoder` whose merged visual tokens replace the image / video
token ids of a :class:`lab.nn.Transformer` with multimodal RoPE.

The decoder is Lab's one ``Transformer`` (``text.mrope_section`` set); the images
enter through ``inputs_embeds``, interleaved with the text wherever the prompt holds
their image / video token ids, and DeepStack features are added after the first blocks.
Positions follow Qwen3-VL's ``get_rope_index``: a text token advances all three
M-RoPE rows by one; the tokens of an image (or of one video frame) of ``h x w``
merged tokens starting at position ``p`` take temporal ``p``, height ``p + i``,
width ``p + j``, and the text after it continues at ``p + max(h, w)``. The mask and
the KV cache store the temporal row, which never decreases along the sequence, and
decoding goes on at ``max(all rows) + 1`` with the three rows equal (plain RoPE),
which is what ``transformers``' generate does with its ``rope_deltas``.

``lab.infer.generate(vlm, input_ids, embedded=vlm.embed(...))`` decodes after an
image prefix on the same jitted loop as text (:class:`Embedded` is that prefix);
:func:`choice_posterior` scores answer options in one forward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.nn.config import VLMConfig
from lab.nn.transformer import Transformer, check_tokens
from lab.nn.vision import VisionEncoder, check_grid, check_pixels


class Embedded(NamedTuple):
    """A prompt as the decoder takes it (what :meth:`VLM.embed` returns).

    inputs_embeds:  ``[B, T, D]`` token embeddings with the visual tokens in place.
    positions:      ``[B, T]`` int32 positions of the mask and the cache (M-RoPE's
                    temporal row).
    rope_positions: ``[3, B, T]`` int32 M-RoPE positions (temporal, height, width).
    next_position:  ``[B]`` int32 the position of the first generated token
                    (``max(rope_positions) + 1`` over each row's valid tokens).
    deepstack:      ``[K, B, T, D]`` DeepStack features (zero at text tokens) or None.
    """

    inputs_embeds: jax.Array
    positions: jax.Array
    rope_positions: jax.Array
    next_position: jax.Array
    deepstack: jax.Array | None = None


def _frames(grid: np.ndarray | None) -> list:
    """One ``(1, h, w)`` grid per video frame (Qwen3-VL separates frames by timestamps)."""
    if grid is None:
        return []
    return [(1, h, w) for t, h, w in grid.tolist() for _ in range(t)]


def rope_index(input_ids, config: VLMConfig, image_grid_thw=None, video_grid_thw=None,
               lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL's M-RoPE positions (``Qwen3VLModel.get_rope_index``) on the host.

    Args:
      input_ids: ``[B, T]`` ids; each contiguous run of ``image_token_id`` (``video_token_id``) is
        one image (one video frame), consumed in order from ``image_grid_thw``
        (``video_grid_thw``, one frame at a time) over the rows.
      lengths: ``[B]`` valid tokens per row (right padding; default all ``T``).

    Returns:
      ``(positions [3, B, T] int32, next_position [B] int32)``; padding gets 0.

    Raises ValueError when a run's length differs from its grid's merged token count or
    the runs and grids do not pair up.
    """
    ids = np.asarray(input_ids)
    b, t = ids.shape
    lens = np.full(b, t) if lengths is None else np.asarray(lengths)
    m = config.vision.spatial_merge_size
    images = [] if image_grid_thw is None else [tuple(g) for g in
                                                 np.asarray(image_grid_thw).tolist()]
    frames = _frames(None if video_grid_thw is None else np.asarray(video_grid_thw))
    queues = {1: iter(images), 2: iter(frames)}
    names = {1: ("image", "image_grid_thw"), 2: ("video frame", "video_grid_thw")}
    used = {1: 0, 2: 0}
    out = np.zeros((3, b, t), np.int64)
    nxt = np.zeros(b, np.int64)
    for r in range(b):
        row = ids[r, :lens[r]]
        kind = np.where(row == config.image_token_id, 1,
                        np.where(row == config.video_token_id, 2, 0))
        edges = np.flatnonzero(np.diff(kind)) + 1
        starts = np.concatenate([[0], edges])
        ends = np.concatenate([edges, [len(row)]])
        cur, pieces = 0, []
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            k = int(kind[s])
            if k == 0:
                pieces.append(np.broadcast_to(np.arange(e - s) + cur, (3, e - s)))
                cur += e - s
                continue
            what, field = names[k]
            grid = next(queues[k], None)
            if grid is None:
                raise ValueError(f"input_ids row {r} holds more {what} runs than {field} "
                                 f"has entries ({used[k]})")
            used[k] += 1
            gt, gh, gw = grid[0], grid[1] // m, grid[2] // m
            if gt * gh * gw != e - s:
                raise ValueError(f"input_ids row {r}: a run of {e - s} {what} tokens at "
                                 f"index {s}, but its {field} entry {list(grid)} gives "
                                 f"{gt * gh * gw} merged tokens (t * h * w / "
                                 f"spatial_merge_size^2)")
            tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij")
            pieces.append(np.stack([tt, hh, ww]).reshape(3, -1) + cur)
            cur += max(gh, gw)
        pos = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
        out[:, r, :lens[r]] = pos
        nxt[r] = pos.max() + 1 if pos.size else 0
    for k, grids in ((1, images), (2, frames)):
        if used[k] != len(grids):
            what, field = names[k]
            raise ValueError(f"{field} has {len(grids)} {what}(s) but input_ids holds "
                             f"{used[k]} runs of its token id")
    return out.astype(np.int32), nxt.astype(np.int32)


def _scatter(embeds, mask, features):
    """``embeds [N, D]`` with row ``i`` of ``features`` at the ``i``-th True of ``mask [N]``."""
    idx = jnp.clip(jnp.cumsum(mask) - 1, 0, features.shape[0] - 1)
    return jnp.where(mask[:, None], features[idx].astype(embeds.dtype), embeds)


class VLM(nnx.Module):
    """Vision tower + decoder (Qwen3-VL's ``Qwen3VLForConditionalGeneration`` structure).

    ``visual``: the :class:`VisionEncoder`; ``language_model``: the :class:`Transformer`
    (its ``lm_head`` is the VLM's). ``model(input_ids, pixel_values=, image_grid_thw=)``
    takes the arrays Hugging Face's Qwen3-VL processor returns.
    """

    def __init__(self, config: VLMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.visual = VisionEncoder(config.vision, rngs=rngs)
        self.language_model = Transformer(config.text, rngs=rngs)

    def embed(self, input_ids, *, pixel_values=None, image_grid_thw=None,
              pixel_values_videos=None, video_grid_thw=None, lengths=None,
              rope_positions=None) -> Embedded:
        """The prompt ``input_ids [B, T]`` with its images and video frames encoded and in
        place (see :class:`Embedded`).

        Args:
          pixel_values, image_grid_thw: the processor's image patches and grids.
          pixel_values_videos, video_grid_thw: the same for videos (each frame of a
            video is one run of ``video_token_id`` in ``input_ids``).
          lengths: ``[B]`` valid tokens per row (right padding).
          rope_positions: ``(positions [3, B, T], next_position [B])`` from
            :func:`rope_index`, for traced ``input_ids`` (under ``jax.jit``);
            default: computed from ``input_ids``.

        Raises ValueError for an image / video token count that differs from the encoded tokens,
        pixels of the wrong shape or dtype, a bad grid, or a prompt longer than the
        decoder's ``max_len`` (its position budget).
        """
        c = self.config
        traced = _traced(input_ids, pixel_values, pixel_values_videos)
        ids = input_ids if isinstance(input_ids, jax.core.Tracer) else np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids has shape {ids.shape}; expected [B, T]")
        check_tokens(ids, c.text.vocab_size, name="input_ids")
        b, t = ids.shape
        grids = {}
        for kind, pixels, grid in (("image", pixel_values, image_grid_thw),
                                   ("video", pixel_values_videos, video_grid_thw)):
            field = "image_grid_thw" if kind == "image" else "video_grid_thw"
            if (pixels is None) != (grid is None):
                raise ValueError(f"pass both pixel values and {field} for {kind}s, or neither")
            grids[kind] = None if grid is None else check_grid(grid, c.vision, field)
        if t > c.text.max_len:
            frames = grids["video"][:, 0].sum() if grids["video"] is not None else 0
            raise ValueError(f"input_ids has {t} tokens ({frames} video frames) > "
                             f"TransformerConfig.max_len={c.text.max_len}, the model's "
                             "position budget; pass fewer or smaller frames")
        if rope_positions is None:
            if isinstance(ids, jax.core.Tracer):
                raise ValueError("input_ids is traced; pass rope_positions=rope_index(...) "
                                 "computed outside jit")
            rope_positions = rope_index(ids, c, grids["image"], grids["video"], lengths)
        rope, nxt = (jnp.asarray(a, jnp.int32) for a in rope_positions)
        if rope.shape != (3, b, t) or nxt.shape != (b,):
            raise ValueError(f"rope_positions has shapes {rope.shape}, {nxt.shape}; expected "
                             f"(3, {b}, {t}) and ({b},)")
        m2 = c.vision.spatial_merge_size ** 2
        for kind, pixels, token in (("image", pixel_values, c.image_token_id),
                                    ("video", pixel_values_videos, c.video_token_id)):
            if grids[kind] is None:
                continue
            check_pixels(pixels, grids[kind], c.vision,
                         "pixel_values" if kind == "image" else "pixel_values_videos")
            if not isinstance(ids, jax.core.Tracer):
                held, want = int(np.sum(ids == token)), int(np.prod(grids[kind], 1).sum()) // m2
                if held != want:
                    raise ValueError(f"input_ids holds {held} {kind} tokens (id "
                                     f"{token}); the {kind}s encode to {want}")
        if traced:
            return self._embed(ids, pixel_values, pixel_values_videos, grids, rope, nxt)
        static = tuple(None if grids[k] is None else tuple(map(tuple, grids[k].tolist()))
                       for k in ("image", "video"))
        graphdef, state = nnx.split(self)
        return _embed_jit(graphdef, state, jnp.asarray(ids), pixel_values, pixel_values_videos,
                          rope, nxt, grids=static)

    def _embed(self, ids, pixel_values, pixel_values_videos, grids: dict, rope, nxt
               ) -> Embedded:
        """:meth:`embed`'s computation once the inputs are checked."""
        c = self.config
        b, t = ids.shape
        flat = jnp.asarray(ids).reshape(-1)
        x = self.language_model.embed(flat)                                   # [B*T, D]
        deep = None
        for kind, pixels, token in (("image", pixel_values, c.image_token_id),
                                    ("video", pixel_values_videos, c.video_token_id)):
            if grids[kind] is None:
                continue
            feats, stack = self.visual(pixels, grids[kind])
            mask = flat == token
            x = _scatter(x, mask, feats)
            if stack is not None:
                zeros = jnp.zeros_like(x)
                part = jax.vmap(lambda f, m=mask, z=zeros: _scatter(z, m, f))(stack)
                deep = part if deep is None else deep + part
        d = x.shape[-1]
        return Embedded(x.reshape(b, t, d), rope[0], rope, nxt,
                        None if deep is None else deep.reshape(-1, b, t, d))

    def __call__(self, input_ids, *, pixel_values=None, image_grid_thw=None,
                 pixel_values_videos=None, video_grid_thw=None, rope_positions=None,
                 capture: Sequence[str] = (), last_only: bool = False):
        """Logits ``[B, T, V]`` (float32) of ``input_ids [B, T]`` with its images / videos
        (arguments as :meth:`embed`; numpy or jax arrays, the ones
        ``Qwen3VLForConditionalGeneration`` takes); ``capture`` and ``last_only`` (logits
        ``[B, 1, V]`` of the last position) as :meth:`Transformer.__call__`."""
        e = self.embed(input_ids, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                       pixel_values_videos=pixel_values_videos, video_grid_thw=video_grid_thw,
                       rope_positions=rope_positions)
        return decode(self.language_model, e, capture=tuple(capture), last_only=last_only,
                      jit=not _traced(input_ids, pixel_values, pixel_values_videos))

    def choice_posterior(self, input_ids, options: Sequence[Sequence[int]], **vision):
        """:func:`choice_posterior` of this model (``vision``: :meth:`embed`'s arrays)."""
        return choice_posterior(self, input_ids, options, **vision)


def _traced(*xs) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("grids",))
def _embed_jit(graphdef, state, ids, pixel_values, pixel_values_videos, rope, nxt, *, grids):
    model = nnx.merge(graphdef, state)
    image, video = (None if g is None else np.array(g, np.int64) for g in grids)
    return model._embed(ids, pixel_values, pixel_values_videos,
                        {"image": image, "video": video}, rope, nxt)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("capture", "last_only"))
def _lm_jit(graphdef, state, embedded, mask, *, capture, last_only):
    lm = nnx.merge(graphdef, state)
    return lm(inputs_embeds=embedded.inputs_embeds, positions=embedded.positions,
              rope_positions=embedded.rope_positions, deepstack=embedded.deepstack, mask=mask,
              capture=capture, last_only=last_only)


def decode(lm: Transformer, embedded: Embedded, *, mask=None, capture: tuple = (),
           last_only: bool = False, jit: bool = True):
    """The decoder's logits on an embedded prompt (one jitted program unless ``jit=False``,
    which a caller under its own trace uses); ``last_only``: the last position's only."""
    if not jit:
        return lm(inputs_embeds=embedded.inputs_embeds, positions=embedded.positions,
                  rope_positions=embedded.rope_positions, deepstack=embedded.deepstack,
                  mask=mask, capture=capture, last_only=last_only)
    graphdef, state = nnx.split(lm)
    return _lm_jit(graphdef, state, embedded, mask, capture=capture, last_only=last_only)


def _check_options(options, vocab_size: int) -> list[list[int]]:
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise ValueError(f"options={options!r}; expected a list of token-id lists")
    if len(options) < 2:
        raise ValueError(f"options has {len(options)} option(s); a posterior needs at least 2")
    out = []
    for i, opt in enumerate(options):
        ids = np.atleast_1d(np.asarray(opt))
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"options[{i}]={opt!r}; expected a non-empty list of token ids")
        check_tokens(ids, vocab_size, name=f"options[{i}]")
        out.append(ids.tolist())
    return out


def choice_posterior(model: VLM | Transformer, input_ids, options: Sequence[Sequence[int]],
                     **vision) -> jax.Array:
    """Posterior ``[B, K]`` over ``K >= 2`` answer options after each prompt, in one forward.

    The prompt ``input_ids [B, T]`` (with a VLM's images, ``vision`` as
    :meth:`VLM.embed`) is followed in the same sequence by every option's tokens; a
    block mask lets each option attend to the prompt and its own earlier tokens only,
    and each option continues at the prompt's next position, so every option is
    scored exactly as if it alone followed the prompt. ``log p(option) = sum_i log
    p(o_i | prompt, o_<i)`` and the posterior is their softmax over the options.
    Raises ValueError for fewer than two options, an empty option or an id outside
    the vocabulary.
    """
    lm = model.language_model if isinstance(model, VLM) else model
    opts = _check_options(options, lm.config.vocab_size)
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    b, t = ids.shape
    if isinstance(model, VLM):
        e = model.embed(ids, **vision)
    else:
        if vision:
            raise ValueError(f"{sorted(vision)} given for a text-only Transformer")
        check_tokens(ids, lm.config.vocab_size, name="input_ids")
        pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        e = Embedded(lm.embed(jnp.asarray(ids)), pos, None, jnp.full((b,), t, jnp.int32))
    tail = np.concatenate([np.asarray(o) for o in opts])
    group = np.concatenate([np.full(len(o), k) for k, o in enumerate(opts)])
    offset = np.concatenate([np.arange(len(o)) for o in opts])
    n = t + len(tail)
    if n > lm.config.max_len:
        raise ValueError(f"prompt {t} + options {len(tail)} tokens = {n} exceed "
                         f"TransformerConfig.max_len={lm.config.max_len}")
    q = np.arange(n)
    grp = np.concatenate([np.full(t, -1), group])
    allowed = (q[None, :] < t) | ((grp[:, None] == grp[None, :]) & (q[None, :] <= q[:, None]))
    allowed &= q[None, :] <= q[:, None]
    opt_pos = e.next_position[:, None] + jnp.asarray(offset, jnp.int32)[None]   # [B, L]
    x = jnp.concatenate([e.inputs_embeds,
                         jnp.broadcast_to(lm.embed(jnp.asarray(tail)),
                                          (b, len(tail), e.inputs_embeds.shape[-1]))], axis=1)
    positions = jnp.concatenate([e.positions, opt_pos], axis=1)
    rope = deep = None
    if e.rope_positions is not None:
        rope = jnp.concatenate([e.rope_positions,
                                jnp.broadcast_to(opt_pos, (3, b, len(tail)))], axis=2)
    if e.deepstack is not None:
        deep = jnp.pad(e.deepstack, ((0, 0), (0, 0), (0, len(tail)), (0, 0)))
    logits = decode(lm, Embedded(x, positions, rope, e.next_position, deep),
                    mask=jnp.asarray(allowed)[None, None])
    logp = jax.nn.log_softmax(logits, axis=-1)                                 # [B, N, V]
    # Option k's token i is predicted at the prompt's last token (i = 0) or at its own
    # token i - 1.
    src = np.where(offset == 0, t - 1, t + np.arange(len(tail)) - 1)
    tok_lp = logp[:, src, tail]                                                # [B, L]
    scores = jax.ops.segment_sum(tok_lp.T, jnp.asarray(group), num_segments=len(opts)).T
    return jax.nn.softmax(scores, axis=-1)
