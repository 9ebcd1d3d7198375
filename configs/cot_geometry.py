"""CoT trajectory geometry: d_rho for easy vs hard problems, early features for correctness.

Run:
  python -m experiments.cot_geometry --config=configs/cot_geometry.py:default \
      --workdir=/tmp/cot_geometry
  # a Hugging Face checkpoint on a MATH500-format jsonl file:
  python -m experiments.cot_geometry --config=configs/cot_geometry.py:paper \
      --config.model=/path/to/Qwen3-0.6B --config.math500.path=/path/to/math500.jsonl \
      --workdir=/tmp/cot_geometry_math500

The reasoning zoo model ``cot-xs`` writes greedy chains for held-out arithmetic problems of
1-5 two-digit steps (the difficulty, by construction); its hidden states at every layer are
the trajectories. Presets: ``test`` (seconds, few problems), ``default`` (150 problems per
level), ``paper`` (MATH500 levels with a real checkpoint when ``math500.path`` is given).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    test, paper = preset == "test", preset == "paper"
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.model = "cot-xs"               # a zoo name or a Hugging Face checkpoint directory

    # arithmetic problems (lab.data.synthetic.arithmetic): level = number of steps
    c.task = ml_collections.ConfigDict()
    c.task.steps = [1, 5]
    c.task.digits = 2
    c.task.ops = "+-"
    c.task.n_per_level = 16 if test else (400 if paper else 150)
    c.task.exclude_training = not test  # held-out prompts only (one-step sums repeat)

    # the real path: a MATH500-format jsonl file (level 1-5 = difficulty)
    c.math500 = ml_collections.ConfigDict()
    c.math500.path = ""
    c.math500.template = "Problem: {problem}\nSolution:"
    c.math500.n_per_level = 0        # 0 = every problem
    c.math500.max_new_tokens = 1024  # a real model's chains are long

    # the groups compared and the transfer split (levels)
    c.easy_levels = [1, 2]
    c.hard_levels = [4, 5]
    c.transfer_source = [1, 2, 3]
    c.transfer_target = [4, 5]

    c.generation = ml_collections.ConfigDict()
    c.generation.max_new_tokens = 72 if test else 80   # arithmetic chains (math500: above)
    c.generation.batch_size = 80 if test else (16 if paper else 750)

    c.geometry = ml_collections.ConfigDict()
    c.geometry.layer = -1            # the layer the claims are decided on (-1 = last block)
    # the layers measured: "all" or comma-separated ints (0 = embeddings, negative from the
    # end); a real checkpoint's every layer over long chains does not fit in host memory
    c.geometry.layers = "0,-1" if paper else "all"
    c.geometry.rho = 0.9
    c.geometry.window = 8            # tokens per window of the length-controlled d_rho
    c.geometry.prefix = 0.2          # the early fraction of each chain
    c.geometry.min_prefix = 3        # at least this many early steps

    c.predictor = ml_collections.ConfigDict()
    # the paper's kinematic features: mean position, dispersion, initial state, mean
    # velocity, mean speed, speed dispersion
    c.predictor.features = ("mean_position,dispersion,initial_state,mean_velocity,"
                            "mean_speed,speed_dispersion")
    c.predictor.l2 = 0.01
    c.predictor.steps = 400
    c.predictor.learning_rate = 0.05
    c.predictor.test_fraction = 0.5

    c.plot_chains = 3                # chains of each group drawn in the 2-D projection
    return c
