"""HUMOR: reward models within template groups, hierarchical multi-path generation and
group-wise RL on synthetic memes.

Run:
  python -m experiments.humor --config=configs/humor.py:default --workdir=/tmp/humor

A perception VLM (lab.methods.humor.perception, cached in the zoo) reads each meme image's
scene and intent; pairwise (Bradley-Terry) and pointwise reward heads on its features are
trained on noisy in-group labels at several noise levels and seeds; a tiny byte LM policy
is SFT-trained on CoT traced back from the ground-truth captions (multi-path and
single-path), then the multi-path policy is RL-trained on lab.train.rl with the BT reward
model's reward normalised within template groups. Presets: ``test`` (seconds),
``default`` (the report).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.perception = ml_collections.ConfigDict(dict(colour_steps=300, steps=1000, d_model=32,
                                                  n_eval=128))
    c.data = ml_collections.ConfigDict(dict(n_train=300, n_val=100, n_test=200, n_captions=6))
    c.noise_levels = (0.0, 0.2, 0.35)    # label-flip probabilities of the RM comparison
    c.seeds = (0, 1)                     # data and RM seeds of the RM comparison
    c.rm = ml_collections.ConfigDict(dict(steps=400, learning_rate=3e-3, hidden=64,
                                          eval_every=25))
    c.policy = ml_collections.ConfigDict(dict(d_model=64, n_layers=2, n_heads=4, d_ff=256))
    c.sft = ml_collections.ConfigDict(dict(steps=1000, batch=32, learning_rate=3e-3,
                                           warmup_steps=20, seq_len=128, n_paths=3,
                                           noise=0.2))
    c.rl = ml_collections.ConfigDict(dict(steps=30, prompts_per_step=8, group_size=8,
                                          learning_rate=1e-4, temperature=1.0, kl_coef=0.05,
                                          clip_eps=0.2, reward_clip=2.0))
    c.diversity = ml_collections.ConfigDict(dict(samples=8, temperature=1.0))
    c.max_new = 100                      # completion budget (a 3-path hierarchy is ~90 bytes)
    c.width = 32                         # prompt tokens (the prompts are at most 30)
    if preset == "test":
        c.perception.update(colour_steps=0, steps=10, n_eval=16)
        c.seeds = (0,)
        c.data.update(n_train=32, n_val=16, n_test=16, n_captions=4)
        c.noise_levels = (0.0, 0.3)
        c.rm.update(steps=20, eval_every=10)
        c.policy.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
        c.sft.update(steps=4, batch=4, warmup_steps=1)
        c.rl.update(steps=2, prompts_per_step=2, group_size=2)
        c.diversity.samples = 2
    return c
