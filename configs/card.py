"""CARD: teacher trajectories rewritten by an RL-trained rewriter, then distilled.

Run:
  python -m experiments.card --config=configs/card.py:default --workdir=/tmp/card

Teacher ``cot-m`` (sampled at temperature 0.5) and a scripted verbose solver write the raw
trajectories; the rewriter starts from ``lm-xs`` (copy-SFT, then GRPO on the coherence and
alignment rewards); the student is ``cot-xs``, distilled on raw, filtered-correct and
rewritten trajectories of 1-3 steps and evaluated on them and on longer chains (4-5
steps). Presets: ``test`` (seconds), ``default`` (the report).

The rewriter is ``lm-xs``, not a reasoning model: its copy-first stage (and q/k smearing)
gave it the induction circuit that writing back the trajectory it reads needs. The second
evaluation set stays within the student's reach (``cot-xs`` cannot solve chains of 6 or
more steps, nor one- or three-digit operands). docs/card.md has the measurements behind
each default.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.student, c.teacher, c.rewriter = "cot-xs", "cot-m", "lm-xs"
    c.in_domain = ml_collections.ConfigDict(dict(steps=(1, 3), digits=2))
    c.longer = ml_collections.ConfigDict(dict(steps=(4, 5), digits=2))  # beyond the data
    # The teacher is a strong solver with verbose trajectories: cot-m at temperature 0.5 and
    # a scripted solver whose failed attempts (p_fail) and detours (p_detour) are corrected
    # or harmless, and whose answers are wrong only by p_uncorrected per step.
    c.teacher_temperature = 0.5      # the teacher model's sampling temperature
    c.verbose = ml_collections.ConfigDict(dict(p_fail=0.3, p_detour=0.25, p_uncorrected=0.03))
    c.pool = 384                     # teacher problems (the rewriter's RL set too)
    c.sizes = (64, 256)              # distillation samples
    c.seeds = (0, 1)                 # distillation seeds
    c.n_eval = 150                   # problems per evaluation set
    c.n_rewriter_eval = 96           # held-out teacher trajectories the rewriter is scored on
    c.rewriter_len = 256             # the rewriter's position budget
    c.max_new = 96                   # rewrite / teacher budget
    c.student_new = 72               # the student's answer budget
    # the copy start (a lab.zoo.bundle entry): long enough to reproduce most trajectories
    c.copy = ml_collections.ConfigDict(dict(steps=400, batch=32, learning_rate=1e-3))
    # the regime checks that RL changes the rewrites; 150 steps, not 60, by a rule fixed
    # before a third seed's runs (docs/card.md): at 60 steps seed 2's RL left 98% of the
    # rewrites unchanged
    c.rl = ml_collections.ConfigDict(dict(steps=150, prompts_per_step=8, group_size=4,
                                          learning_rate=1e-4, kl_coef=0.02,
                                          coherence_weight=1.0, alignment_weight=1.0))
    # the regime checks that distilling on gold chains does not damage the student
    c.distill = ml_collections.ConfigDict(dict(steps=60, batch=16, learning_rate=1e-4))
    if preset == "test":
        c.teacher, c.rewriter = "cot-xs", "cot-xs"
        c.pool, c.sizes, c.n_eval, c.n_rewriter_eval = 16, (8,), 8, 8
        c.seeds = (0,)  # one student per source: the plumbing, not the spread
        c.max_new, c.student_new, c.rewriter_len = 48, 40, 192
        c.copy.update(steps=2, batch=4)
        c.rl.update(steps=1, prompts_per_step=2, group_size=2)
        c.distill.update(steps=2, batch=4)
    return c
