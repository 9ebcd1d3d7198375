"""A small VLM fine-tuned on TAR annotations, as a predictor of the TAR harness.

The TAR paper fine-tunes a vision-language model on its task files (every answer as
text, chain-of-thought traces beside it) and compares it with the model before
fine-tuning, per task group, and as task groups are added one by one. This module is
that model at Lab's scale, on :class:`lab.nn.VLM` (Qwen3-VL's structure):

- :class:`TarTokenizer`: pieces of the training annotations (a word with its leading
  space, a single digit, a single punctuation mark or whitespace character), so that
  decoding is the concatenation of the pieces and the answers come back exactly as
  written (``{"start": "1.375", "end": "2.5"}``, ``B``, ``Yes. The red car ...``);
- :class:`VideoShape` / :func:`model_config`: the VLM for videos read as ``frames``
  temporal patches of two consecutive frames each (Qwen3-VL's temporal patches, so a
  token sees motion), evenly spaced over the video (:func:`sample_frames`), with
  ``patch_size``-pixel patches;
- :func:`encode`: ``<bos> question (<vision_start> <video> x n <vision_end>) per temporal
  patch <answer> answer <eos>``, right-padded, with the loss mask on the answer and
  ``<eos>``;
- :func:`region_targets`: dense perception targets, what the actor under each visual
  token is doing (:data:`REGIONS`, read from the frames by
  :func:`lab.methods.tar.synthetic.actor_states`), the pretraining that stands in for a
  real VLM's;
- :func:`finetune`: training on the answers' tokens and / or the perception targets
  (:func:`answer_loss`; :class:`lab.train.Trainer`, AdamW, cosine), optionally with every
  frame blanked (the no-video control: the same model and data without the pixels);
  :func:`region_recall` measures the perception on held-out videos;
- :func:`predictor`: greedy answers (:func:`lab.infer.generate` after the embedded
  prompt) as a ``predict_fn(items, frames)`` for :func:`lab.methods.tar.predict`.

The release's reasoning traces are long templates that a model of this size would spend
its steps on; :func:`with_trace` writes a short one instead, the event the video shows
(:func:`event_traces`), before each answer, which the evaluator drops.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import infer
from lab.data.batching import step_indices
from lab.methods.tar import synthetic
from lab.methods.tar.labels import answer_option
from lab.methods.tar.metrics import TRACE
from lab.nn import VLM, TransformerConfig, VisionConfig, VLMConfig
from lab.nn.vision import patchify as nn_patchify
from lab.nn.vlm import rope_index
from lab.train import TrainConfig, Trainer, dense_label_loss, logprobs_from_logits

# Region classes of the perception targets (region_targets): what the actor under a visual
# token is doing (lab.methods.tar.synthetic.STATES); an empty region's target is <pad>.
REGIONS = tuple(f"<{s}>" for s in synthetic.STATES)
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>", "<vision_start>", "<vision_end>", "<video>",
            "<answer>", *REGIONS)
PAD_ID = SPECIALS.index("<pad>")      # also the empty region's label
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^A-Za-z0-9\s]|\s")


def pieces(text: str) -> list[str]:
    """``text`` cut into pieces whose concatenation is ``text``: a run of ASCII letters
    with an optional leading space, a digit or a punctuation mark with an optional leading
    space, or one whitespace character."""
    return _PIECE.findall(text)


class TarTokenizer:
    """Piece-level tokenizer of TAR questions and answers (:func:`pieces`).

    ``TarTokenizer.fit(texts)`` takes every piece of ``texts``; :data:`SPECIALS` come
    first. ``encode`` maps an unseen piece to ``<unk>``; ``decode`` stops at ``<eos>`` or
    ``<pad>`` and drops the other special tokens.
    """

    def __init__(self, vocab: Sequence[str]):
        vocab = list(vocab)
        if tuple(vocab[:len(SPECIALS)]) != SPECIALS or len(set(vocab)) != len(vocab):
            raise ValueError("vocab must start with SPECIALS and hold each piece once")
        self.vocab = tuple(vocab)
        self.index = {p: i for i, p in enumerate(self.vocab)}
        for name in ("pad", "bos", "eos", "unk", "vision_start", "vision_end", "video",
                     "answer"):
            setattr(self, f"{name}_id", self.index[f"<{name}>"])
        self.region_ids = tuple(self.index[r] for r in REGIONS)

    @classmethod
    def fit(cls, texts: Iterable[str]) -> TarTokenizer:
        seen = sorted({p for t in texts for p in pieces(t)} - set(SPECIALS))
        return cls((*SPECIALS, *seen))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(p, self.unk_id) for p in pieces(text)]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i in (self.eos_id, self.pad_id):
                break
            if i >= len(SPECIALS):
                out.append(self.vocab[i])
        return "".join(out)


@dataclasses.dataclass(frozen=True)
class VideoShape:
    """The frames the model reads: ``frames`` temporal patches per video, each of
    ``temporal_patch`` consecutive frames (Qwen3-VL's temporal patches: a token sees the
    motion between them), ``height x width`` pixels, ``patch_size`` pixels a patch side,
    ``merge x merge`` patches merged per token."""

    frames: int = 8
    height: int = 48
    width: int = 64
    patch_size: int = 8
    merge: int = 1
    temporal_patch: int = 2

    def __post_init__(self):
        step = self.patch_size * self.merge
        if (self.frames < 1 or self.temporal_patch < 1 or self.height % step
                or self.width % step):
            raise ValueError(f"{self}: expected frames >= 1, temporal_patch >= 1 and sides "
                             f"that are multiples of patch_size x merge = {step}")

    @property
    def grid(self) -> tuple[int, int, int]:
        """One video's ``video_grid_thw`` row: ``(frames, patch rows, patch columns)``."""
        return self.frames, self.height // self.patch_size, self.width // self.patch_size

    @property
    def tokens_per_frame(self) -> int:
        _, h, w = self.grid
        return (h // self.merge) * (w // self.merge)

    @property
    def pixel_frames(self) -> int:
        """Frames of pixels a video gives the model (``frames x temporal_patch``)."""
        return self.frames * self.temporal_patch


def model_config(tokenizer: TarTokenizer, shape: VideoShape, *, d_model: int = 96,
                 n_layers: int = 3, vision_layers: int = 2, max_len: int = 512) -> VLMConfig:
    """A VLM of width ``d_model`` (``n_layers`` decoder and ``vision_layers`` ViT blocks,
    heads of 32) over ``tokenizer``'s vocabulary, ``shape``'s patches and a ``max_len``
    position budget (prompt, frames and answer)."""
    heads = max(2, d_model // 32)
    hd = d_model // heads
    half = hd // 2
    _, gh, gw = shape.grid
    return VLMConfig(
        text=TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=d_model,
                               n_layers=n_layers, n_heads=heads, n_kv_heads=heads, head_dim=hd,
                               d_ff=3 * d_model, max_len=max_len, tie_embeddings=False,
                               mrope_section=(half - 2 * (half // 3), half // 3, half // 3)),
        vision=VisionConfig(d_model=d_model, n_layers=vision_layers, n_heads=heads,
                            d_ff=3 * d_model, patch_size=shape.patch_size,
                            temporal_patch_size=shape.temporal_patch,
                            spatial_merge_size=shape.merge,
                            out_dim=d_model, num_position_embeddings=max(gh, gw) ** 2),
        # No image enters this model; <pad> never lies inside a prompt's valid tokens,
        # so an unseen word (<unk>) is never taken for an image.
        image_token_id=tokenizer.pad_id, video_token_id=tokenizer.video_id,
        vision_start_token_id=tokenizer.vision_start_id,
        vision_end_token_id=tokenizer.vision_end_id)


def frame_positions(n_video: int, shape: VideoShape) -> np.ndarray:
    """The first frame of each of ``shape.frames`` temporal patches, evenly spaced over a
    video of ``n_video`` frames (the rule of :func:`lab.methods.tar.load_frames`'s
    ``max_frames``, over the patches' possible starts)."""
    if n_video < shape.temporal_patch:
        raise ValueError(f"a video of {n_video} frames is shorter than one temporal patch "
                         f"({shape.temporal_patch} frames)")
    return np.linspace(0, n_video - shape.temporal_patch, shape.frames).round().astype(int)


def sample_frames(frames: np.ndarray, shape: VideoShape) -> np.ndarray:
    """``uint8 [frames x temporal_patch, H, W, 3]``: for each temporal patch
    (:func:`frame_positions`) its ``temporal_patch`` consecutive frames of the video
    ``uint8 [T, H, W, 3]``."""
    frames = np.asarray(frames)
    start = frame_positions(len(frames), shape)
    return frames[(start[:, None] + np.arange(shape.temporal_patch)[None]).reshape(-1)]


def region_targets(frames: np.ndarray, shape: VideoShape, tokenizer: TarTokenizer
                   ) -> np.ndarray:
    """Dense perception targets ``int32 [shape.frames, tokens_per_frame]`` of a whole video
    ``uint8 [T, H, W, 3]``: for each temporal patch's first frame, the region class
    (:data:`REGIONS`) of the actor under each visual token
    (:func:`lab.methods.tar.synthetic.actor_states`; an anomalous state wins where actors
    share a token), ``<pad>`` where no actor is."""
    frames = np.asarray(frames)
    start = frame_positions(len(frames), shape)
    states = synthetic.actor_states(frames)
    side = shape.patch_size * shape.merge
    rows, cols = shape.height // side, shape.width // side
    # where actors share a token: an anomalous state over a normal one
    normal = [synthetic.STATES.index(k) for k in ("car", "pedestrian")]
    order = normal + [k for k in range(len(synthetic.STATES)) if k not in normal]
    rank = np.argsort(order)                              # state -> priority
    out = np.full((shape.frames, rows, cols), -1, np.int64)
    for boxes, state in states.values():
        for i, t in enumerate(start):
            if state[t] < 0:
                continue
            y0, y1, x0, x1 = (int(v) for v in boxes[t])
            cell = out[i, y0 // side:(y1 - 1) // side + 1, x0 // side:(x1 - 1) // side + 1]
            np.maximum(cell, rank[state[t]], out=cell)
    ids = np.asarray((tokenizer.pad_id, *(tokenizer.region_ids[k] for k in order)))
    return ids[out + 1].reshape(shape.frames, -1).astype(np.int32)


def patchify(frames: np.ndarray, shape: VideoShape) -> np.ndarray:
    """``uint8 [N x temporal_patch, H, W, 3]`` -> the tower's float32 patches of
    ``shape``'s temporal patches (:func:`lab.nn.patchify`), scaled to ``[-1, 1]``."""
    return nn_patchify(frames, patch_size=shape.patch_size, merge_size=shape.merge,
                       temporal_patch_size=shape.temporal_patch)


def prompt_ids(tokenizer: TarTokenizer, question: str, shape: VideoShape) -> list[int]:
    """``<bos> question`` then each frame's ``<vision_start> <video> x n <vision_end>``, then
    ``<answer>``."""
    frame = [tokenizer.vision_start_id, *[tokenizer.video_id] * shape.tokens_per_frame,
             tokenizer.vision_end_id]
    return [tokenizer.bos_id, *tokenizer.encode(question), *frame * shape.frames,
            tokenizer.answer_id]


def _check_videos(videos, shape: VideoShape) -> np.ndarray:
    v = np.asarray(videos)
    want = (shape.pixel_frames, shape.height, shape.width, 3)
    if v.dtype != np.uint8 or v.ndim != 5 or v.shape[1:] != want:
        raise ValueError(f"videos have shape {v.shape} and dtype {v.dtype}; expected uint8 "
                         f"[B, {', '.join(map(str, want))}] (sample_frames)")
    return v


def encode(config: VLMConfig, tokenizer: TarTokenizer, shape: VideoShape, videos,
           questions: Sequence[str], answers: Sequence[str] | None = None, *,
           width: int | None = None, blank: bool = False, regions=None) -> dict:
    """Model inputs of ``videos uint8 [B, frames x temporal_patch, H, W, 3]``
    (:func:`sample_frames`) and their questions.

    With ``answers``: the SFT batch ``{"inputs", "targets", "mask", "pixels", "rope",
    "nxt"}`` of ``prompt + answer + <eos>`` (``targets`` the next tokens, ``mask`` on the
    answer's tokens and ``<eos>``). Without: the prompts ``{"inputs", "lengths",
    "pixels", "rope", "nxt"}``. Rows are right-padded to ``width`` tokens (default: the
    longest row; a fixed width keeps one compiled program). ``blank``: every pixel at the
    mid grey the scaling maps to 0 (the model sees the frames' token layout and no
    video). ``regions`` ``[B, frames, tokens_per_frame]`` (:func:`region_targets`) adds
    ``"regions" [B, width]``: each visual token's target, -1 elsewhere. Raises ValueError
    for videos of another shape or a sequence beyond the position budget (naming the row
    and its length).
    """
    v = _check_videos(videos, shape)
    b = len(v)
    if len(questions) != b or (answers is not None and len(answers) != b):
        raise ValueError(f"{b} videos, {len(questions)} questions"
                         + ("" if answers is None else f", {len(answers)} answers")
                         + ": expected one each per video")
    rows, starts = [], []
    for i, q in enumerate(questions):
        row = prompt_ids(tokenizer, q, shape)
        starts.append(len(row))
        if answers is not None:
            row = row + tokenizer.encode(answers[i]) + [tokenizer.eos_id]
        if len(row) - (answers is not None) > config.text.max_len:
            raise ValueError(f"row {i}: {len(row)} tokens > TransformerConfig.max_len="
                             f"{config.text.max_len}")
        rows.append(row)
    longest = max(len(r) for r in rows) - (answers is not None)
    width = longest if width is None else width
    if longest > width:
        raise ValueError(f"a row has {longest} tokens > width={width}")
    ids = np.full((b, width), tokenizer.pad_id, np.int32)
    out = {}
    if answers is not None:
        targets = np.full((b, width), tokenizer.pad_id, np.int32)
        mask = np.zeros((b, width), np.float32)
        for i, row in enumerate(rows):
            ids[i, :len(row) - 1] = row[:-1]
            targets[i, :len(row) - 1] = row[1:]
            mask[i, starts[i] - 1:len(row) - 1] = 1.0
        lengths = np.array([len(r) - 1 for r in rows], np.int32)
        out.update(targets=targets, mask=mask)
    else:
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        lengths = np.array([len(r) for r in rows], np.int32)
        out["lengths"] = lengths
    grid = np.array([shape.grid] * b)
    rope, nxt = rope_index(ids, config, None, grid, lengths)
    pixels = patchify(v.reshape(-1, *v.shape[2:]), shape)
    if blank:
        pixels = np.zeros_like(pixels)
    out.update(inputs=ids, pixels=pixels, rope=rope, nxt=nxt)
    if regions is not None:
        regions = np.asarray(regions).reshape(b, -1)
        at = np.full((b, width), -1, np.int32)
        visual = ids == tokenizer.video_id
        if regions.shape[1] != visual.sum(1).max():
            raise ValueError(f"regions hold {regions.shape[1]} targets a row; the prompt has "
                             f"{visual.sum(1).max()} visual tokens")
        at[visual] = regions.reshape(-1)
        out["regions"] = at
    return out


def answer_loss(grid: np.ndarray, *, answer_weight: float = 1.0, region_weight: float = 0.0,
                region_ids: Sequence[int] = ()) -> Callable:
    """``loss_fn(model, batch)`` for :class:`lab.train.Trainer` (:func:`encode`'s SFT
    batch; ``grid`` is the batch's ``video_grid_thw``, fixed for every batch):
    ``answer_weight`` x the mean negative log-likelihood of the masked tokens, plus with
    ``region_weight`` the perception loss at the visual tokens (``batch["regions"]``),
    :func:`lab.train.dense_label_loss` over ``<pad>`` (empty) and ``region_ids``, each
    class's mean cross-entropy averaged apart (anomalous states are a few tokens in a
    thousand). ``region_recall`` is the mean over classes of the fraction of a class's
    tokens predicted as it."""
    grid = np.asarray(grid)

    def loss_fn(model: VLM, batch: dict):
        logits = model(batch["inputs"], pixel_values_videos=batch["pixels"],
                       video_grid_thw=grid, rope_positions=(batch["rope"], batch["nxt"]))
        logp = logprobs_from_logits(logits, batch["targets"])
        mask = batch["mask"]
        tokens = jnp.maximum(mask.sum(), 1.0)
        nll = -jnp.sum(mask * logp) / tokens
        hit = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
        metrics = {"answer_nll": nll, "accuracy": jnp.sum(mask * hit) / tokens}
        loss = answer_weight * nll
        if region_weight:
            region, metrics["region_recall"] = dense_label_loss(
                logits, batch["regions"], empty_id=PAD_ID, classes=region_ids, per_class=True)
            loss = loss + region_weight * region
        metrics["loss"] = loss
        return loss, metrics

    return loss_fn


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Training settings: ``steps`` updates of ``batch`` items, AdamW (weight decay
    ``weight_decay``), linear warm-up over ``warmup`` steps, then cosine to 0; the loss
    weights of :func:`answer_loss` (``region_weight`` needs region targets); ``blank``
    as :func:`encode`."""

    steps: int = 600
    batch: int = 16
    learning_rate: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.01
    seed: int = 0
    blank: bool = False
    answer_weight: float = 1.0
    region_weight: float = 0.0


def finetune(model: VLM, tokenizer: TarTokenizer, shape: VideoShape, items: Sequence,
             videos: dict, config: FinetuneConfig = FinetuneConfig(), *,
             regions: dict | None = None) -> tuple[VLM, list]:
    """Trains ``model`` (in place) on ``items`` (:class:`lab.methods.tar.Item` with
    answers), ``videos`` ``{video_id: uint8 [frames x temporal_patch, H, W, 3]}``
    (:func:`sample_frames`) and, for the perception loss, ``regions`` ``{video_id:
    region_targets}``; returns ``(model, history)`` (the trainer's metric records)."""
    if not items:
        raise ValueError("finetune: no items to train on")
    missing = sorted({it.video_id for it in items} - set(videos))
    if missing:
        raise ValueError(f"finetune: no frames for video(s) {missing[:3]}")
    if any(it.answer is None for it in items):
        raise ValueError("finetune: every item needs its answer")
    if config.region_weight and (regions is None or set(videos) - set(regions)):
        raise ValueError("finetune: region_weight > 0 needs region targets for every video")
    cfg = TrainConfig(steps=config.steps, learning_rate=config.learning_rate,
                      warmup_steps=config.warmup, schedule="cosine",
                      weight_decay=config.weight_decay, seed=config.seed, log_every=25,
                      checkpoint_every=0, progress=False)
    n = len(items)
    width = max(len(prompt_ids(tokenizer, it.question, shape)) + len(tokenizer.encode(it.answer))
                for it in items)
    width = min(-(-width // 16) * 16, model.config.text.max_len)   # one program for all

    def batch_fn(step):
        rows = [items[i] for i in step_indices(n, config.batch, step, config.seed)]
        return encode(model.config, tokenizer, shape,
                      np.stack([videos[it.video_id] for it in rows]),
                      [it.question for it in rows], [it.answer for it in rows],
                      width=width, blank=config.blank,
                      regions=(np.stack([regions[it.video_id] for it in rows])
                               if config.region_weight else None))

    grid = np.array([shape.grid] * config.batch)
    loss = answer_loss(grid, answer_weight=config.answer_weight,
                       region_weight=config.region_weight, region_ids=tokenizer.region_ids)
    trainer = Trainer(model, loss, cfg)
    model = trainer.fit(batch_fn)
    return model, trainer.history


def predictor(model: VLM, tokenizer: TarTokenizer, shape: VideoShape, *,
              max_new_tokens: int = 96, batch_size: int = 32, blank: bool = False):
    """``predict_fn(items, frames) -> [answer]`` for :func:`lab.methods.tar.predict`:
    greedy answers of ``model`` after each item's question and its video's frames
    (``frames``: whole videos ``uint8 [T, H, W, 3]``, sampled by :func:`sample_frames`;
    ``blank`` as :func:`encode`). An answer ends at ``<eos>``, after ``max_new_tokens``, or
    where the batch's longest prompt reaches the model's position budget
    (``max_len``), whichever comes first. Batches are padded to ``batch_size`` rows so that
    one program serves every call."""

    def predict_fn(items, frames):
        if any(f is None for f in frames):
            raise ValueError("the TAR VLM needs frames: pass media_root to tar.predict")
        out = []
        for s in range(0, len(items), batch_size):
            chunk = list(items[s:s + batch_size])
            vids = [sample_frames(f, shape) for f in frames[s:s + batch_size]]
            qs = [it.question for it in chunk]
            k = len(chunk)
            vids += [vids[-1]] * (batch_size - k)
            qs += [qs[-1]] * (batch_size - k)
            enc = encode(model.config, tokenizer, shape, np.stack(vids), qs, blank=blank)
            grid = np.array([shape.grid] * batch_size)
            e = model.embed(enc["inputs"], pixel_values_videos=enc["pixels"],
                            video_grid_thw=grid, lengths=enc["lengths"],
                            rope_positions=(enc["rope"], enc["nxt"]))
            budget = model.config.text.max_len - int(enc["lengths"].max())
            gen = infer.generate(model, enc["inputs"], lengths=enc["lengths"],
                                 max_new_tokens=min(max_new_tokens, budget), embedded=e,
                                 stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
            toks = np.asarray(gen.tokens)
            out += [tokenizer.decode(toks[i]) for i in range(k)]
        return out

    return predict_fn


def region_recall(model: VLM, tokenizer: TarTokenizer, shape: VideoShape, videos: dict,
                  regions: dict, *, batch_size: int = 32) -> dict:
    """Per region class (``"<pad>"`` for empty regions and :data:`REGIONS`): ``{"n": tokens,
    "recall": fraction predicted as the class}`` of the perception targets ``regions``
    ``{video_id: region_targets}`` on ``videos`` ``{video_id: sampled frames}``, each
    visual token classified by the argmax over ``<pad>`` and the region classes."""
    ids = sorted(videos)
    classes = np.asarray((tokenizer.pad_id, *tokenizer.region_ids))
    grid = np.array([shape.grid] * batch_size)
    hits, counts = np.zeros(len(classes)), np.zeros(len(classes))
    for s in range(0, len(ids), batch_size):
        chunk = ids[s:s + batch_size]
        k = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - k)
        enc = encode(model.config, tokenizer, shape, np.stack([videos[v] for v in chunk]),
                     [""] * batch_size, regions=np.stack([regions[v] for v in chunk]))
        logits = model(enc["inputs"], pixel_values_videos=enc["pixels"], video_grid_thw=grid,
                       rope_positions=(enc["rope"], enc["nxt"]))
        pred = classes[np.asarray(logits)[..., classes].argmax(-1)][:k]
        labels = enc["regions"][:k]
        for j, c in enumerate(classes):
            sel = labels == c
            counts[j] += sel.sum()
            hits[j] += (pred[sel] == c).sum()
    names = ("<pad>", *REGIONS)
    return {n: {"n": int(c), "recall": float(h / c) if c else float("nan")}
            for n, h, c in zip(names, hits, counts, strict=True)}


def new_model(config: VLMConfig, seed: int) -> VLM:
    """A freshly initialised VLM of ``config``."""
    return VLM(config, rngs=nnx.Rngs(seed))


def event_traces(train_items: dict) -> dict[str, str]:
    """``{video_id: text}``: the event each training video shows, as its mcq item's answer
    names it (the text of the option its letter picks,
    :func:`~lab.methods.tar.labels.answer_option`). A video without an mcq item, or whose
    answer names no option, has none."""
    out = {}
    for it in train_items.get("mcq", ()):
        text = answer_option(it)
        if text:
            out[it.video_id] = text
    return out


def with_trace(items: Sequence, traces: dict[str, str], *, choice_text: bool = False
               ) -> list:
    """``items`` as the fine-tuning sees them with a short reasoning trace: each answer
    written after ``<think> {trace}</think>``, the trace of its video (:func:`event_traces`;
    an item whose video has none keeps its plain answer). The evaluator drops the span
    (:mod:`lab.methods.tar.metrics`), so a generated answer is scored on what follows it.
    With ``choice_text`` an mcq answer is the text of the option its letter picks, which
    the evaluator reads as that option (:func:`~lab.methods.tar.metrics.normalise_choice`)."""
    out = []
    for it in items:
        answer = it.answer
        if choice_text and it.task == "mcq":
            answer = answer_option(it) or answer
        if it.video_id in traces:
            answer = f"{TRACE[0]} {traces[it.video_id]}{TRACE[1]} {answer}"
        out.append(dataclasses.replace(it, answer=answer))
    return out


def answer_lengths(tokenizer: TarTokenizer, items: Sequence) -> np.ndarray:
    """Tokens of each item's answer (for sizing ``max_new_tokens``)."""
    return np.array([len(tokenizer.encode(it.answer or "")) for it in items])


__all__ = ["REGIONS", "SPECIALS", "FinetuneConfig", "TarTokenizer", "VideoShape",
           "answer_loss", "answer_lengths", "encode", "event_traces", "finetune", "frame_positions",
           "model_config", "new_model", "patchify", "pieces", "predictor", "prompt_ids",
           "region_recall", "region_targets", "sample_frames", "with_trace"]
