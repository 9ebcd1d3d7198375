"""Training: SFT and policy-gradient losses, the Trainer loop, checkpoints (orbax)."""

from lab.train.checkpoint import RunCheckpoints, tree_digest
from lab.train.config import OPTIMIZERS, SCHEDULES, TrainConfig, make_optimizer, make_schedule
from lab.train.losses import (
    PolicyGradientLoss,
    group_advantages,
    kl_penalty,
    logprobs_from_logits,
    policy_gradient_loss,
    sft_loss,
    token_logprobs,
)
from lab.train.step import compiled_step
from lab.train.trainer import Trainer

__all__ = [
    "OPTIMIZERS", "SCHEDULES", "PolicyGradientLoss", "RunCheckpoints", "TrainConfig", "Trainer",
    "compiled_step",
    "group_advantages", "kl_penalty", "logprobs_from_logits", "make_optimizer", "make_schedule",
    "policy_gradient_loss", "sft_loss", "token_logprobs", "tree_digest",
]
