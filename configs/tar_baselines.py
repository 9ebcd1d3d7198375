"""TAR tooling end to end: shortcut baselines and a frame tracker on a synthetic split.

Run:
  python -m experiments.tar_baselines --config=configs/tar_baselines.py:default --workdir=/tmp/tar

Generates seeded synthetic traffic videos (lab.methods.tar.synthetic), auto-labels every
task type (lab.methods.tar.labels), writes them in the public TAR schema, reads them back
with the loader, runs each predictor through lab.methods.tar.harness and scores it with
the per-task evaluators; a submission CSV is written and read back for each predictor.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.train_videos = 150
    c.test_videos = 100
    c.n_frames = 48
    c.fps = 8.0
    # a local Hugging Face BERT directory for BERTScore; "" = the ROUGE-L fallback
    c.scorer_dir = ""
    c.scorer_layers = 0  # 0 = the scorer's last layer
    if preset == "test":
        c.train_videos = 25
        c.test_videos = 15
    elif preset == "paper":
        c.train_videos = 1000
        c.test_videos = 500
    return c
