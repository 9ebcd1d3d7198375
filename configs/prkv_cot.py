"""PRKV in the chain-of-thought setting: the cache evicted while a reasoning model writes.

Run:
  python -m experiments.prkv_cot --config=configs/prkv_cot.py:default --workdir=/tmp/prkv_cot

A reasoning zoo model (``cot-s``, :mod:`lab.zoo`'s chain-of-thought solver of
multi-step arithmetic) answers held-out five-step problems by writing the chain
(``37+81=118;118+13=131;...``, about 60 tokens after a 21-token prompt) while
``lab.infer.generate(..., budget=, compress_every=)`` keeps its cache at a fixed
number of entries per KV head (kvpress's ``DecodingPress``). Presets: ``test``
(seconds: ``cot-xs``, 8 problems, two budgets), ``default``, ``paper`` (more
problems).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset

# StreamingLLM (the no-context baseline), kvpress's rules and PRKV.
POLICIES = ("streaming_llm", "random", "knorm", "tova", "snapkv", "h2o", "prkv")


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    test, paper = preset == "test", preset == "paper"
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 7                        # the held-out problems' seed
    c.model = "cot-xs" if test else "cot-s"

    c.task = ml_collections.ConfigDict()
    c.task.steps = 5                  # the longest chains the reasoning zoo was trained on
    c.task.digits = 2
    c.task.ops = "+-"
    c.task.n_problems = 8 if test else (256 if paper else 64)

    c.eval = ml_collections.ConfigDict()
    c.eval.max_new_tokens = 64        # a five-step chain and its answer are ~60 tokens
    c.eval.compress_every = 8         # new tokens between compressions
    c.eval.batch_size = 8 if test else 64
    # Entries kept per KV head while generating; the context reaches ~81 tokens.
    c.eval.budgets = (48, 32) if test else (64, 56, 48, 40, 32)
    c.policies = ("streaming_llm", "prkv") if test else POLICIES

    # PRKV's PageRank while decoding: iters power steps on the new tokens' graph
    # (lab.methods.prkv.decoding_scores; that graph is not triangular, no exact solve).
    c.prkv = ml_collections.ConfigDict()
    c.prkv.alpha = 0.85
    c.prkv.iters = 30
    c.prkv.graph = "group"

    c.claims = ml_collections.ConfigDict()
    c.claims.tolerance = 0.05         # "on par": within this accuracy of the best baseline
    # Regime: full-cache accuracy strictly inside this interval (solves some, not all).
    c.claims.full_range = (0.2, 0.9)
    # Regime: keeping the prompt matters: the prompt-plus-recent oracle beats StreamingLLM
    # (4 sinks + recent tokens) by at least this much at some budget.
    c.claims.prompt_gap = 0.2
    return c
