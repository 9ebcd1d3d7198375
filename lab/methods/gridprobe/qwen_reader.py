"""A Qwen3-VL checkpoint as GridProbe's selector or QA model (the real-model path).

:class:`QwenVLReader` has :class:`.ZooReader`'s interface (``posteriors``,
``frame_embeddings``, ``question_embeddings``, ``forward_flops``) over a
:class:`lab.nn.VLM` loaded by :func:`lab.hf.load_pretrained` from a Qwen3-VL directory,
its ``tokenizer.json`` and its image processor's settings. A question is asked as
:func:`lab.hf.qwen3_vl_inputs.choice_prompt` writes it (the options as lettered lines) over
its kept frames in time order: each frame one image, or, with ``video`` settings, all of
them one Qwen3-VL video (pairs of frames per temporal patch, each pair's time written
before its tokens). Its posterior is the softmax of the next-token logits over the option
letters: the scoring of the Video-MME and LongVideoBench evaluations. Each question is one
forward (its frame count and sizes set its shapes), so this path is meant for an
accelerator host.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from lab.hf import qwen3_vl_inputs as qi
from lab.nn import VLM
from lab.nn.flops import transformer_flops, vlm_config_flops


@dataclasses.dataclass
class QwenVLReader:
    """A Qwen3-VL ``model``, its ``tokenizer`` (:func:`lab.hf.load_tokenizer`) and image
    ``processing`` as GridProbe's selector or QA model; questions and options are strings.
    With ``video`` (:class:`lab.hf.qwen3_vl_inputs.VideoProcessing`) a question's frames
    are one video; without, each frame is an image."""

    model: VLM
    tokenizer: object
    processing: qi.ImageProcessing = qi.ImageProcessing()
    video: qi.VideoProcessing | None = None

    def __post_init__(self):
        if not isinstance(self.model, VLM):
            raise ValueError(f"model is a {type(self.model).__name__}; expected a lab.nn.VLM "
                             "(a Qwen3-VL checkpoint)")
        self.processing.check_model(self.model.config)
        if self.video is not None:
            self.video.check_model(self.model.config)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, dtype=None,
                        video: bool = False) -> QwenVLReader:
        """The reader of a Qwen3-VL directory (``config.json``, safetensors,
        ``tokenizer.json``, ``preprocessor_config.json`` and, with ``video``,
        ``video_preprocessor_config.json``)."""
        from lab import hf
        model = hf.load_pretrained(path, dtype=dtype)
        if not isinstance(model, VLM):
            raise ValueError(f"{os.fspath(path)!r} holds a {type(model).__name__}; expected a "
                             "Qwen3-VL checkpoint (config.json model_type 'qwen3_vl')")
        return cls(model, hf.load_tokenizer(path), qi.ImageProcessing.from_pretrained(path),
                   qi.VideoProcessing.from_pretrained(path) if video else None)

    @property
    def config(self):
        return self.model.config

    def _default_times(self, n: int) -> np.ndarray:
        """Seconds of ``n`` frames given without times: sampled at the video processor's
        ``fps``."""
        return np.arange(n) / self.video.fps

    def inputs(self, frames, question: str, options, *, times=None) -> dict:
        """The model's inputs for one question over ``frames`` (uint8 ``[H, W, 3]`` each, in
        time order; none for the question alone): ``input_ids [1, T]`` and, with frames,
        ``pixel_values`` and ``image_grid_thw``, or in video mode ``pixel_values_videos`` and
        ``video_grid_thw``, the timestamps from ``times`` (each frame's second in the
        source; by default frame ``j`` at ``j / video.fps``)."""
        frames = list(frames)
        vision, tokens, video = {}, [], None
        if frames and self.video is not None:
            v = self.video
            times = self._default_times(len(frames)) if times is None else np.asarray(times,
                                                                                     float)
            if times.shape != (len(frames),):
                raise ValueError(f"times has shape {times.shape}; expected ({len(frames)},), "
                                 "one second per frame")
            pixels, grid = qi.video_inputs(frames, v)
            vision = {"pixel_values_videos": pixels, "video_grid_thw": grid}
            video = (qi.frame_timestamps(times, 1.0, v.temporal_patch_size),
                     qi.video_frame_tokens(grid[0], v.merge_size))
        elif frames:
            pixels, grid = qi.image_inputs(frames, self.processing)
            vision = {"pixel_values": pixels, "image_grid_thw": grid}
            tokens = qi.image_token_counts(grid, self.processing.merge_size)
        ids = qi.choice_prompt(self.tokenizer, self.config, tokens, question, list(options),
                               video=video)
        return {"input_ids": np.asarray([ids], np.int32), **vision}

    def posteriors(self, videos, masks, questions, options, *, chunk: int = 64,
                   times=None) -> np.ndarray:
        """Posterior ``[B, n_options]`` of each question from its ``masks[b]`` frames of
        ``videos[b]`` (uint8 ``[N, H, W, 3]``; ``times[b]``, ``[N]`` seconds, time them in
        video mode); ``chunk`` is accepted for :class:`.ZooReader`'s signature (every
        question is its own forward)."""
        masks = np.asarray(masks, bool)
        n_opt = len(options[0])
        letters = np.asarray(qi.letter_ids(self.tokenizer, n_opt))
        out = np.zeros((len(questions), n_opt), np.float32)
        for b, q in enumerate(questions):
            keep = np.flatnonzero(masks[b])
            kept = [videos[b][j] for j in keep]
            t = None if times is None else np.asarray(times[b], float)[keep]
            logits = self.model(**self.inputs(kept, q, options[b], times=t),
                                last_only=True)[0, -1]
            out[b] = np.asarray(jax.nn.softmax(logits[letters].astype(jnp.float32)))
        return out

    def frame_embeddings(self, videos, *, chunk: int = 64) -> np.ndarray:
        """Mean merged visual token of each frame, ``[B, N, D]`` (the decoder-input space)."""
        out = []
        for video in videos:
            pixels, grid = qi.image_inputs(list(video), self.processing)
            feats = np.asarray(self.model.visual(jnp.asarray(pixels), grid)[0])
            counts = qi.image_token_counts(grid, self.processing.merge_size)
            bounds = np.cumsum([0, *counts])
            out.append(np.stack([feats[lo:hi].mean(0)
                                 for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]))
        return np.stack(out)

    def question_embeddings(self, questions) -> np.ndarray:
        """Mean input embedding of each question's tokens, ``[B, D]``."""
        out = []
        for q in questions:
            ids = self.tokenizer.encode(q) or self.tokenizer.encode(" ")
            out.append(np.asarray(self.model.language_model.embed(jnp.asarray(ids))).mean(0))
        return np.stack(out)

    def vision_flops(self, frames: int, size: int, *, width: int | None = None) -> int:
        """FLOPs of the ViT alone over ``frames`` frames (each one temporal patch) of ``size x
        size`` (or ``size x width``) pixels: the similarity selector's frame embeddings."""
        p = self.processing
        h, w = qi.smart_resize(size, width or size, p.factor, p.min_pixels, p.max_pixels)
        return int(vlm_config_flops(self.config, 1, frames * p.temporal_patch_size, h, w,
                                    0)["vision"])

    def forward_flops(self, frames: int, size: int, n_options: int, *,
                      width: int | None = None) -> int:
        """FLOPs of one question from ``frames`` frames (0: the question alone) of ``size x
        size`` pixels (``size x width`` with ``width``; as the processor resizes them): the
        ViT over each frame's temporal patch, the decoder over their tokens, two vision
        markers per frame and the chat prompt of a question with ``n_options`` one-word options
        (:func:`lab.nn.flops.vlm_config_flops`). In video mode the ViT runs over the frames'
        temporal patches (pairs of frames, at the video processor's size) and the prompt
        holds each patch's timestamp, timed as :meth:`inputs` times them by default."""
        options = ["option"] * n_options
        if frames == 0:                                              # the question alone
            text = len(qi.choice_prompt(self.tokenizer, self.config, [], "question", options))
            return int(transformer_flops(self.config.text, 1, text)["total"])
        if self.video is not None:
            v = self.video
            h, w = qi.video_smart_resize(frames, size, width or size, v)
            stamps = qi.frame_timestamps(self._default_times(frames), 1.0,
                                         v.temporal_patch_size)
            text = len(qi.choice_prompt(self.tokenizer, self.config, [], "question", options,
                                        video=(stamps, 0)))
            padded = len(stamps) * v.temporal_patch_size
            return int(vlm_config_flops(self.config, 1, padded, h, w, text)["total"])
        p = self.processing
        h, w = qi.smart_resize(size, width or size, p.factor, p.min_pixels, p.max_pixels)
        text = len(qi.choice_prompt(self.tokenizer, self.config, [], "question",
                                    options)) + 2 * frames
        tp = p.temporal_patch_size
        return int(vlm_config_flops(self.config, 1, frames * tp, h, w, text)["total"])
