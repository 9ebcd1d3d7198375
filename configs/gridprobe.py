"""GridProbe: answer-space frame selection by a K x K grid of probes with Shape-Adaptive
Selection, against monolithic, uniform, encoder-similarity and fixed-M selection.

Run:
  python -m experiments.gridprobe --config=configs/gridprobe.py:default --workdir=/tmp/gridprobe

The VLM zoo's two sizes (vlm-xs, vlm-s: lab.zoo.load), each used as selector and QA
model, and the small selector with the large QA model, on lab.data.video_qa's lookup
questions; accuracy and GFLOPs per selector, M_eff against the generator's difficulty.

The real path (a Qwen3-VL checkpoint on Video-MME records; an accelerator host):
  python -m experiments.gridprobe --config=configs/gridprobe.py:default \
    --config.model=/ckpt/Qwen3-VL-8B-Instruct --config.selector_model=/ckpt/Qwen3-VL-2B-Instruct \
    --config.records=videomme/test.parquet --config.frames_dir=videomme/frames \
    --workdir=/tmp/gridprobe_real
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
    c.confidence = "peak"        # a probe's confidence: peak (the paper's) | kl (from no frames)
    c.scale = 3.0                # c of the Shape-Adaptive rule
    c.m_min = 1
    c.m_max = 0                  # 0 = K^2
    c.data = ml_collections.ConfigDict(dict(
        frames=16, size=32, distractors=(0, 4), question_types="lookup", n_eval=200,
    ))
    c.small = "vlm-xs"           # zoo names (lab.zoo.list()): the selector and QA models
    c.large = "vlm-s"
    c.source = "auto"            # lab.zoo.load source: auto | shipped | cache | train
    c.chunk = 50                 # rows per forward (one compiled shape per frame bucket)
    # The real path: a Qwen3-VL directory as the QA model (and the selector, unless
    # selector_model names another), on Video-MME or LongVideoBench records over extracted
    # frames (lab.data.load_videomme / load_longvideobench); "" keeps the zoo models.
    c.model = ""
    c.selector_model = ""
    c.benchmark = "videomme"     # videomme | longvideobench
    c.records = ""               # the records file (.json, .jsonl or .parquet)
    c.frames_dir = ""            # one folder of frames per video
    c.qwen_input = "images"      # images | video: a question's frames as images or one video
    c.frames_fps = 1.0           # the extracted frames' rate: their timestamps in video mode
    if preset == "test":
        c.data.update(n_eval=8)
        c.chunk = 8
        # One model in both roles: the test checks the plumbing, and the second role then
        # reuses every program the first compiled.
        c.large = "vlm-xs"
    return c
