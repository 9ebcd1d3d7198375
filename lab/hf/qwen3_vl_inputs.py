"""Qwen3-VL's model inputs from frames and text, without ``transformers``.

- :class:`ImageProcessing` and :func:`image_inputs`: the image processor Qwen3-VL's
  processor uses for images (``transformers``' ``Qwen2VLImageProcessor``, PIL backend):
  each image resized (bicubic, on its uint8 pixels) to the size :func:`smart_resize`
  gives (sides divisible by ``patch_size * merge_size``, the area within
  ``[min_pixels, max_pixels]``), rescaled by 1/255, normalised by ``image_mean`` /
  ``image_std``, repeated over the ``temporal_patch_size`` frames of one temporal patch and
  flattened patch by patch in merge-window order. Returns the ``pixel_values``
  ``[patches, 3 * temporal_patch_size * patch_size ** 2]`` and ``image_grid_thw``
  ``[images, 3]`` that :meth:`lab.nn.VLM.__call__` takes. The settings come from the
  checkpoint's ``preprocessor_config.json`` (:meth:`ImageProcessing.from_pretrained`).
- :func:`choice_prompt`: the token ids of a multiple-choice question over images in
  Qwen3-VL's chat template (``<|im_start|>user``, one ``<|vision_start|>`` +
  ``<|image_pad|>`` x tokens + ``<|vision_end|>`` run per image, the question, the options
  as ``"A. ..."`` lines and the instruction the Video-MME evaluation uses, then
  ``<|im_start|>assistant``), and :func:`letter_ids`, the tokens whose next-token logits
  score the options.

Videos are given as frames, each frame one image (the temporal patch repeats it), not as
Qwen3-VL's video input (frame pairs per temporal patch with timestamps between them): that
needs the video processor, which is not reproduced here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np

from lab.data.video_records import LETTERS
from lab.nn import VLMConfig

INSTRUCTION = "Answer with the option's letter from the given choices directly."


@dataclasses.dataclass(frozen=True)
class ImageProcessing:
    """The image processor's settings (Qwen3-VL's released defaults)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65_536
    max_pixels: int = 16_777_216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __post_init__(self):
        for field in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                      "max_pixels"):
            v = getattr(self, field)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"ImageProcessing.{field}={v!r}; expected a positive int")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"ImageProcessing.min_pixels={self.min_pixels} > max_pixels="
                             f"{self.max_pixels}")
        for field in ("image_mean", "image_std"):
            v = getattr(self, field)
            if len(v) != 3 or (field == "image_std" and min(v) <= 0):
                raise ValueError(f"ImageProcessing.{field}={v!r}; expected three numbers"
                                 + (" > 0" if field == "image_std" else ""))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> ImageProcessing:
        """The settings of a checkpoint directory's ``preprocessor_config.json`` (``size``'s
        ``shortest_edge`` / ``longest_edge`` or ``min_pixels`` / ``max_pixels`` as the pixel
        bounds); the defaults above where it is absent or silent."""
        file = os.path.join(os.fspath(path), "preprocessor_config.json")
        if not os.path.isfile(file):
            return cls()
        with open(file) as f:
            cfg = json.load(f)
        size = cfg.get("size") or {}
        kw = {k: cfg[k] for k in ("patch_size", "temporal_patch_size", "merge_size")
              if k in cfg}
        lo = size.get("shortest_edge", cfg.get("min_pixels"))
        hi = size.get("longest_edge", cfg.get("max_pixels"))
        if lo is not None:
            kw["min_pixels"] = int(lo)
        if hi is not None:
            kw["max_pixels"] = int(hi)
        for k in ("image_mean", "image_std"):
            if k in cfg:
                kw[k] = tuple(float(x) for x in cfg[k])
        try:
            return cls(**kw)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from e

    def check_model(self, config: VLMConfig) -> None:
        """Raises ValueError when these settings do not fit ``config``'s vision tower."""
        v = config.vision
        for mine, theirs in (("patch_size", "patch_size"),
                             ("temporal_patch_size", "temporal_patch_size"),
                             ("merge_size", "spatial_merge_size")):
            if getattr(self, mine) != getattr(v, theirs):
                raise ValueError(f"ImageProcessing.{mine}={getattr(self, mine)} but the "
                                 f"model's VisionConfig.{theirs}={getattr(v, theirs)}")


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """The processed size of a ``height x width`` image: each side rounded to a multiple of
    ``factor``, then both scaled (aspect kept) into ``[min_pixels, max_pixels]`` (Qwen2-VL's
    ``smart_resize``). Raises ValueError for an aspect ratio over 200."""
    if min(height, width) < 1:
        raise ValueError(f"image of {height}x{width} pixels; expected both sides >= 1")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image of {height}x{width} pixels: aspect ratio over 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _resized(image: np.ndarray, h: int, w: int) -> np.ndarray:
    if image.shape[:2] == (h, w):
        return image
    from PIL import Image  # only when a frame needs resizing
    return np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BICUBIC))


