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

- :class:`VideoProcessing`, :func:`sample_frames`, :func:`video_smart_resize`,
  :func:`video_inputs` and :func:`frame_timestamps`: Qwen3-VL's video input
  (``transformers``' ``Qwen3VLVideoProcessor`` and ``Qwen3VLProcessor``): frames sampled
  at ``fps`` per second of the source (clamped to ``[min_frames, max_frames]``), all
  resized to one size whose pixels over the whole clip lie in ``[min_pixels,
  max_pixels]``, consecutive pairs of frames making one temporal patch (an odd count
  repeats the last frame), and each temporal patch's tokens preceded in the prompt by its
  time, ``"<1.5 seconds>"`` (the mean time of its two frames). ``pixel_values_videos`` and
  ``video_grid_thw`` go to :meth:`lab.nn.VLM.__call__`; :func:`choice_prompt`'s ``video``
  writes the timestamps and the frames' tokens.

A video can also be given as frames, each one image (the temporal patch repeats it), which
costs each frame a temporal patch of its own. Resizing uses PIL's bicubic filter, as the
image processor's PIL backend does; the video processor resizes with torchvision's
antialiased bicubic instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np

from lab.data.video_records import LETTERS
from lab.nn import VLMConfig, patchify

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

    POSITIVE_INTS = ("patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                     "max_pixels")
    ORDERED = (("min_pixels", "max_pixels"),)       # (low, high) bounds

    def __post_init__(self):
        name = type(self).__name__
        for field in self.POSITIVE_INTS:
            v = getattr(self, field)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}.{field}={v!r}; expected a positive int")
        for lo, hi in self.ORDERED:
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"{name}.{lo}={getattr(self, lo)} > {hi}={getattr(self, hi)}")
        for field in ("image_mean", "image_std"):
            v = getattr(self, field)
            if len(v) != 3 or (field == "image_std" and min(v) <= 0):
                raise ValueError(f"{name}.{field}={v!r}; expected three numbers"
                                 + (" > 0" if field == "image_std" else ""))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    CONFIG_FILE = "preprocessor_config.json"    # in a checkpoint directory
    READ_FIELDS = ("patch_size", "temporal_patch_size", "merge_size")   # read as they are

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> ImageProcessing:
        """The settings of a checkpoint directory's ``CONFIG_FILE`` (``size``'s
        ``shortest_edge`` / ``longest_edge`` or ``min_pixels`` / ``max_pixels`` as the pixel
        bounds); the defaults above where it is absent or silent."""
        file = os.path.join(os.fspath(path), cls.CONFIG_FILE)
        if not os.path.isfile(file):
            return cls()
        with open(file) as f:
            cfg = json.load(f)
        size = cfg.get("size") or {}
        kw = {k: cfg[k] for k in cls.READ_FIELDS if k in cfg}
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
                raise ValueError(f"{type(self).__name__}.{mine}={getattr(self, mine)} but the "
                                 f"model's VisionConfig.{theirs}={getattr(v, theirs)}")


@dataclasses.dataclass(frozen=True)
class VideoProcessing(ImageProcessing):
    """The video processor's settings (``transformers``' ``Qwen3VLVideoProcessor``
    defaults). ``min_pixels`` / ``max_pixels`` bound the pixels of the whole clip (frames x
    height x width); ``fps`` is the sampling rate of :func:`sample_frames`;
    ``cap_pixels_per_frame`` caps each frame at ``max_video_tokens`` merged tokens and an
    even share of ``max_pixels`` (qwen-vl-utils' rule; off by default, as in
    ``transformers``)."""

    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    CONFIG_FILE = "video_preprocessor_config.json"
    READ_FIELDS = ImageProcessing.READ_FIELDS + ("fps", "min_frames", "max_frames",
                                                 "cap_pixels_per_frame", "max_video_tokens")
    POSITIVE_INTS = ImageProcessing.POSITIVE_INTS + ("min_frames", "max_frames",
                                                     "max_video_tokens")
    ORDERED = ImageProcessing.ORDERED + (("min_frames", "max_frames"),)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.fps, (int, float)) or not self.fps > 0:
            raise ValueError(f"VideoProcessing.fps={self.fps!r}; expected a number > 0")
        if self.cap_pixels_per_frame is None:     # transformers' "unset": its current default
            object.__setattr__(self, "cap_pixels_per_frame", False)


