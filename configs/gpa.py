"""GPA: generative population annealing for regulatory DNA design.

Run:
  python -m experiments.gpa --config=configs/gpa.py:default --workdir=/tmp/gpa

Presets: ``test`` (seconds, used by the tests), ``default`` (minutes on a
two-core CPU: 64-bp sequences, 512 particles, every sampler at the same oracle
budget, a particle-scaling sweep 256..4096 on a capped schedule), ``paper`` (longer sequences,
larger generators and budgets; a GPU host).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.seq_len = 64
    c.n_train = 8000
    c.generator_steps = 600
    c.oracle_steps = 600
    c.d_model = 64
    c.n_layers = 2
    c.objective = "activity"  # activity | specificity | fidelity
    c.fidelity_weight = 0.5

    c.gpa = ml_collections.ConfigDict()
    c.gpa.num_particles = 512
    c.gpa.tau = 0.25
    c.gpa.target_ess = 0.5
    c.gpa.resample_threshold = 0.5
    c.gpa.scheme = "systematic"
    c.gpa.mutation_steps = 2
    c.gpa.final_steps = 2
    c.gpa.mh = True
    c.gpa.max_rounds = 40
    c.gpa.span_max = 16  # AR move: resample a span of 1..span_max bases starting anywhere
    c.gpa.n_mask = 6  # diffusion move: bases re-masked per proposal
    c.gpa.diffusion_steps = 16

    c.rl_group = 128
    c.rl_learning_rate = 1e-4
    c.rl_kl_coef = 0.05
    c.edit_learning_rate = 0.1
    c.scaling_particles = [256, 512, 1024, 2048, 4096]
    c.scaling_rounds = 3  # the scaling sweep's capped schedule (rounds at each size)
    # Objective variants rerun the whole comparison; the default runs specificity only
    # (time), the paper preset both.
    c.variant_objectives = ["specificity"]

    if preset == "test":  # the default's frozen models (shipped), tiny searches
        c.gpa.num_particles = 32
        c.gpa.max_rounds = 3
        c.gpa.mutation_steps = 1
        c.gpa.final_steps = 1
        c.gpa.span_max = 8
        c.gpa.n_mask = 4
        c.gpa.diffusion_steps = 4
        c.rl_group = 32
        c.scaling_particles = [32, 32]  # the main population's shapes: nothing new to compile
        c.scaling_rounds = 2
        c.variant_objectives = []
    elif preset == "paper":
        c.seq_len = 200
        c.n_train = 100_000
        c.generator_steps = 20_000
        c.oracle_steps = 10_000
        c.d_model = 256
        c.n_layers = 6
        c.gpa.num_particles = 4096
        c.gpa.span_max = 50
        c.gpa.n_mask = 20
        c.scaling_particles = [1024, 4096, 16384]
        c.scaling_rounds = 10
        c.variant_objectives = ["specificity", "fidelity"]
    return c
