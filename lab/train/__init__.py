"""Training: SFT and policy-gradient losses, the Trainer loop, checkpoints (orbax), GRPO-style
RL (:mod:`lab.train.rl`) with a reward registry (:mod:`lab.train.rewards`)."""

from lab.train.checkpoint import RunCheckpoints, tree_digest
from lab.train.config import OPTIMIZERS, SCHEDULES, TrainConfig, make_optimizer, make_schedule
from lab.train.losses import (
    PolicyGradientLoss,
    dense_label_loss,
    group_advantages,
    kl_penalty,
    logprobs_from_logits,
    policy_gradient_loss,
    sft_loss,
    token_logprobs,
)
from lab.train.rl import (
    GRPOLoss,
    RLConfig,
    RLTrainer,
    SuccessScaling,
    adaptive_kl,
    grpo_advantages,
    rollout,
)
from lab.train.step import compiled_step
from lab.train.trainer import Trainer

__all__ = [
    "OPTIMIZERS", "SCHEDULES", "GRPOLoss", "PolicyGradientLoss", "RLConfig", "RLTrainer",
    "RunCheckpoints", "SuccessScaling", "TrainConfig", "Trainer", "adaptive_kl",
    "compiled_step", "grpo_advantages", "rollout",
    "dense_label_loss", "group_advantages", "kl_penalty", "logprobs_from_logits",
    "make_optimizer", "make_schedule", "policy_gradient_loss", "sft_loss", "token_logprobs",
    "tree_digest",
]
