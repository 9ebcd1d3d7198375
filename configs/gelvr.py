"""GeLVR / GePO: latent visual reasoning slots with geometry-consistent SFT and RL, against
answering directly, a text chain of thought, slots without the geometry loss, RL without
the regulariser and RL with a Gaussian policy.

Run:
  python -m experiments.gelvr --config=configs/gelvr.py:default --workdir=/tmp/gelvr

A zoo VLM (``model``) is fine-tuned by every variant on lab.data.image_qa (small targets
among lures) at two resolutions, half of each batch each; each seed repeats the whole
table. Presets: ``test`` (the plumbing, on ``vlm-test``), ``default`` (two seeds on
``vlm-xs``), ``paper`` (three seeds, longer runs).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.model = "vlm-xs"            # a lab.zoo VLM (lab.zoo.vlm.NAMED)
    c.source = "auto"             # lab.zoo source: auto | shipped | cache | train
    c.seeds = (0, 1)
    c.task = ml_collections.ConfigDict(dict(
        size=32, low_factor=2, object_size=(7, 9), distractors=6,
        question_types=("identify", "colour"), n_train=4000, n_eval=400))
    c.num_slots = 4               # latent slots between the image and <answer>
    c.sft = ml_collections.ConfigDict(dict(
        steps=200, batch=16, learning_rate=1e-3, geometry_coef=1.0, cot_weight=1.0,
        slot_coef=0.0))           # slot_coef > 0: both latent variants also align each slot
    c.rl = ml_collections.ConfigDict(dict(
        steps=60, prompts=4, group=4, learning_rate=3e-4, kappa=200.0, geometry_coef=1.0))
    if preset == "test":
        c.model = "vlm-test"
        c.task.update(size=16, object_size=(7, 7), distractors=1, n_train=64, n_eval=16)
        c.num_slots = 2
        c.sft.update(steps=2, batch=8)
        c.rl.update(steps=2, prompts=2, group=2)
    elif preset == "paper":
        c.seeds = (0, 1, 2)
        c.task.update(n_train=8000, n_eval=1000)
        c.sft.update(steps=600, batch=32)
        c.rl.update(steps=200, prompts=8)
    return c
