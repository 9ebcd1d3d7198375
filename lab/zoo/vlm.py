"""The VLM zoo: small :class:`lab.nn.VLM` models trained on Lab's synthetic visual tasks.

``zoo.load("vlm-xs") -> (model, tokenizer)``, ``zoo.metrics("vlm-xs")`` (held-out accuracy by
question type with all frames and with only the evidence frames, and the regime checks).
An entry is trained on first use by its :class:`VLMSpec` and cached like the text zoo's
(``$LAB_CACHE/zoo/<name>-<digest>``, :mod:`lab.zoo.store`'s layout and checks), or
shipped in ``lab/zoo/weights``.

The model reads a word-level prompt (:class:`VLMTokenizer`): ``<bos>`` and the question's
words, then per frame ``<vision_start> <video> x n <vision_end>`` (the frame's merged
visual tokens, Qwen3-VL's frame layout without timestamps; Bai et al. 2025), then
``<answer>``. The question comes first so that the decoder's visual tokens can attend to
it. An option (``"red"``, ``"circle, then 7, then cross"``, ``"red circle"``, ``"3"``) is
scored by its words' log-probability after ``<answer>`` and the posterior is the softmax
over the options, the rule of :func:`lab.nn.choice_posterior`; :func:`option_posteriors`
scores a batch of rows with per-row options in one forward (each option sees the prompt
and its own earlier words only). That is the ``"scored"`` prompt of the named models;
:class:`VLMTokenizer` also has two that list the options in the prompt (``"listed"``,
scoring the option's letter as Video-MME does, and ``"shown"``), chosen by
``VLMSpec.prompt``. Pixels are ``uint8`` RGB frames, normalised by
:func:`patchify` to ``(x / 255 - background) / 0.5`` so that the empty canvas is 0.

Training (:func:`train_vlm`) is a curriculum of stages on the posterior's cross-entropy:
first perception on single images (:func:`lab.data.image_qa` at the video's size, where
binding a colour to a shape or digit is the whole task), then videos
(:func:`lab.data.video_qa`), first with every non-evidence frame blanked, then a mix of
blanked and full videos. The measurements behind the recipe are in docs/zoo.md.

Evidence-only inputs (:func:`blank_frames`) replace every frame outside a row's
``evidence_frames`` by the empty canvas, keeping the video's length and frame positions;
this is what a frame selection that keeps those frames gives the model, and the
perfect-perception oracle (:func:`lab.data.oracle_answer`) is right on both inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.data.synthetic.image import image_qa, render_images
from lab.data.synthetic.render import BACKGROUND, COLOUR_NAMES, KINDS, plural
from lab.data.synthetic.video import QUESTION_TYPES, render_videos, video_qa
from lab.nn import VLM, TransformerConfig, VisionConfig, VLMConfig
from lab.nn.vision import patchify as nn_patchify
from lab.nn.vlm import rope_index
from lab.train import dense_label_loss

VLM_FORMAT = 1  # bump when the stored layout, the prompt or the tokenizer changes

SPECIALS = ("<pad>", "<bos>", "<vision_start>", "<vision_end>", "<video>", "<image>", "<unk>",
            "<answer>")
_QUESTION_WORDS = ("what", "colour", "was", "is", "the", "which", "digit", "shown", "in",
                   "order", "did", "and", "appear", "how", "many", "appeared", "of", "these",
                   "not", "most", "have", "object", "then")
WORDS = tuple(dict.fromkeys((*_QUESTION_WORDS, *COLOUR_NAMES, *KINDS,
                             *(plural(k) for k in range(len(KINDS))))))
# Option letters of the listing prompts (at most 8 options a row).
LETTERS = ("a", "b", "c", "d", "e", "f", "g", "h")
PROMPT_FORMATS = ("scored", "listed", "shown")  # see VLMTokenizer
PIXEL_MEAN = BACKGROUND.astype(np.float32) / 255.0
PIXEL_STD = 0.5


class VLMTokenizer:
    """Word-level tokenizer of the synthetic visual tasks' questions and options.

    ``encode(text)`` lower-cases and splits on anything but letters and digits (so
    punctuation is dropped); a word outside its words becomes ``<unk>``. The tokenizer
    also fixes the prompt format (:func:`encode`):

    - ``"scored"``: each option is scored by its own words after ``<answer>``;
    - ``"listed"``: the options are listed in the prompt under the letters :data:`LETTERS`
      and the letter is scored, as Video-MME's prompt does;
    - ``"shown"``: the options are listed under their letters as in ``"listed"`` but each
      is scored by its words, as in ``"scored"``.

    The listing prompts add the letters after the other words (every other id unchanged).
    """

    specials = SPECIALS

    def __init__(self, prompt: str = "scored"):
        if prompt not in PROMPT_FORMATS:
            raise ValueError(f"prompt={prompt!r}; expected one of {list(PROMPT_FORMATS)}")
        self.prompt = prompt
        self.listed = prompt != "scored"         # the options appear in the prompt
        self.letter_answer = prompt == "listed"  # the answer is the option's letter
        self.words = WORDS + LETTERS if self.listed else WORDS
        self.vocab = {w: i for i, w in enumerate((*SPECIALS, *self.words))}
        self.inverse = {i: w for w, i in self.vocab.items()}
        (self.pad_id, self.bos_id, self.vision_start_id, self.vision_end_id, self.video_id,
         self.image_id, self.unk_id, self.answer_id) = range(len(SPECIALS))
        self.letter_ids = tuple(self.vocab[c] for c in LETTERS) if self.listed else ()

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text={text!r}; expected a str")
        return [self.vocab.get(w, self.unk_id) for w in re.findall(r"[a-z0-9]+", text.lower())]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.inverse.get(int(i), "<unk>") for i in ids)


PROMPTS = {p: VLMTokenizer(p) for p in PROMPT_FORMATS}
TOKENIZER, LISTED_TOKENIZER = PROMPTS["scored"], PROMPTS["listed"]


def vlm_config(d_model: int, n_layers: int, vision_layers: int, *, max_frames: int = 32,
               size: int = 32, patch_size: int = 4, vision_init: float = 0.02,
               n_heads: int | None = None, merge: int = 2, prompt: str = "scored"
               ) -> VLMConfig:
    """A zoo VLM: ViT and decoder of width ``d_model`` (``vision_layers`` / ``n_layers``
    blocks), one frame per temporal patch, ``patch_size`` pixels, ``2 x 2`` merge (a
    32x32 frame with 4-pixel patches is 16 tokens), a decoder whose position budget holds
    ``max_frames`` frames of ``size`` pixels with the longest question and four options
    of five words, and whose vocabulary is ``prompt``'s tokenizer (:data:`PROMPTS`)."""
    tok = prompt_tokenizer(prompt)
    heads = n_heads or max(2, d_model // 32)
    hd = d_model // heads
    half = hd // 2
    sections = (half - 2 * (half // 3), half // 3, half // 3)
    per = (size // (merge * patch_size)) ** 2
    # bos, question, frames, answer, four options of 5 words listed under their letters
    # before the frames (listing prompts), then the scored tail: four letters or four
    # options of 5 words
    options = (4 * 6 if tok.listed else 0) + (4 if tok.letter_answer else 4 * 5)
    max_len = 2 + 16 + max_frames * (per + 2) + options
    return VLMConfig(
        text=TransformerConfig(vocab_size=tok.vocab_size, d_model=d_model, n_layers=n_layers,
                               n_heads=heads, n_kv_heads=heads, head_dim=hd, d_ff=3 * d_model,
                               max_len=max_len, tie_embeddings=False, mrope_section=sections),
        vision=VisionConfig(d_model=d_model, n_layers=vision_layers, n_heads=heads,
                            d_ff=3 * d_model, patch_size=patch_size, temporal_patch_size=1,
                            spatial_merge_size=merge, out_dim=d_model,
                            num_position_embeddings=((size // patch_size) // 2) ** 2,
                            init_std=vision_init),
        image_token_id=tok.image_id, video_token_id=tok.video_id,
        vision_start_token_id=tok.vision_start_id, vision_end_token_id=tok.vision_end_id)


def prompt_tokenizer(prompt: str) -> VLMTokenizer:
    """The tokenizer of a prompt format, ``"scored"``, ``"listed"`` or ``"shown"``
    (:class:`VLMTokenizer`)."""
    if prompt not in PROMPTS:
        raise ValueError(f"prompt={prompt!r}; expected one of {list(PROMPT_FORMATS)}")
    return PROMPTS[prompt]


# ----------------------------------------------------------------------------- inputs


def check_frames(frames, config: VLMConfig, name: str = "frames") -> np.ndarray:
    """``frames`` as ``uint8 [B, F, H, W, 3]`` whose sides are multiples of ``2 x
    patch_size``; ValueError naming ``name`` otherwise."""
    arr = np.asarray(frames)
    if arr.dtype != np.uint8:
        raise ValueError(f"{name} has dtype {arr.dtype}; expected uint8 RGB values in [0, 255]")
    if arr.ndim != 5 or arr.shape[-1] != 3 or arr.shape[1] < 1:
        raise ValueError(f"{name} has shape {arr.shape}; expected [B, F, H, W, 3] (F >= 1)")
    step = config.vision.spatial_merge_size * config.vision.patch_size
    h, w = arr.shape[2:4]
    if h != w or h % step:
        raise ValueError(f"{name} has frames of {h}x{w}; expected square frames whose side is "
                         f"a multiple of 2 x patch_size = {step}")
    return arr


def patchify(frames: np.ndarray, config: VLMConfig) -> np.ndarray:
    """``uint8 [N, H, W, 3]`` -> the tower's float32 patches (:func:`lab.nn.patchify`),
    normalised to ``(x / 255 - PIXEL_MEAN) / PIXEL_STD`` (the empty canvas is 0)."""
    v = config.vision
    return nn_patchify(frames, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                       temporal_patch_size=v.temporal_patch_size, mean=PIXEL_MEAN,
                       std=PIXEL_STD)


def tokens_per_frame(config: VLMConfig, size: int) -> int:
    return (size // (config.vision.patch_size * config.vision.spatial_merge_size)) ** 2


def blank_frames(videos: np.ndarray, keep) -> np.ndarray:
    """``videos uint8 [B, F, H, W, 3]`` with every frame outside ``keep[b]`` (frame indices,
    e.g. a row's ``evidence_frames``, or a ``[B, F]`` boolean mask) set to the empty canvas."""
    out = np.array(videos, copy=True)
    f = out.shape[1]
    for b, k in enumerate(keep):
        k = np.asarray(k)
        mask = k.astype(bool) if k.dtype == bool else np.isin(np.arange(f), k)
        if mask.shape != (f,):
            raise ValueError(f"keep[{b}] has shape {mask.shape}; expected frame indices or a "
                             f"[{f}] boolean mask")
        out[b, ~mask] = BACKGROUND
    return out


@dataclasses.dataclass
class Batch:
    """Encoded model inputs of a batch of rows (see :func:`encode`)."""

    ids: np.ndarray        # [B, T] prompt ids (left-padded)
    valid: np.ndarray      # [B, T] False at padding
    pixels: np.ndarray     # [B * F * patches, patch_dim]
    grid: tuple            # ((B * F, h, w),) the video_grid_thw, static
    rope: np.ndarray       # [3, B, T]
    nxt: np.ndarray        # [B]
    options: np.ndarray    # [B, K, L] option ids (padded with <pad>)
    opt_valid: np.ndarray  # [B, K, L]


def encode(config: VLMConfig, videos, questions: Sequence[str],
           options: Sequence[Sequence[str]], *, question_len: int = 16,
           option_len: int = 5, tokenizer: VLMTokenizer = TOKENIZER) -> Batch:
    """Model inputs of ``videos uint8 [B, F, H, W, 3]``, one question and ``K >= 2`` options
    per row (every row the same ``K``; options are padded to ``option_len`` words, questions
    to ``question_len``), in ``tokenizer``'s prompt format:

    - scored (``tokenizer.listed`` False): ``<bos> question frames <answer>``; the options
      are ``Batch.options`` ``[B, K, option_len]``, each scored by its words;
    - listed: ``<bos> question a option b option ... frames <answer>``; ``Batch.options``
      are the letters ``[B, K, 1]``, so the same scoring gives the letters' probabilities;
    - shown: the listed prompt with the scored options.

    Raises ValueError (naming the input and the limit) for frames of the wrong dtype or
    shape, a prompt longer than the decoder's position budget (too many frames), fewer
    than two options (more than :data:`LETTERS` when listed), an empty option, a question
    or option longer than its budget, or a tokenizer whose vocabulary is not the model's.
    """
    v = check_frames(videos, config, "videos")
    if tokenizer.vocab_size != config.text.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids (prompt "
                         f"{tokenizer.prompt!r}); the model's vocab_size is "
                         f"{config.text.vocab_size}: use the tokenizer the model was built for")
    b, f, h = v.shape[:3]
    if len(questions) != b or len(options) != b:
        raise ValueError(f"questions ({len(questions)}) and options ({len(options)}) need one "
                         f"entry per video ({b})")
    k = {len(o) for o in options}
    if len(k) != 1:
        raise ValueError(f"options have {sorted(k)} entries per row; expected one count")
    k = k.pop()
    if k < 2:
        raise ValueError(f"options has {k} option(s) per row; a multiple-choice posterior "
                         "needs at least 2")
    if tokenizer.listed and k > len(LETTERS):
        raise ValueError(f"options has {k} options per row; the {tokenizer.prompt} prompt "
                         f"has {len(LETTERS)} letters")
    per = tokens_per_frame(config, h)
    listed = k * (1 + option_len) if tokenizer.listed else 0
    t = 1 + question_len + listed + f * (per + 2) + 1
    tail = k if tokenizer.letter_answer else k * option_len
    budget = config.text.max_len
    if t + tail > budget:
        frames_max = (budget - 2 - question_len - listed - tail) // (per + 2)
        raise ValueError(f"videos has {f} frames of {h}x{h}: {t + tail} tokens > "
                         f"TransformerConfig.max_len={budget}, the model's position budget "
                         f"(at most {frames_max} frames)")
    ids = np.full((b, t), tokenizer.pad_id, np.int32)
    valid = np.zeros((b, t), bool)
    frame_part = [tokenizer.vision_start_id, *([tokenizer.video_id] * per),
                  tokenizer.vision_end_id] * f + [tokenizer.answer_id]
    opts = np.full((b, k, option_len), tokenizer.pad_id, np.int32)
    for i, (q, row_opts) in enumerate(zip(questions, options, strict=True)):
        qi = tokenizer.encode(q)
        if len(qi) > question_len:
            raise ValueError(f"questions[{i}] has {len(qi)} words; expected at most "
                             f"question_len={question_len}")
        for j, o in enumerate(row_opts):
            oi = tokenizer.encode(o)
            if not oi or len(oi) > option_len:
                raise ValueError(f"options[{i}][{j}]={o!r} has {len(oi)} words; expected 1 to "
                                 f"option_len={option_len}")
            opts[i, j, :len(oi)] = oi
        shown = [w for j in range(k) if tokenizer.listed
                 for w in (tokenizer.letter_ids[j], *opts[i, j][opts[i, j] != tokenizer.pad_id])]
        row = [tokenizer.bos_id, *qi, *shown, *frame_part]
        ids[i, t - len(row):] = row
        valid[i, t - len(row):] = True
    if tokenizer.letter_answer:
        opts = np.broadcast_to(np.asarray(tokenizer.letter_ids[:k], np.int32)[None, :, None],
                               (b, k, 1)).copy()
    g = h // config.vision.patch_size
    grid = np.array([[f, g, g]] * b)
    rope, nxt = rope_index(ids, config, None, grid)
    pixels = patchify(v.reshape(b * f, *v.shape[2:]), config)
    return Batch(ids, valid, pixels, tuple(map(tuple, grid.tolist())), rope, nxt, opts,
                 opts != tokenizer.pad_id)


def _option_layout(t: int, k: int, length: int):
    """Static parts of scoring ``k`` options of ``length`` words after a ``t``-token prompt:
    the block mask ``[N, N]``, each option word's source position and offset."""
    n = t + k * length
    group = np.concatenate([np.full(t, -1), np.repeat(np.arange(k), length)])
    q = np.arange(n)
    allowed = (q[None, :] < t) | ((group[:, None] == group[None, :]) & (q[None, :] <= q[:, None]))
    allowed &= q[None, :] <= q[:, None]
    offset = np.tile(np.arange(length), k)
    src = np.where(offset == 0, t - 1, t + np.arange(k * length) - 1)
    return allowed, src, offset


def score_options(lm, x, positions, rope, valid, nxt, options, opt_valid):
    """Log-probabilities ``[B, K]`` of each row's options (summed over their words) after
    a prompt given as decoder inputs, and the prompt's logits ``[B, t, V]``.

    ``x [B, t, D]`` are the prompt's input embeddings (``VLM.embed``'s, or those with
    latent steps spliced in), ``positions [B, t]``, ``rope [3, B, t]`` and ``valid
    [B, t]`` their positions and validity, ``nxt [B]`` the first option word's position,
    ``options`` / ``opt_valid`` ``[B, K, L]`` as :class:`Batch`. Every option sees the
    prompt and its own earlier words only (:func:`lab.nn.choice_posterior`'s block mask),
    in one forward of ``lm`` (the decoder)."""
    b, t = valid.shape
    _, k, length = options.shape
    allowed, src, offset = _option_layout(t, k, length)
    tail = options.reshape(b, k * length)
    x = jnp.concatenate([x, lm.embed(tail).astype(x.dtype)], axis=1)
    opt_pos = nxt[:, None] + jnp.asarray(offset, jnp.int32)[None]
    positions = jnp.concatenate([positions, opt_pos], axis=1)
    rope_all = jnp.concatenate([rope, jnp.broadcast_to(opt_pos, (3, b, k * length))], axis=2)
    keys_ok = jnp.concatenate([valid, opt_valid.reshape(b, -1)], axis=1)
    mask = jnp.asarray(allowed)[None, None] & keys_ok[:, None, None, :]
    logits = lm(inputs_embeds=x, positions=positions, rope_positions=rope_all, mask=mask)
    logp = jax.nn.log_softmax(logits[:, jnp.asarray(src)], axis=-1)     # [B, KL, V]
    tok = jnp.take_along_axis(logp, tail[..., None], axis=-1)[..., 0]   # [B, KL]
    tok = jnp.where(opt_valid.reshape(b, -1), tok, 0.0)
    return tok.reshape(b, k, length).sum(-1), logits[:, :t]


def _scores(model: VLM, ids, valid, pixels, grid, rope, nxt, options, opt_valid):
    """Log-probabilities ``[B, K]`` of each row's options (summed over their words)."""
    e = model.embed(ids, pixel_values_videos=pixels, video_grid_thw=np.array(grid),
                    rope_positions=(rope, nxt))
    return score_options(model.language_model, e.inputs_embeds, e.positions,
                         e.rope_positions, valid, nxt, options, opt_valid)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("grid",))
def _scores_jit(graphdef, state, ids, valid, pixels, rope, nxt, options, opt_valid, *, grid):
    return _scores(nnx.merge(graphdef, state), ids, valid, pixels, grid, rope, nxt, options,
                   opt_valid)[0]


def option_posteriors(model: VLM, batch: Batch) -> np.ndarray:
    """Posterior ``[B, K]`` over each row's options (softmax of the options' summed word
    log-probabilities after the prompt, as :func:`lab.nn.choice_posterior`)."""
    graphdef, state = nnx.split(model)
    s = _scores_jit(graphdef, state, *(jnp.asarray(a) for a in (
        batch.ids, batch.valid, batch.pixels, batch.rope, batch.nxt, batch.options,
        batch.opt_valid)), grid=batch.grid)
    return np.asarray(jax.nn.softmax(s, axis=-1))


def posteriors(model: VLM, videos, questions, options, *, keep=None, batch_size: int = 64,
               tokenizer: VLMTokenizer = TOKENIZER) -> np.ndarray:
    """Posterior ``[B, K]`` of each question from its video (``uint8 [B, F, H, W, 3]``),
    frames outside ``keep[b]`` blanked when ``keep`` is given (:func:`blank_frames`);
    batches of ``batch_size`` rows (the last one padded: one compiled shape)."""
    v = check_frames(videos, model.config, "videos")
    if keep is not None:
        v = blank_frames(v, keep)
    out = []
    for lo in range(0, len(v), batch_size):
        idx = np.arange(lo, min(lo + batch_size, len(v)))
        pad = np.concatenate([idx, np.full(batch_size - len(idx), idx[0])])
        enc = encode(model.config, v[pad], [questions[i] for i in pad],
                     [options[i] for i in pad], tokenizer=tokenizer)
        out.append(option_posteriors(model, enc)[:len(idx)])
    return np.concatenate(out)


# ----------------------------------------------------------------------------- training


def stage_data(stage: Mapping, n: int, seed: int):
    """The rows of a stage: :func:`lab.data.image_qa` (``"image_qa"`` kwargs) or
    :func:`lab.data.video_qa` (``"video_qa"`` kwargs)."""
    if "image_qa" in stage:
        return image_qa(n, seed, **stage["image_qa"])
    return video_qa(n, seed, **stage["video_qa"])


def render_rows(ds) -> np.ndarray:
    """``uint8 [B, F, H, W, 3]`` of image_qa rows (F = 1) or video_qa rows."""
    if ds[0]["task"] == "image_qa":
        return render_images(ds)[:, None]
    return render_videos(ds)


def _blank_mask(ds, rng, p_blank: float) -> np.ndarray | None:
    """Per row, with probability ``p_blank``: its evidence frames only (else every frame)."""
    if p_blank <= 0 or ds[0]["task"] == "image_qa":
        return None
    f = ds[0]["frames"]
    keep = np.ones((len(ds), f), bool)
    for i, ev in enumerate(ds["evidence_frames"]):
        if rng.random() < p_blank:
            keep[i] = np.isin(np.arange(f), ev)
    return keep


def _colour_rows(rows, rng) -> np.ndarray:
    """Rows whose region targets name colours instead of kinds: the questions answered by a
    colour (image_qa ``colour``, lookup's colour template, summary) and half of negation's."""
    qt = rows["question_type"]
    template = rows["template"] if "template" in rows.column_names else [0] * len(qt)
    return np.array([q == "colour" or (q == "lookup" and t == 0) or q == "summary"
                     or (q == "negation" and rng.random() < 0.5)
                     for q, t in zip(qt, template, strict=True)])


_COLOUR_IDS = np.array([TOKENIZER.vocab[c] for c in COLOUR_NAMES])
_KIND_IDS = np.array([TOKENIZER.vocab[k] for k in KINDS])
# word id -> its index in _COLOUR_IDS (-1 for any other word)
_COLOUR_INDEX = np.full(TOKENIZER.vocab_size, -1, np.int32)
_COLOUR_INDEX[_COLOUR_IDS] = np.arange(len(_COLOUR_IDS))


def _region_terms(logits, labels, colour_labels, region_weight: float, colour_weight: float):
    """``(loss, region accuracy)`` of the dense perception targets at the visual tokens
    (``labels``: a kind's word id or ``<pad>`` for an empty region, -1 off the visual
    tokens): :func:`lab.train.dense_label_loss`, object and empty tokens averaged apart
    (most tokens are empty canvas), over the whole vocabulary; with ``colour_weight`` the
    kind is a softmax over ``<pad>`` and the kinds only and the object's colour
    (``colour_labels``: a colour's word id at the same tokens, as ``labels``) a softmax over
    the colour words only, so that neither target competes with the other at the shared LM
    head."""
    kinds = _KIND_IDS if colour_weight else None
    region, acc = dense_label_loss(logits, labels, empty_id=TOKENIZER.pad_id, classes=kinds)
    total = region_weight * region if region_weight else jnp.zeros((), jnp.float32)
    if colour_weight:
        has = colour_labels > TOKENIZER.pad_id
        ce_c = optax.softmax_cross_entropy_with_integer_labels(
            logits[..., _COLOUR_IDS],
            jnp.maximum(jnp.asarray(_COLOUR_INDEX)[jnp.maximum(colour_labels, 0)], 0))
        total = total + colour_weight * jnp.sum(jnp.where(has, ce_c, 0.0)) / jnp.maximum(
            has.sum(), 1)
    return total, acc


def _loss_fn(graphdef, rest, grid, region_weight: float, colour_weight: float = 0.0):
    def loss(params, ids, valid, pixels, rope, nxt, options, opt_valid, answer, labels,
             colour_labels):
        m = nnx.merge(graphdef, params, rest)
        s, logits = _scores(m, ids, valid, pixels, grid, rope, nxt, options, opt_valid)
        lp = jax.nn.log_softmax(s, -1)
        nll = -jnp.take_along_axis(lp, answer[:, None], axis=1)[:, 0]
        region, region_acc = _region_terms(logits, labels, colour_labels, region_weight,
                                           colour_weight)
        return nll.mean() + region, ((jnp.argmax(s, -1) == answer).mean(), region_acc)
    return loss


def region_labels(ds, config: VLMConfig, tokenizer: VLMTokenizer = TOKENIZER,
                  colour_rows=None, attribute: str = "kind") -> np.ndarray:
    """``int32 [B, F, n]``: for each merged visual token (an ``m P x m P`` pixel region of a
    frame), the word id of the kind of the object covering most of its pixels (at least
    ``min_pixels``, the topmost object owning a pixel), else ``tokenizer.pad_id`` (empty).
    The perception stage's dense targets. ``attribute="colour"`` names the object's colour
    instead on every row; ``colour_rows`` (bool per row) on those rows only."""
    if attribute not in ("kind", "colour"):
        raise ValueError(f"attribute={attribute!r}; expected 'kind' or 'colour'")
    from lab.data.synthetic.render import glyph, positions

    r = config.vision.patch_size * config.vision.spatial_merge_size
    kind_ids = np.array([tokenizer.vocab[k] for k in KINDS])
    colour_ids = np.array([tokenizer.vocab[c] for c in COLOUR_NAMES])
    out = []
    for ri, row in enumerate(ds):
        by_colour = attribute == "colour" or (colour_rows is not None and bool(colour_rows[ri]))
        names = colour_ids if by_colour else kind_ids
        f, size = row["frames"], row["size"]
        owner = np.full((f, size, size), -1, np.int64)
        for obj in row["objects"]:
            mask = glyph(obj["kind"], obj["size"])
            h, w = mask.shape
            t = np.arange(obj["t0"], min(obj["t1"], f))
            xs, ys = positions(obj, t)
            for ti, x, y in zip(t, xs, ys, strict=True):
                owner[ti, y:y + h, x:x + w][mask] = obj["colour" if by_colour else "kind"]
        g = size // r
        blocks = owner.reshape(f, g, r, g, r).transpose(0, 1, 3, 2, 4).reshape(f, g * g, r * r)
        lab = np.full((f, g * g), tokenizer.pad_id, np.int32)
        for fi in range(f):
            for j in range(g * g):
                px = blocks[fi, j]
                px = px[px >= 0]
                if px.size >= MIN_REGION_PIXELS:
                    lab[fi, j] = names[np.bincount(px).argmax()]
        out.append(lab)
    return np.stack(out)


MIN_REGION_PIXELS = 6


def prompt_labels(batch: Batch, labels: np.ndarray, tokenizer: VLMTokenizer = TOKENIZER
                  ) -> np.ndarray:
    """``[B, T]`` targets of the prompt's visual tokens (``labels [B, F, n]`` in frame order),
    -1 elsewhere."""
    out = np.full(batch.ids.shape, -1, np.int32)
    where = batch.ids == tokenizer.video_id
    for b in range(len(out)):
        out[b, where[b]] = labels[b].reshape(-1)
    return out


def train_stages(model: VLM, stages: Sequence[Mapping], *, seed: int, log=None,
                 tokenizer: VLMTokenizer = TOKENIZER) -> list[dict]:
    """Trains ``model`` in place through ``stages`` (each: ``steps``, ``batch``,
    ``learning_rate``, ``n_train``, ``p_blank`` and an ``image_qa`` or ``video_qa`` block of
    generator arguments): AdamW (weight decay 0.01), clip 1, warm-up then cosine per stage,
    on the cross-entropy of the options' posterior in ``tokenizer``'s prompt format.
    Returns the loss curve."""
    config = model.config
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    curve = []
    for si, st in enumerate(stages):
        ds = stage_data(st, st["n_train"], seed * 1000 + si)
        steps = int(st["steps"])
        sched = optax.warmup_cosine_decay_schedule(
            0.0, st["learning_rate"], max(1, min(100, steps // 10)), steps,
            st["learning_rate"] * 0.05)
        opt = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(sched, weight_decay=0.01))
        opt_state = opt.init(params)
        rng = np.random.default_rng([seed, si, 11])
        step_fn = None
        t0 = time.process_time()
        for i in range(steps):
            idx = rng.integers(0, len(ds), st["batch"])
            rows = ds.select(idx)
            videos = render_rows(rows)
            keep = _blank_mask(rows, rng, st.get("p_blank", 0.0))
            if keep is not None:
                videos = blank_frames(videos, keep)
            enc = encode(config, videos, rows["question"], rows["options"],
                         tokenizer=tokenizer)
            weight = float(st.get("region_weight", 0.0))
            if weight:
                colour_rows = _colour_rows(rows, rng) if st.get("region_colour") else None
                labels = region_labels(rows, config, colour_rows=colour_rows)
                if keep is not None:
                    labels = np.where(keep[:, :, None], labels, TOKENIZER.pad_id)
                labels = prompt_labels(enc, labels)
            else:
                labels = np.full(enc.ids.shape, -1, np.int32)
            colour_weight = float(st.get("region_colour_weight", 0.0))
            colour_labels = np.full(enc.ids.shape, -1, np.int32)
            if colour_weight:
                words = region_labels(rows, config, attribute="colour")
                if keep is not None:
                    words = np.where(keep[:, :, None], words, TOKENIZER.pad_id)
                colour_labels = prompt_labels(enc, words)
            if step_fn is None:
                loss = _loss_fn(graphdef, rest, enc.grid, weight, colour_weight)

                @jax.jit
                def step_fn(params, opt_state, *arrays, loss=loss, opt=opt):
                    (value, acc), grads = jax.value_and_grad(loss, has_aux=True)(params, *arrays)
                    updates, opt_state = opt.update(grads, opt_state, params)
                    return optax.apply_updates(params, updates), opt_state, value, acc
            params, opt_state, value, acc = step_fn(
                params, opt_state, *(jnp.asarray(a) for a in (
                    enc.ids, enc.valid, enc.pixels, enc.rope, enc.nxt, enc.options,
                    enc.opt_valid, np.asarray(rows["answer_index"], np.int32), labels,
                    colour_labels)))
            if i % st.get("log_every", 25) == 0 or i == steps - 1:
                row = {"stage": si, "step": i, "loss": round(float(value), 4),
                       "acc": float(acc[0]), "region_acc": round(float(acc[1]), 3),
                       "cpu_s": time.process_time() - t0}
                curve.append(row)
                if log:
                    log(row)
    nnx.update(model, params)
    return curve


def evaluate_rows(model: VLM, ds, *, batch_size: int = 64,
                  tokenizer: VLMTokenizer = TOKENIZER) -> dict:
    """Accuracy by ``question_type`` (and ``"all"``) of ``ds``'s rows with all frames
    (``all_frames``), with the evidence frames only (``evidence_only``) and with every frame
    blank (``no_frames``, the question-only baseline); image rows: ``all_frames`` only.
    ``{"all_frames": {type: acc}, ..., "n": {type: rows}}``."""
    videos = render_rows(ds)
    answer = np.asarray(ds["answer_index"])
    types = np.asarray(ds["question_type"])
    out = {"n": {t: int((types == t).sum()) for t in dict.fromkeys(types.tolist())}}
    out["n"]["all"] = len(ds)
    modes = {"all_frames": None}
    if ds[0]["task"] == "video_qa":
        modes["evidence_only"] = ds["evidence_frames"]
        modes["no_frames"] = [[] for _ in range(len(ds))]
    for mode, keep in modes.items():
        post = posteriors(model, videos, ds["question"], ds["options"], keep=keep,
                          batch_size=batch_size, tokenizer=tokenizer)
        right = post.argmax(-1) == answer
        acc = {t: float(right[types == t].mean()) for t in out["n"] if t != "all"}
        acc["all"] = float(right.mean())
        out[mode] = acc
    return out


# ----------------------------------------------------------------------------- the zoo

HELD_OUT_SEED_OFFSET = 7919
HARD_TYPES = ("ordering", "counting", "summary")


@dataclasses.dataclass(frozen=True)
class RegimeBounds:
    """The regime a zoo VLM is checked against (held out, ``n_per_type`` rows a type).

    margin:  all-frames accuracy >= chance + ``margin`` on every question type.
    ceiling: all-frames accuracy <= ``ceiling`` on every type of :data:`HARD_TYPES`.
    evidence_slack: evidence-only accuracy >= all-frames accuracy - ``evidence_slack``
             (overall).
    """

    margin: float = 0.08
    ceiling: float = 0.9
    evidence_slack: float = 0.0


def regime_checks(result: Mapping, n_options: int = 4,
                  bounds: RegimeBounds = RegimeBounds()) -> dict:
    """Whether one model's held-out result (:func:`evaluate_rows`) is in the regime:
    ``above_chance`` (every type), ``below_ceiling`` (hard types), ``evidence_at_least_all``
    and ``ok`` (all three), with the failing types listed."""
    chance = 1.0 / n_options
    acc, ev = result["all_frames"], result["evidence_only"]
    types = [t for t in acc if t != "all"]
    low = [t for t in types if acc[t] < chance + bounds.margin]
    high = [t for t in HARD_TYPES if t in acc and acc[t] > bounds.ceiling]
    checks = {"above_chance": not low, "below_ceiling": not high,
              "evidence_at_least_all": ev["all"] >= acc["all"] - bounds.evidence_slack,
              "types_near_chance": low, "hard_types_at_ceiling": high,
              "chance": chance, "bounds": dataclasses.asdict(bounds)}
    checks["ok"] = checks["above_chance"] and checks["below_ceiling"] and \
        checks["evidence_at_least_all"]
    return checks


def family_checks(results: Sequence[tuple[str, Mapping]]) -> dict:
    """Whether each model of ``results`` (``(name, held_out)`` from smallest to largest) is
    more accurate with all frames overall than the one before it."""
    if len(results) < 2:
        raise ValueError(f"results has {len(results)} models; expected at least two")
    violations = [f"{a} {ra['all_frames']['all']:.3f} >= {b} {rb['all_frames']['all']:.3f}"
                  for (a, ra), (b, rb) in itertools.pairwise(results)
                  if not rb["all_frames"]["all"] > ra["all_frames"]["all"]]
    return {"ordered": not violations, "violations": violations}


@dataclasses.dataclass(frozen=True)
class VLMSpec:
    """A zoo VLM: its :class:`lab.nn.VLMConfig`, the training stages (:func:`train_stages`),
    the held-out set (``eval``: ``video_qa`` arguments, ``n_per_type`` rows per question
    type, and ``image_qa`` arguments with ``n_image`` rows for the perception check) and
    the seed, and the prompt format (``"scored"``, ``"listed"`` or ``"shown"``,
    :class:`VLMTokenizer`; the model's vocabulary must be that tokenizer's). ``name`` and
    ``description`` are not hashed; nor is ``prompt`` at ``"scored"``, so that entries
    trained before the listing prompts existed keep their keys."""

    name: str
    model: VLMConfig
    stages: tuple
    eval: Mapping[str, Any]
    seed: int = 0
    description: str = ""
    prompt: str = "scored"

    def __post_init__(self):
        tok = prompt_tokenizer(self.prompt)
        if tok.vocab_size != self.model.text.vocab_size:
            raise ValueError(f"VLMSpec {self.name!r}: model vocab_size="
                             f"{self.model.text.vocab_size} but prompt={self.prompt!r} has "
                             f"{tok.vocab_size} ids; build the config with "
                             f"vlm_config(..., prompt={self.prompt!r})")

    @property
    def tokenizer(self) -> VLMTokenizer:
        return prompt_tokenizer(self.prompt)

    def hashed_fields(self) -> dict:
        from lab.zoo.spec import canonical

        fields = {"format": VLM_FORMAT, "model": self.model.to_dict(),
                  "stages": [dict(s) for s in self.stages], "eval": dict(self.eval),
                  "seed": self.seed, "tokenizer": list(SPECIALS + self.tokenizer.words)}
        if self.prompt != "scored":
            fields["prompt"] = self.prompt
        return canonical(fields)

    def digest(self) -> str:
        from lab.zoo.spec import digest_of

        return digest_of(self.hashed_fields())

    @property
    def key(self) -> str:
        return f"{self.name}-{self.digest()}"

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, **self.hashed_fields()}


def held_out(spec: VLMSpec):
    """``(video rows, image rows)`` of the spec's held-out set (another seed than training's)."""
    e = spec.eval
    seed = spec.seed + HELD_OUT_SEED_OFFSET
    videos = video_qa(e["n_per_type"] * len(e["video_qa"].get("question_types",
                                                                QUESTION_TYPES)),
                      seed, **e["video_qa"])
    images = image_qa(e["n_image"], seed, **e["image_qa"]) if e.get("n_image") else None
    return videos, images


def train_vlm(spec: VLMSpec, progress: bool = False) -> tuple[VLM, dict]:
    """Trains the spec's model and measures it held out; ``(model, metrics)``."""
    from absl import logging

    from lab import host

    t0, c0 = time.time(), time.process_time()
    model = VLM(spec.model, rngs=nnx.Rngs(spec.seed))
    curve = train_stages(model, spec.stages, seed=spec.seed, tokenizer=spec.tokenizer,
                         log=(lambda r: logging.info("vlm %s: %s", spec.name, r))
                         if progress else None)
    t1, c1 = time.time(), time.process_time()
    videos, images = held_out(spec)
    result = evaluate_rows(model, videos, tokenizer=spec.tokenizer)
    metrics = {"held_out": result,
               "regime": regime_checks(result, len(videos[0]["options"])),
               "curve": curve,
               "params": int(sum(np.size(v) for v in jax.tree_util.tree_leaves(
                   nnx.state(model, nnx.Param)))),
               "seconds": {"train": t1 - t0, "train_cpu": c1 - c0,
                           "eval": time.time() - t1, "eval_cpu": time.process_time() - c1},
               "host": host.describe()}
    if images is not None:
        metrics["held_out_images"] = evaluate_rows(model, images, tokenizer=spec.tokenizer)
    return model, metrics


def model_from_flat(config: VLMConfig, flat: Mapping[str, np.ndarray], where: str) -> VLM:
    """A :class:`VLM` with ``flat`` (dotted paths) as its parameters; every key and shape
    must match (:class:`lab.zoo.store.CorruptEntry` names the first that does not)."""
    from lab.zoo.store import CorruptEntry

    abstract = nnx.eval_shape(lambda: VLM(config, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
    values = []
    names = []
    for path, leaf in leaves:
        k = ".".join(str(p.key) for p in path)
        names.append(k)
        if k not in flat:
            raise CorruptEntry(f"{where}: parameter {k} is missing")
        if tuple(flat[k].shape) != tuple(leaf.shape):
            raise CorruptEntry(f"{where}: parameter {k} has shape {tuple(flat[k].shape)}, "
                               f"expected {tuple(leaf.shape)}")
        values.append(jnp.asarray(flat[k], dtype=leaf.dtype))
    extra = sorted(set(flat) - set(names))
    if extra:
        raise CorruptEntry(f"{where}: unexpected parameters {extra[:3]}")
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, values))
    return nnx.merge(graphdef, state, rest)


# How many times this process trained each entry (tests check that a cached load does not).
TRAININGS: dict[str, int] = {}


def _read(root: str, spec: VLMSpec) -> tuple[VLM, dict]:
    import os

    from lab.zoo.store import read_files

    path = os.path.join(root, spec.key)
    flat, metrics = read_files(path, spec.digest())
    return model_from_flat(spec.model, flat, f"zoo entry {path}"), metrics


def load_spec(spec: VLMSpec, *, source: str | None = None, progress: bool = True
              ) -> tuple[VLM, VLMTokenizer]:
    """``(model, tokenizer)`` of ``spec``: shipped (``lab/zoo/weights``), cached
    (``$LAB_CACHE/zoo``) or trained now and cached, with :func:`lab.zoo.load`'s ``source``
    rules (:func:`lab.zoo.store.resolve`); every load is recorded in
    :func:`lab.zoo.loads`. A corrupt cache entry is moved aside and retrained."""
    from lab import zoo
    from lab.zoo.store import resolve, shipped_dir, write_files, zoo_dir

    if not isinstance(spec, VLMSpec):
        raise ValueError(f"load_spec expects a VLMSpec, got {type(spec).__name__}")
    key = spec.key

    def build():
        model, metrics = train_vlm(spec, progress=progress)
        write_files(key, {k: np.asarray(v) for k, v in _flat(model).items()},
                    {"spec": spec.to_dict(), "digest": spec.digest(), "format": VLM_FORMAT},
                    metrics, root=zoo_dir())
        return model, metrics

    got = resolve(key, spec.name, zoo.resolve_source(source), shipped=shipped_dir(),
                  cache=zoo_dir(), read=lambda root: _read(root, spec), build=build,
                  trainings=TRAININGS)
    zoo.record_resolved(spec.name, key, got)
    return got.obj, spec.tokenizer


def _flat(model: VLM) -> dict[str, np.ndarray]:
    from lab.zoo.store import flatten_params

    return flatten_params(model)


def family_regime(names: Sequence[str] = ("vlm-xs", "vlm-s"), *, source: str | None = None
                  ) -> dict:
    """:func:`family_checks` of the named models (loaded or trained first), smallest first."""
    from lab import zoo

    results = []
    for name in names:
        zoo.load(name, source=source)
        results.append((name, zoo.metrics(name)["held_out"]))
    return family_checks(results)


# ----------------------------------------------------------------------------- named models

VIDEO = {"frames": 16, "size": 32, "distractors": (0, 2)}
IMAGE = {"size": 32, "low_size": 32, "object_size": (7, 9), "distractors": (0, 3)}
# The perception stage of the named recipes: image_qa's three questions, negation among
# them (colour-kind binding learned on single images, docs/zoo.md).
IMAGE_TRAIN = {**IMAGE, "question_types": ("identify", "colour", "negation")}


def recipe(perception_steps: int, video_steps: tuple[int, int], *, lr: float = 3e-3,
           batch: int = 32, video_batch: int = 16, region_weight: float = 1.0,
           colour_weight: float = 0.0, video: Mapping = VIDEO, image: Mapping = IMAGE,
           fresh: bool = False) -> tuple:
    """The zoo's curriculum: ``perception_steps`` on single images (image_qa, dense region
    targets: the kind under each visual token, and its colour when ``colour_weight``),
    then videos with only the evidence frames (non-evidence frames blank), then a
    half-and-half mix of evidence-only and full videos. Each stage draws its batches
    with replacement from ``n_train`` generated rows: 8,000 images and 4,000 videos, or
    with ``fresh`` as many rows as the stage draws (``steps x batch``), so that a row is
    seen about once and the model cannot learn the training rows by heart."""
    stages = (
        {"image_qa": dict(image), "steps": perception_steps, "batch": batch,
         "learning_rate": lr, "n_train": 8000, "region_weight": region_weight},
        {"video_qa": dict(video), "steps": video_steps[0], "batch": video_batch,
         "learning_rate": lr, "n_train": 4000, "region_weight": region_weight / 2,
         "p_blank": 1.0},
        {"video_qa": dict(video), "steps": video_steps[1], "batch": video_batch,
         "learning_rate": lr * 2 / 3, "n_train": 4000, "region_weight": region_weight / 2,
         "p_blank": 0.5},
    )
    if colour_weight:
        stages = tuple({**st, "region_colour_weight": colour_weight * (1.0 if i == 0 else 0.5)}
                       for i, st in enumerate(stages))
    if fresh:
        stages = tuple({**st, "n_train": int(st["steps"]) * int(st["batch"])} for st in stages)
    return stages


def _eval(n_per_type: int, n_image: int) -> dict:
    return {"video_qa": dict(VIDEO), "n_per_type": n_per_type, "image_qa": dict(IMAGE),
            "n_image": n_image}


NAMED: dict[str, VLMSpec] = {
    "vlm-test": VLMSpec(
        name="vlm-test", model=vlm_config(32, 1, 1, max_frames=4, size=16),
        stages=({"image_qa": {"size": 16, "low_size": 16, "object_size": 8, "distractors": 0,
                              "question_types": "colour"},
                 "steps": 100, "batch": 16, "learning_rate": 1e-2, "n_train": 1024,
                 "region_weight": 0.0},),
        eval={"video_qa": {"frames": 4, "size": 16, "distractors": 0, "object_size": 7,
                           "question_types": ("lookup",), "max_count": 2,
                           "event_len": 1},
              "n_per_type": 16, "image_qa": {"size": 16, "low_size": 16, "object_size": 8,
                                             "distractors": 0, "question_types": "colour"},
              "n_image": 64},
        description="tiny, for tests: the colour of the one object in a 16x16 image"),
    "vlm-xs": VLMSpec(
        name="vlm-xs", model=vlm_config(64, 2, 2),
        stages=recipe(3000, (800, 800), colour_weight=1.0, image=IMAGE_TRAIN),
        eval=_eval(200, 256),
        description="ViT and decoder of width 64, 2 + 2 blocks, 16 tokens per 32x32 frame"),
    "vlm-s": VLMSpec(
        name="vlm-s", model=vlm_config(96, 2, 2),
        stages=recipe(3000, (800, 800), colour_weight=1.0, image=IMAGE_TRAIN),
        eval=_eval(200, 256),
        description="ViT and decoder of width 96, 2 + 2 blocks, 16 tokens per 32x32 frame"),
}


def get_spec(name: str) -> VLMSpec:
    if name not in NAMED:
        raise ValueError(f"VLM zoo model {name!r} is unknown; expected one of {sorted(NAMED)}")
    return NAMED[name]
