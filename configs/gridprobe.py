"""GridProbe: answer-space frame selection by a K x K grid of probes with Shape-Adaptive
Selection, against monolithic, uniform, encoder-similarity and fixed-M selection.

Run:
  python -m experiments.gridprobe --config=configs/gridprobe.py:default --workdir=/tmp/gridprobe

Two small lab.nn.VLM sizes trained on lab.data.video_qa's lookup questions (cached through
lab.zoo.bundle), each used as selector and QA model, and the small selector with the large
QA model; accuracy and GFLOPs per selector, M_eff against the generator's difficulty.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.k = 4                      # grid side: N = K^2 frames sampled from each video
    c.rule = "shape"             # shape | participation | mean | otsu
    c.scale = 3.0                # c of the Shape-Adaptive rule
    c.m_min = 1
    c.m_max = 0                  # 0 = K^2
    c.data = ml_collections.ConfigDict(dict(
        frames=16, size=32, distractors=(0, 4), question_types="lookup", n_train=2000,
        n_eval=160,
    ))
    # the two VLM sizes (width, layers of both the ViT and the decoder)
    c.small = ml_collections.ConfigDict(dict(d_model=32, n_layers=1))
    c.large = ml_collections.ConfigDict(dict(d_model=64, n_layers=2))
    c.train = ml_collections.ConfigDict(dict(
        steps=800, batch=32, learning_rate=3e-3, evidence_prob=0.6, slots="1,1,4,4,16",
    ))
    c.source = "auto"            # lab.zoo.bundle source: auto | shipped | cache | train
    if preset == "test":
        c.data.update(n_train=64, n_eval=16)
        c.train.update(steps=3, batch=8, slots="4")
        # Both sizes one tiny shape: the test checks the plumbing, and the second model then
        # reuses every program the first compiled.
        c.large.update(d_model=32, n_layers=1)
    return c
