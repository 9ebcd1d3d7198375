"""CARD (Cognition-Aligned Reasoning Distillation): teacher trajectories rewritten by an
RL-trained rewriter (distribution-alignment and logical-coherence rewards), then distilled
into a small student.

- :mod:`lab.methods.card.coherence`: the step executor and the coherence reward;
- :mod:`lab.methods.card.trajectories`: teacher trajectories (a zoo model sampled at
  temperature 1, a scripted verbose solver with detours and failed attempts);
- :mod:`lab.methods.card.rewriter`: the rewriter's prompt, copy-SFT start, registered
  rewards and GRPO training on :mod:`lab.train.rl`;
- :mod:`lab.methods.card.student`: generation, token-weighted SFT distillation, accuracy,
  the alignment log-likelihood and the shortcut answers.
"""

from lab.methods.card.coherence import (
    FLOOR,
    Execution,
    coherence_for_prompt,
    coherence_reward,
    execute,
    incoherent_fraction,
)
from lab.methods.card.rewriter import (
    copy_sft,
    register_alignment,
    reward_means,
    rewrite,
    train_rl,
    widened,
)
from lab.methods.card.student import (
    SHORTCUTS,
    accuracy,
    mean_token_logprob,
    shortcut_accuracy,
    shortcut_answers,
    train_sft,
)
from lab.methods.card.trajectories import problems, teacher_rows, verbose_solution

__all__ = ["FLOOR", "SHORTCUTS", "Execution", "accuracy", "coherence_for_prompt",
           "coherence_reward", "copy_sft", "execute",
           "incoherent_fraction", "mean_token_logprob", "problems", "register_alignment",
           "reward_means", "rewrite", "shortcut_accuracy", "shortcut_answers",
           "teacher_rows", "train_rl", "train_sft", "verbose_solution", "widened"]
