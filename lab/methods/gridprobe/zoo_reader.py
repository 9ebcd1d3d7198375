"""GridProbe's selector and QA models from the VLM zoo (``vlm-xs``, ``vlm-s``;
:mod:`lab.zoo.vlm`).

A :class:`ZooReader` gives a zoo VLM what GridProbe asks of a model: posteriors over a
question's options from a set of frames, frame and question embeddings (the similarity
baseline) and forward FLOPs. The zoo's prompt is ``<bos>`` and the question's words, per
frame ``<vision_start> <video> x n <vision_end>``, then ``<answer>``, each option scored by
its words (:func:`lab.zoo.vlm.posteriors`). As in :mod:`.models`, a set of ``m`` frames is
run as ``bucket(m)`` frame slots (the next power of two, at most the grid's ``N``), the
selected frames first in time order and empty canvases after (the zoo models are trained
on videos with blanked frames), so one program serves every ``m`` of a bucket; FLOPs are
counted for the ``m`` frames a method keeps (:func:`ZooReader.forward_flops`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from lab.methods.gridprobe import models
from lab.nn import VLM
from lab.nn.flops import vlm_config_flops
from lab.zoo import vlm as zv


@dataclasses.dataclass
class ZooReader:
    """A zoo VLM (``model``, ``tokenizer`` as :func:`lab.zoo.load` returns them) as
    GridProbe's selector or QA model. Questions and options are strings."""

    model: VLM
    tokenizer: zv.VLMTokenizer = zv.TOKENIZER
    question_len: int = 16   # :func:`lab.zoo.vlm.encode`'s budgets
    option_len: int = 5

    @property
    def config(self):
        return self.model.config

    def posteriors(self, videos: np.ndarray, masks: np.ndarray, questions, options, *,
                   chunk: int = 64) -> np.ndarray:
        """Posterior ``[B, n_options]`` of each question from its ``masks[b]`` frames of
        ``videos uint8 [B, N, H, W, 3]`` (grouped by :func:`.models.bucket` of the frame count;
        a row with no frame gets one empty canvas)."""
        masks = np.asarray(masks, bool)
        n = masks.shape[1]
        out = np.zeros((len(questions), len(options[0])), np.float32)
        counts = masks.sum(1)
        buckets = np.array([models.bucket(c, n) for c in counts])
        for s in sorted(set(buckets.tolist())):
            rows = np.flatnonzero(buckets == s)
            out[rows] = zv.posteriors(
                self.model, models.gather_frames(videos[rows], masks[rows], s, zv.BACKGROUND),
                [questions[i] for i in rows], [options[i] for i in rows],
                batch_size=chunk, tokenizer=self.tokenizer)
        return out

    def frame_embeddings(self, videos: np.ndarray, *, chunk: int = 64) -> np.ndarray:
        """Mean merged visual token of each frame, ``[B, N, D]`` (the decoder-input space)."""
        return models.frame_embeddings(self.model, videos, chunk=chunk, to_patches=zv.patchify)

    def question_embeddings(self, questions) -> np.ndarray:
        """Mean input embedding of each question's words, ``[B, D]``."""
        emb = np.asarray(self.model.language_model.embed(
            jax.numpy.arange(self.tokenizer.vocab_size)))
        return np.stack([emb[np.asarray(self.tokenizer.encode(q) or [self.tokenizer.unk_id])]
                         .mean(0) for q in questions])

    def vision_flops(self, frames: int, size: int) -> int:
        """FLOPs of the ViT alone over ``frames`` frames of ``size x size`` pixels (the
        similarity selector's frame embeddings)."""
        return int(vlm_config_flops(self.config, 1, frames, size, size, 0)["vision"])

    def forward_flops(self, frames: int, size: int, n_options: int) -> int:
        """FLOPs of one question answered from ``frames`` frames: the ViT over the frames,
        the decoder over their tokens, ``2 * frames`` vision markers, ``<bos>``, the
        question's ``question_len`` slots, ``<answer>`` and the options' words
        (:func:`lab.nn.flops.vlm_config_flops`). The question alone (``frames=0``) runs
        one blank frame, as :meth:`posteriors` does."""
        frames = max(frames, 1)
        text = 2 + self.question_len + 2 * frames + n_options * self.option_len
        return int(vlm_config_flops(self.config, 1, frames, size, size, text)["total"])

