"""GUI-Libra ("GUI-Libra: data-efficient post-training for reliable reasoning-and-acting in
native GUI agents"): a synthetic GUI environment, the demonstration-and-filtering data
pipeline, action-aware SFT and KL-constrained online RL with success-adaptive scaling.

- :mod:`lab.methods.gui_libra.env`: the environment (screens as element trees rendered to
  text and images, four long-horizon task types, several valid actions per step, the
  strict action grammar);
- :mod:`lab.methods.gui_libra.data`: noisy expert demonstrations with short and long
  reasoning, the consistency and redundancy filters, the curated ``datasets.Dataset``;
- :mod:`lab.methods.gui_libra.policy`: the language-model policy (reasoning-then-action,
  direct-action and long-CoT modes), action-aware token-weighted SFT, offline step and
  grounding accuracy, online task success, and the online source and ``gui_valid`` reward
  for :class:`lab.train.rl.RLTrainer`;
- :mod:`lab.methods.gui_libra.shortcuts`: heuristic policies scored in the environment.
"""

from lab.methods.gui_libra.data import (
    consistent,
    curate,
    demonstrations,
    long_reasoning,
    redundancy_key,
    short_reasoning,
    to_dataset,
)
from lab.methods.gui_libra.env import (
    ACTION_RE,
    TASKS,
    GuiEnv,
    completion_action,
    expert_plan,
    parse_action,
)
from lab.methods.gui_libra.policy import (
    MODES,
    as_actions,
    decisive_spans,
    encode_weighted,
    lm_policy,
    offline_eval,
    online_eval,
    online_source,
    rollouts,
    sft_examples,
    train_sft,
)
from lab.methods.gui_libra.shortcuts import (
    SHORTCUTS,
    is_well_formed,
    random_step_chance,
    shortcut_policy,
)

__all__ = [
    "ACTION_RE", "MODES", "SHORTCUTS", "TASKS", "GuiEnv", "as_actions", "completion_action",
    "consistent",
    "curate", "decisive_spans", "demonstrations", "encode_weighted", "expert_plan",
    "is_well_formed", "lm_policy", "long_reasoning", "offline_eval", "online_eval",
    "online_source", "parse_action", "random_step_chance", "redundancy_key", "rollouts",
    "sft_examples", "shortcut_policy", "short_reasoning", "to_dataset", "train_sft",
]
