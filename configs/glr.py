"""GLR: latent budgets 0..L for GLR and Coconut beside explicit CoT and no CoT.

Run:
  python -m experiments.glr --config=configs/glr.py:default --workdir=/tmp/glr

The zoo's chain-of-thought model (``model``) is fine-tuned three ways for the same
number of updates on arithmetic chains of ``steps`` two-digit steps: GLR (transition
head, anchor + answer loss) and Coconut (last hidden state fed back) through the
curriculum stages 0..``steps`` (stage k replaces the first k chain steps by k latent
steps, ``stage_steps`` updates each), and no CoT (the answer right after the prompt,
``stage_steps * (steps + 1)`` updates). Each stage's model is evaluated at its budget.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.model = "cot-xs"        # a reasoning zoo model (lab.zoo)
    c.steps = 3               # chain steps per problem (two-digit operands, + and -)
    c.n_train = 4096          # training problems (none among the evaluation's)
    c.n_eval = 256            # held-out evaluation problems
    c.stage_steps = 40        # updates per curriculum stage (GLR and Coconut)
    c.batch_size = 32
    c.learning_rate = 3e-4
    c.warmup_steps = 10       # linear warm-up of each stage's learning rate
    c.anchor_weight = 1.0     # GLR's anchor loss weight
    c.margin = 0.25           # GLR's room to deviate: relative distance to the anchor
    c.head_hidden = 128       # TransitionHead width
    c.eval_batch = 128
    if preset == "test":
        c.steps = 2
        c.n_train = 64
        c.n_eval = 16
        c.stage_steps = 2
        c.batch_size = 8
        c.eval_batch = 16
        c.head_hidden = 32
        c.warmup_steps = 1
    elif preset == "paper":
        c.model = "cot-s"
        c.n_train = 20000
        c.n_eval = 1000
        c.stage_steps = 400
    return c
