"""Geometric memorization: log-dimension memorisation of random bijections.

Run:
  python -m experiments.geomem --config=configs/geomem.py:default --workdir=/tmp/geomem

Presets: ``test`` (seconds, used by the tests), ``default`` (about three minutes on
one CPU core: construction at nine N from 16 to 4096, training at six N from 64 to 2048),
``paper`` (larger N, more relations, longer training; a GPU host).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.n_relations = 2
    c.target_accuracy = 0.99

    # Closed-form construction: subject dimension m searched on m_grid per N, the accuracy
    # at each m averaged over `seeds` draws (also for the multi-hop construction).
    c.construction = ml_collections.ConfigDict()
    c.construction.ns = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    c.construction.m_grid = list(range(4, 129, 2))
    c.construction.seeds = 3

    # Gradient-descent training of the one-layer model: bisection over d_grid at the
    # smallest N, then a walk from the previous N's answer (>= 5 N for the log-N fit).
    c.train = ml_collections.ConfigDict()
    c.train.ns = [64, 128, 256, 512, 1024, 2048]
    c.train.d_grid = [2, 3, 4, 5, 6, 8, 10, 12, 16]
    c.train.hidden_mult = 4
    c.train.steps = 2000
    c.train.segment = 250
    c.train.learning_rate = 1e-2
    c.train.batch_size = 512

    # Probes and transfer on a model trained to convergence (all probe.steps, weight
    # decay) at N = probe.n, width probe.d; the search's early-stopped models are probed too.
    c.probe = ml_collections.ConfigDict()
    c.probe.n = 1024
    c.probe.d = 16
    c.probe.steps = 2000
    c.probe.weight_decay = 0.1
    c.probe.transfer_steps = 500

    # Multi-hop: construction up to max_hops at n; training two-hop at train_n over d_grid,
    # both arms (one pass, CoT in the model) with at most `steps` Adam steps (at 2000 the CoT
    # arm stayed at 0.74 even at d=16; at 4000 it reaches 1.0 there: docs/geomem.md).
    c.multihop = ml_collections.ConfigDict()
    c.multihop.n = 1024
    c.multihop.max_hops = 3
    c.multihop.m_grid = list(range(4, 257, 4))
    c.multihop.train_n = 256
    c.multihop.d_grid = [6, 8, 12, 16]
    c.multihop.steps = 4000
    # Relations of the trained multi-hop facts: one pass superposes R^2 composites. With R = 2
    # (4 vs 2 terms) one pass is not width-bound at N=256 and both arms reach 0.99 at d=12;
    # with R = 3 (9 vs 3) it is (docs/geomem.md).
    c.multihop.train_relations = 3

    # Claim thresholds (stated in results.json next to each claim).
    c.claims = ml_collections.ConfigDict()
    c.claims.log_fit_r2 = 0.9
    c.claims.superposition_r2 = 0.9
    c.claims.gating_selectivity = 0.5
    c.claims.zero_shot_accuracy = 0.9
    c.claims.refit_margin = 0.1
    c.claims.min_n_values = 5      # N values every log-N fit needs
    c.claims.slope_level = 0.95    # t-interval of the log-N slope that must exclude 0
    c.claims.bound_ratio_spread = 2.0  # max/min of measured d / bound d ("up to a constant")
    c.claims.cot_growth = 1.5      # CoT d at max_hops / at one hop: "does not grow"
    # Regime: "near chance" is at most chance_factor / N; a random table's R^2 at most random_r2.
    c.claims.chance_factor = 5.0
    c.claims.random_r2 = 0.1
    c.claims.reads_emission = 0.5  # CoT answers follow a corrupted emission this often

    if preset == "test":
        c.construction.ns = [16, 32, 64, 128, 256]
        c.construction.m_grid = list(range(4, 65, 4))
        c.construction.seeds = 1
        c.train.ns = [16, 32, 64]  # plumbing only: the log-N rule needs >= 5 N
        c.train.d_grid = [2, 4, 8]
        c.train.steps = 600
        c.train.segment = 200
        c.train.learning_rate = 3e-2
        c.probe.n = 128
        c.probe.d = 8
        c.probe.steps = 400
        c.probe.transfer_steps = 200
        c.multihop.n = 128
        c.multihop.max_hops = 2
        c.multihop.m_grid = list(range(4, 129, 8))
        c.multihop.train_n = 32
        c.multihop.d_grid = [4, 8]
        c.multihop.steps = 600
    elif preset == "paper":
        c.n_relations = 4
        c.construction.ns = [256, 1024, 4096, 16384, 65536]
        c.construction.m_grid = list(range(8, 513, 4))
        c.train.ns = [256, 512, 1024, 2048, 4096, 8192, 16384]
        c.train.d_grid = [4, 6, 8, 12, 16, 24, 32, 48, 64]
        c.train.steps = 20000
        c.train.batch_size = 4096
        c.probe.n = 4096
        c.probe.d = 32
        c.probe.steps = 20000
        c.probe.transfer_steps = 2000
        c.multihop.n = 4096
        c.multihop.m_grid = list(range(8, 2049, 8))
        c.multihop.train_n = 1024
        c.multihop.d_grid = [8, 12, 16, 24, 32, 48]
        c.multihop.steps = 20000
        c.multihop.train_relations = 4
    return c