def image_inputs(images, proc: ImageProcessing = ImageProcessing()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(pixel_values float32 [P, 3 * tp * p * p], image_grid_thw int64 [N, 3])`` of
    ``images`` (uint8 ``[H, W, 3]`` each: an array ``[N, H, W, 3]`` or a list of frames of
    any sizes). Raises ValueError naming the image for a wrong dtype or shape."""
    seq = list(images)
    if not seq:
        raise ValueError("images is empty; expected at least one uint8 [H, W, 3] image")
    p, tp, m = proc.patch_size, proc.temporal_patch_size, proc.merge_size
    mean = np.asarray(proc.image_mean, np.float32)
    std = np.asarray(proc.image_std, np.float32)
    patches, grids = [], []
    for i, image in enumerate(seq):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"images[{i}] is {image.dtype} {image.shape}; expected uint8 "
                             "[H, W, 3]")
        h, w = smart_resize(*image.shape[:2], proc.factor, proc.min_pixels, proc.max_pixels)
        x = (_resized(image, h, w).astype(np.float32) / 255.0 - mean) / std      # [h, w, 3]
        gh, gw = h // p, w // p
        x = x.transpose(2, 0, 1).reshape(3, gh // m, m, p, gw // m, m, p)
        x = x.transpose(1, 4, 2, 5, 0, 3, 6)                  # [gh/m, gw/m, m, m, 3, p, p]
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))
        patches.append(x.reshape(gh * gw, 3 * tp * p * p))
        grids.append((1, gh, gw))
    return np.ascontiguousarray(np.concatenate(patches), np.float32), np.array(grids, np.int64)


def image_token_counts(image_grid_thw, merge_size: int) -> list[int]:
    """Decoder tokens of each image: its patches over ``merge_size ** 2``."""
    return [int(np.prod(g)) // merge_size ** 2 for g in np.asarray(image_grid_thw)]


def _special(tokenizer, token: str) -> int:
    ids = tokenizer.encode(token)
    if len(ids) != 1:
        raise ValueError(f"the tokenizer encodes {token!r} as {ids}; expected one special "
                         "token (a Qwen3-VL tokenizer.json)")
    return ids[0]


def letter_ids(tokenizer, n_options: int) -> list[int]:
    """The token id of each option letter ``A``, ``B``, ...; ValueError when one is not a
    single token or two coincide."""
    if not 2 <= n_options <= len(LETTERS):
        raise ValueError(f"n_options={n_options}; expected 2..{len(LETTERS)}")
    ids = []
    for letter in LETTERS[:n_options]:
        enc = tokenizer.encode(letter)
        if len(enc) != 1:
            raise ValueError(f"the tokenizer encodes the option letter {letter!r} as {enc}; "
                             "expected a single token")
        ids.append(enc[0])
    if len(set(ids)) != n_options:
        raise ValueError(f"option letters share token ids: {ids}")
    return ids


def question_text(question: str, options: Sequence[str]) -> str:
    """The question, one ``"A. option"`` line per option, then :data:`INSTRUCTION`."""
    lines = [question.strip()] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
    return "\n".join(lines + [INSTRUCTION])


def choice_prompt(tokenizer, config: VLMConfig, image_tokens: Sequence[int], question: str,
                  options: Sequence[str], *, system: str | None = None) -> list[int]:
    """Token ids of ``question`` with ``options`` over images of ``image_tokens`` decoder
    tokens each, in Qwen3-VL's chat template, ending where the assistant's answer (the
    letter) begins. No system turn unless ``system`` is given (Qwen3-VL's template adds
    none by default)."""
    ids = []
    if system is not None:
        ids += tokenizer.encode(f"<|im_start|>system\n{system}")
        ids += [_special(tokenizer, "<|im_end|>")] + tokenizer.encode("\n")
    ids += tokenizer.encode("<|im_start|>user\n")
    for n in image_tokens:
        ids += [config.vision_start_token_id] + [config.image_token_id] * int(n) + [
            config.vision_end_token_id]
    ids += tokenizer.encode(question_text(question, options))
    ids += [_special(tokenizer, "<|im_end|>")] + tokenizer.encode("\n")
    ids += tokenizer.encode("<|im_start|>assistant\n")
    return ids
