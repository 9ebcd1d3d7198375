"""GUI-Libra: action-aware SFT and KL-constrained online RL for a GUI agent.

Run:
  python -m experiments.gui_libra --config=configs/gui_libra.py:default --workdir=/tmp/gui

The policies start from the zoo's ``lm-xs`` (its copy and recall circuits ground an
element's id) and are trained on the curated demonstrations of lab.methods.gui_libra's
synthetic GUI environment: three SFT arms (action-aware, no reweighting, long CoT only),
then two RL arms from the action-aware one (with and without success-adaptive scaling).
The trained policies are a lab.zoo bundle (cached; trained on first use). Presets:
``test`` (seconds), ``default`` (the report).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.init = "lm-xs"                 # the zoo model every policy starts from ("" = a fresh
    #                                  1-layer d=32 byte model, for the test preset)
    c.data = ml_collections.ConfigDict(dict(episodes=3000, p_wrong=0.15, p_mismatch=0.1,
                                            max_per_key=2))
    c.offline_episodes = 150         # noise-free held-out episodes: their states, offline
    c.online_episodes = 200          # fresh episodes played online per evaluation
    c.checkpoint_online = 64         # episodes per online evaluation at SFT/RL checkpoints
    c.sft = ml_collections.ConfigDict(dict(steps=800, batch=16, learning_rate=2e-3,
                                           warmup_steps=20, action_weight=3.0,
                                           checkpoints=3, seq_len=192, long_seq_len=320))
    c.rl = ml_collections.ConfigDict(dict(steps=40, prompts_per_step=16, group_size=8,
                                          episodes=16, learning_rate=3e-5, temperature=1.0,
                                          kl_coef=0.05, clip_eps=0.2, clip_eps_high=0.28,
                                          checkpoints=2))
    c.max_new = 56                   # completion budget in the short modes
    c.long_max_new = 144             # ... and with long CoT
    c.width = 144                    # prompt tokens (screens are at most ~130)
    if preset == "test":
        c.init = ""
        c.data.update(episodes=40)
        c.offline_episodes, c.online_episodes, c.checkpoint_online = 6, 6, 4
        c.sft.update(steps=4, batch=4, checkpoints=1, warmup_steps=1)
        c.rl.update(steps=2, prompts_per_step=2, group_size=2, episodes=2, checkpoints=1)
        c.max_new, c.long_max_new = 12, 16
    return c
