"""GUI-Libra ("GUI-Libra: data-efficient post-training for reliable reasoning-and-acting in
native GUI agents"): the synthetic GUI environment and the demonstration-and-filtering data
pipeline. The action-aware SFT and KL-constrained online RL parts are not built yet.

- :mod:`lab.methods.gui_libra.env`: the environment (screens as element trees rendered to
  text and images, four long-horizon task types, several valid actions per step, the
  strict action grammar);
- :mod:`lab.methods.gui_libra.data`: noisy expert demonstrations with short and long
  reasoning, the consistency and redundancy filters, the curated ``datasets.Dataset``;
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
from lab.methods.gui_libra.shortcuts import (
    SHORTCUTS,
    is_well_formed,
    random_step_chance,
    shortcut_policy,
)

__all__ = [
    "ACTION_RE", "SHORTCUTS", "TASKS", "GuiEnv", "completion_action", "consistent", "curate",
    "demonstrations", "expert_plan", "is_well_formed", "long_reasoning", "parse_action",
    "random_step_chance", "redundancy_key", "shortcut_policy", "short_reasoning",
    "to_dataset",
]
