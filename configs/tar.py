"""TAR's VLM experiment: fine-tuning per task group and the multi-task ablation.

Run:
  python -m experiments.tar --config=configs/tar.py:default --workdir=/tmp/tar_vlm

Builds a synthetic TAR split in the public schema (lab.methods.tar.dataset), reads it back
with the loader, pretrains a small VLM (lab.methods.tar.vlm) on dense perception targets,
then fine-tunes it on the task groups added one by one (question answering; + temporal
reasoning; + scene understanding) and on every group with the frames blanked (the
no-video control), and scores every model and the shortcut baselines through the harness
(lab.methods.tar.predict / evaluate).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset

# The paper's ablation order: the task groups added one by one.
GROUP_ORDER = ("question_answering", "temporal_reasoning", "scene_understanding")


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.train_videos = 1000
    c.test_videos = 100
    c.n_frames = 48
    c.fps = 8.0
    c.groups = GROUP_ORDER
    # the model: temporal patches of two consecutive frames sampled evenly per video,
    # 8-pixel patches (one token each), its width and depth
    c.model = ml_collections.ConfigDict(dict(
        frames=8, patch_size=8, d_model=64, n_layers=3, vision_layers=2))
    # pretraining (what stands for a VLM's pretraining): dense perception targets only,
    # what the actor under each visual token is doing; no TAR question or answer
    c.pretrain = ml_collections.ConfigDict(dict(
        steps=1500, batch=16, learning_rate=2e-3, warmup=30, weight_decay=0.01))
    # fine-tuning of every run from the pretrained model: the same updates, batch and
    # schedule; the perception loss stays on at region_weight (off without the video)
    c.sft = ml_collections.ConfigDict(dict(
        steps=1000, batch=16, learning_rate=2e-3, warmup=30, weight_decay=0.01,
        region_weight=0.5))
    # every fine-tuning answer written after a short reasoning trace, <think> the event the
    # video shows (its mcq answer's option text) </think>, which the evaluator drops; and
    # mcq answered with the option's text, which the evaluator reads as its letter
    c.trace = True
    c.choice_text = True
    # a local Hugging Face BERT directory for BERTScore; "" = the ROUGE-L fallback
    c.scorer_dir = ""
    c.scorer_layers = 0  # 0 = the scorer's last layer
    c.cache = True  # load the fine-tuned models from lab's bundle store when present
    if preset == "test":
        c.train_videos = 10
        c.test_videos = 5
        c.model.update(frames=3, d_model=32, n_layers=1, vision_layers=1)
        c.pretrain.update(steps=2, batch=4, warmup=1)
        c.sft.update(steps=2, batch=4, warmup=1)
        c.cache = False
    elif preset == "paper":
        c.train_videos = 3000
        c.test_videos = 300
        c.pretrain.steps = 3000
        c.sft.steps = 2000
    return c