def _fit(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, what: str,
         frames: int = 1, patched_frames: int = 1) -> tuple[int, int]:
    """Qwen2-VL's sizing rule, shared by images and clips: each side rounded to a multiple
    of ``factor``, then both scaled (aspect kept) so that ``patched_frames x h x w`` lies in
    ``[min_pixels, max_pixels]`` (the scale computed over ``frames``, as the processors do).
    ``what`` names the input in the aspect-ratio error."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"{what} of {height}x{width} pixels: aspect ratio over 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if patched_frames * h * w > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif patched_frames * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """The processed size of a ``height x width`` image: each side rounded to a multiple of
    ``factor``, then both scaled (aspect kept) into ``[min_pixels, max_pixels]`` (Qwen2-VL's
    ``smart_resize``). Raises ValueError for an aspect ratio over 200."""
    if min(height, width) < 1:
        raise ValueError(f"image of {height}x{width} pixels; expected both sides >= 1")
    return _fit(height, width, factor, min_pixels, max_pixels, "image")


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
    patches, grids = [], []
    for i, image in enumerate(seq):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"images[{i}] is {image.dtype} {image.shape}; expected uint8 "
                             "[H, W, 3]")
        h, w = smart_resize(*image.shape[:2], proc.factor, proc.min_pixels, proc.max_pixels)
        patches.append(_patches(_resized(image, h, w)[None], proc))     # one frame, repeated
        grids.append((1, h // proc.patch_size, w // proc.patch_size))
    return np.concatenate(patches), np.array(grids, np.int64)


def _patches(frames: np.ndarray, proc) -> np.ndarray:
    return patchify(frames, patch_size=proc.patch_size, merge_size=proc.merge_size,
                    temporal_patch_size=proc.temporal_patch_size, mean=proc.image_mean,
                    std=proc.image_std)


def image_token_counts(image_grid_thw, merge_size: int) -> list[int]:
    """Decoder tokens of each image: its patches over ``merge_size ** 2``."""
    return [int(np.prod(g)) // merge_size ** 2 for g in np.asarray(image_grid_thw)]


def sample_frames(total_frames: int, video_fps: float, proc: VideoProcessing = VideoProcessing(),
                  *, num_frames: int | None = None) -> np.ndarray:
    """Indices (int64, ascending) of the frames of a ``total_frames``-frame video at
    ``video_fps`` that Qwen3-VL's video processor keeps: ``num_frames`` of them when given,
    else ``proc.fps`` per second clamped to ``[min_frames, max_frames]`` and to the video's
    length, evenly spaced from the first frame to the last and rounded."""
    if not isinstance(total_frames, (int, np.integer)) or total_frames < 1:
        raise ValueError(f"total_frames={total_frames!r}; expected an int >= 1")
    if not video_fps > 0:
        raise ValueError(f"video_fps={video_fps!r}; expected frames per second > 0")
    if num_frames is None:
        n = int(total_frames / video_fps * proc.fps)
        n = min(max(n, proc.min_frames), proc.max_frames, total_frames)
    elif not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
        raise ValueError(f"num_frames={num_frames!r}; expected an int >= 1 or None")
    else:
        n = int(num_frames)
    return np.linspace(0, total_frames - 1, n).round().astype(np.int64)


def video_smart_resize(num_frames: int, height: int, width: int,
                       proc: VideoProcessing = VideoProcessing()) -> tuple[int, int]:
    """The processed frame size of a ``num_frames``-frame clip of ``height x width``: each
    side rounded to a multiple of ``proc.factor``, then both scaled (aspect kept) so that the
    clip's pixels (frames rounded to temporal patches) lie in ``[min_pixels, max_pixels]``,
    with ``max_pixels`` per-frame capped when ``cap_pixels_per_frame`` (Qwen3-VL's video
    ``smart_resize``). A clip shorter than a temporal patch is sized as one temporal patch
    (its last frame repeated), where ``transformers`` refuses it."""
    if not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
        raise ValueError(f"num_frames={num_frames!r}; expected an int >= 1")
    if min(height, width) < 1:
        raise ValueError(f"frames of {height}x{width} pixels; expected both sides >= 1")
    tp, f = proc.temporal_patch_size, proc.factor
    t = max(int(num_frames), tp)
    max_pixels = proc.max_pixels
    if proc.cap_pixels_per_frame:
        per_frame = max(min(proc.max_video_tokens * f * f, proc.max_pixels // t),
                        int(proc.min_pixels * 1.05))
        max_pixels = per_frame * t
    if height < f or width < f:
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    return _fit(height, width, f, proc.min_pixels, max_pixels, "frames", frames=t,
                patched_frames=round(t / tp) * tp)


def video_inputs(frames, proc: VideoProcessing = VideoProcessing()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(pixel_values_videos float32 [P, 3 * tp * p * p], video_grid_thw int64 [1, 3])`` of
    one video given as its sampled ``frames`` (uint8 ``[T, H, W, 3]``, or a list of frames of
    one size, in time order): every frame resized to :func:`video_smart_resize`'s size,
    rescaled and normalised, the last one repeated up to a multiple of
    ``temporal_patch_size``, and consecutive frames stacked into temporal patches, flattened
    patch by patch in merge-window order as ``Qwen3VLVideoProcessor.patchify`` lays them out.
    Raises ValueError naming the frame for a wrong dtype or shape."""
    seq = [np.asarray(x) for x in frames]
    if not seq:
        raise ValueError("frames is empty; expected at least one uint8 [H, W, 3] frame")
    for i, x in enumerate(seq):
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[-1] != 3 or x.shape != seq[0].shape:
            raise ValueError(f"frames[{i}] is {x.dtype} {x.shape}; expected uint8 [H, W, 3] "
                             f"of the first frame's size {seq[0].shape}")
    p, tp = proc.patch_size, proc.temporal_patch_size
    h, w = video_smart_resize(len(seq), *seq[0].shape[:2], proc)
    x = _patches(np.stack([_resized(f, h, w) for f in seq]), proc)
    return x, np.array([[-(-len(seq) // tp), h // p, w // p]], np.int64)


def frame_timestamps(indices, video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of each temporal patch of a video whose kept frames are ``indices`` of a
    source at ``video_fps``: the mean time of the patch's first and last frame, the last
    index repeated up to a multiple of ``temporal_patch_size`` (``Qwen3VLProcessor``'s
    timestamps)."""
    if not video_fps > 0:
        raise ValueError(f"video_fps={video_fps!r}; expected frames per second > 0")
    idx = [float(i) for i in np.asarray(indices).reshape(-1)]
    if not idx:
        raise ValueError("indices is empty; expected the kept frames' indices")
    idx += [idx[-1]] * (-len(idx) % temporal_patch_size)
    t = [i / video_fps for i in idx]
    return [(t[i] + t[i + temporal_patch_size - 1]) / 2
            for i in range(0, len(t), temporal_patch_size)]


def video_frame_tokens(video_grid_thw, merge_size: int) -> int:
    """Decoder tokens of each temporal patch of a video (one ``video_grid_thw`` row)."""
    g = np.asarray(video_grid_thw).reshape(-1)
    return int(g[1] * g[2]) // merge_size ** 2


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


def video_prompt(tokenizer, config: VLMConfig, timestamps: Sequence[float],
                 frame_tokens: int) -> list[int]:
    """Token ids of one video in the prompt: per temporal patch, its time as
    ``"<1.5 seconds>"``, then ``<|vision_start|>``, ``frame_tokens`` ``<|video_pad|>`` and
    ``<|vision_end|>`` (``Qwen3VLProcessor.replace_video_token``)."""
    ids = []
    for t in timestamps:
        ids += tokenizer.encode(f"<{t:.1f} seconds>")
        ids += [config.vision_start_token_id] + [config.video_token_id] * int(frame_tokens) + [
            config.vision_end_token_id]
    return ids


def choice_prompt(tokenizer, config: VLMConfig, image_tokens: Sequence[int], question: str,
                  options: Sequence[str], *, system: str | None = None,
                  video: tuple[Sequence[float], int] | None = None) -> list[int]:
    """Token ids of ``question`` with ``options`` over images of ``image_tokens`` decoder
    tokens each and, with ``video=(timestamps, frame_tokens)``, one video after them
    (:func:`video_prompt`), in Qwen3-VL's chat template, ending where the assistant's answer
    (the letter) begins. No system turn unless ``system`` is given (Qwen3-VL's template
    adds none by default)."""
    ids = []
    if system is not None:
        ids += tokenizer.encode(f"<|im_start|>system\n{system}")
        ids += [_special(tokenizer, "<|im_end|>")] + tokenizer.encode("\n")
    ids += tokenizer.encode("<|im_start|>user\n")
    for n in image_tokens:
        ids += [config.vision_start_token_id] + [config.image_token_id] * int(n) + [
            config.vision_end_token_id]
    if video is not None:
        ids += video_prompt(tokenizer, config, *video)
    ids += tokenizer.encode(question_text(question, options))
    ids += [_special(tokenizer, "<|im_end|>")] + tokenizer.encode("\n")
    ids += tokenizer.encode("<|im_start|>assistant\n")
    return ids
