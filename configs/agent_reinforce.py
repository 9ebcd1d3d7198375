"""Agent-REINFORCE: searching multi-LLM collaboration graphs under a FLOPs budget.

Run:
  python -m experiments.agent_reinforce --config=configs/agent_reinforce.py:default \
      --workdir=/tmp/agent_reinforce

A pool of reasoning-zoo models (lab.zoo ``cot-*``) solves multi-step two-digit arithmetic;
graphs of solvers, critics, refiners and aggregators are searched on a dev batch of hard
problems (4-5 steps) and scored on held-out ones. Presets: ``test`` (seconds), ``default``
(the report).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.pool = ("cot-xs", "cot-s", "cot-m")
    c.hard_steps = (4, 5)          # the searched task: chains of 4-5 steps, two-digit operands
    c.easy_steps = (2, 3)          # the easier level of the third insight
    c.n_dev = 64                   # problems the searches score graphs on
    c.n_test = 64                  # held-out problems for the graphs they return
    c.rows = 64                    # rows per LM call (one compiled shape)
    c.buckets = ((56, 72), (88, 40))   # generation shapes: (padded prompt width, new tokens)
    c.solver_temperature = 1.0
    c.refiner_temperature = 0.05
    c.budget = 200e6               # FLOPs per problem (about four cot-m chains)
    c.max_width = 4
    c.max_depth = 2
    c.n_graphs = 24                # graphs each search evaluates
    c.batch = 4                    # graphs per update
    c.seeds = 3
    c.agent_step = 1.0             # the analyst's step on the logits
    c.reinforce_lr = 4.0           # REINFORCE's step on the logits (rewards are in [0, 1])
    c.latency_weight = 0.1         # joint objective: accuracy - this * latency (s)
    c.sweep_width = 6              # the pilot grid: widths 1..this, depths 0..sweep_depth
    c.sweep_depth = 3
    if preset == "test":
        c.pool = ("cot-xs", "cot-s")
        c.n_dev = c.n_test = c.rows = 16
        c.buckets = ((56, 72),)
        c.budget = 60e6
        c.max_width, c.max_depth = 2, 1
        c.n_graphs, c.batch, c.seeds = 6, 3, 1
        c.sweep_width, c.sweep_depth = 2, 1
    return c
