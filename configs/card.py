"""CARD: teacher trajectories rewritten by an RL-trained rewriter, then distilled.

Run:
  python -m experiments.card --config=configs/card.py:default --workdir=/tmp/card

Teacher ``cot-m`` (sampled at temperature 1) and a scripted verbose solver write the raw
trajectories; the rewriter starts from ``cot-s`` (copy-SFT, then GRPO on the coherence and
alignment rewards); the student is ``cot-xs``, distilled on raw, filtered-correct and
rewritten trajectories. Presets: ``test`` (seconds), ``default`` (the report).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.student, c.teacher, c.rewriter = "cot-xs", "cot-m", "cot-s"
    c.in_domain = ml_collections.ConfigDict(dict(steps=(1, 3), digits=2))
    c.ood_steps = ml_collections.ConfigDict(dict(steps=(5, 6), digits=2))
    c.ood_digits = ml_collections.ConfigDict(dict(steps=(1, 2), digits=3))
    c.pool = 384                     # teacher problems (the rewriter's RL set too)
    c.sizes = (64, 256)              # distillation samples
    c.seeds = (0, 1)                 # distillation seeds
    c.n_eval = 150                   # problems per evaluation set
    c.n_rewriter_eval = 96           # held-out teacher trajectories the rewriter is scored on
    c.rewriter_len = 256             # the rewriter's position budget
    c.max_new = 96                   # rewrite / teacher budget
    c.student_new = 72               # the student's answer budget
    c.copy = ml_collections.ConfigDict(dict(steps=150, batch=32, learning_rate=1e-3))
    c.rl = ml_collections.ConfigDict(dict(steps=20, prompts_per_step=8, group_size=4,
                                          learning_rate=2e-5, kl_coef=0.02,
                                          coherence_weight=1.0, alignment_weight=1.0))
    c.distill = ml_collections.ConfigDict(dict(steps=60, batch=16, learning_rate=5e-4))
    if preset == "test":
        c.teacher, c.rewriter = "cot-xs", "cot-xs"
        c.pool, c.sizes, c.n_eval, c.n_rewriter_eval = 16, (8,), 8, 8
        c.seeds = (0,)  # one student per source: the plumbing, not the spread
        c.max_new, c.student_new, c.rewriter_len = 48, 40, 192
        c.copy.update(steps=2, batch=4)
        c.rl.update(steps=1, prompts_per_step=2, group_size=2)
        c.distill.update(steps=2, batch=4)
    return c
