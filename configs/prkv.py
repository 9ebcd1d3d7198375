"""PRKV: KV-cache eviction by personalized PageRank vs kvpress's baselines.

Run:
  python -m experiments.prkv --config=configs/prkv.py:default --workdir=/tmp/prkv
  python -m experiments.prkv --config=configs/prkv.py:default --config.model=/path/to/qwen3 \
      --workdir=/tmp/prkv_hf

Presets: ``test`` (seconds: a tiny zoo LM, a few prompts, used by the tests),
``default`` (the named zoo LM ``lm-xs-long``: ``lm-xs``, trained once on Lab's
synthetic mixture, fine-tuned on these tasks at these lengths; both cached under
``LAB_CACHE``; every policy at every ratio), ``paper`` (the
larger ``lm-m``, longer contexts, more prompts; a GPU host).

``model``: a named zoo LM (``lab.zoo.list()``); empty = the zoo LM described by
``zoo`` (the test preset's); otherwise a Hugging Face checkpoint directory (a
Qwen3 model and its tokenizer, loaded by ``lab.hf``).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset

POLICIES = ["full", "random", "streaming_llm", "h2o", "snapkv", "tova", "knorm", "prkv"]


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.model = "lm-xs-long"  # a zoo name; "" = the zoo LM below; else a Hugging Face checkpoint dir

    # A custom zoo LM (used when model == ""), trained once on the tasks and cached.
    c.zoo = ml_collections.ConfigDict()
    c.zoo.name = "prkv-lm"
    c.zoo.d_model = 128
    c.zoo.n_layers = 2
    c.zoo.n_heads = 4
    c.zoo.n_kv_heads = 2
    c.zoo.d_ff = 256
    c.zoo.max_len = 512
    c.zoo.qk_smear = 5                # previous tokens mixed into q and k (lab.nn; 0 = off)
    c.zoo.steps = 450
    c.zoo.learning_rate = 3e-3
    c.zoo.batch_size = 8
    c.zoo.seq_len = 320
    c.zoo.n_train = 6000
    c.zoo.n_eval = 32
    c.zoo.prompt_weight = 0.0         # loss weight of prompt tokens (lab.zoo)

    # Tasks (lab.data.synthetic generators), the same for training and evaluation.
    c.tasks = ml_collections.ConfigDict()
    c.tasks.names = ["variable_tracking", "needle", "arithmetic"]
    c.tasks.context = [512, 960]       # characters = tokens (byte tokenizer); lm-xs-long's
    c.tasks.hops = [1, 3]
    c.tasks.n_chains = 3
    c.tasks.n_needles = 3
    c.tasks.arith_steps = [1, 3]
    c.tasks.arith_digits = 1
    c.tasks.eval_seed = 1234

    # Evaluation: greedy decoding after a compressed prefill, exact match of the answer.
    c.eval = ml_collections.ConfigDict()
    c.eval.n_per_task = 64
    c.eval.batch_size = 32              # prompts per generate call (greedy: each row its own)
    # The first batch's first prompts on which kept bytes, scoring time and compiled memory
    # are measured (per batch of this size).
    c.eval.cost_batch_size = 16
    c.eval.max_new_tokens = 40
    c.eval.policies = list(POLICIES)
    c.eval.ratios = [0.0, 0.25, 0.5, 0.75, 0.9]
    c.eval.window = 16                  # observation window of snapkv and prkv (kvpress: 64)
    c.eval.timing_repeats = 3

    # PRKV's scorer.
    c.prkv = ml_collections.ConfigDict()
    c.prkv.alpha = 0.85
    # "exact": the chain's fixed point by back-substitution (causal attention is triangular);
    # "power": iters power steps from the restart (iters also sets the decoding-time solve)
    c.prkv.solver = "exact"
    c.prkv.iters = 30
    c.prkv.graph = "group"              # "group": mean over a KV group's query heads; "head"
    c.prkv.n_sink = 0
    c.prkv.n_recent = 0
    # Average pooling of the scores over neighbouring positions, as SnapKV pools its own
    # (kvpress: kernel 5); 1 = off. With q/k smeared over 5 tokens (lm-xs) a fact spans a few
    # neighbouring keys, and pooling keeps them together (docs/zoo.md has the effect on
    # lm-xs-long). The ablation below reports PRKV with and without it.
    c.prkv.kernel_size = 5

    # PRKV ablation on one task: every (alpha, kernel_size) pair at the eval ratios. alpha
    # near 0 reduces PageRank to one hop from the window (SnapKV-like); 0.85 walks several.
    c.ablation = ml_collections.ConfigDict()
    c.ablation.task = "variable_tracking"   # "" = no ablation
    c.ablation.alphas = [0.3, 0.5, 0.85]
    c.ablation.kernel_sizes = [1, 5]
    # ... and the main (alpha, kernel) restarting on the question span (the prompt's last
    # line) instead of the last eval.window tokens.
    c.ablation.question_restart = True

    # Claim thresholds.
    c.claims = ml_collections.ConfigDict()
    c.claims.margin = 0.02
    c.claims.high_ratios = [0.75, 0.9]
    c.claims.multihop_task = "variable_tracking"
    c.claims.solved_accuracy = 0.5
    # "Low end-to-end overhead": PRKV's generate (prefill, captures, scoring, decoding) at most
    # this many times the full cache's, stated before any run.
    c.claims.max_overhead = 1.1

    if preset == "test":
        c.model = ""
        c.zoo.name = "prkv-test"
        c.zoo.d_model = 32
        c.zoo.n_layers = 1
        c.zoo.n_heads = 2
        c.zoo.n_kv_heads = 1
        c.zoo.d_ff = 64
        c.zoo.max_len = 256
        c.zoo.steps = 4
        c.zoo.batch_size = 4
        c.zoo.seq_len = 160
        c.zoo.n_train = 64
        c.zoo.n_eval = 2
        c.tasks.context = [96, 112]
        c.tasks.hops = [1, 2]
        c.tasks.n_chains = 2
        c.tasks.n_needles = 2
        c.eval.n_per_task = 2
        c.eval.batch_size = 2
        c.eval.cost_batch_size = 2
        c.eval.max_new_tokens = 8
        c.eval.ratios = [0.0, 0.75]
        c.eval.policies = ["full", "streaming_llm", "prkv"]
        c.eval.window = 8
        c.eval.timing_repeats = 1
        c.prkv.iters = 10
        c.prkv.kernel_size = 3
        c.ablation.alphas = [0.5, 0.85]
        c.ablation.kernel_sizes = [1, 3]
    elif preset == "paper":
        c.model = "lm-m"
        c.tasks.context = [512, 2048]
        c.tasks.hops = [1, 4]
        c.tasks.n_chains = 4
        c.tasks.n_needles = 4
        c.eval.n_per_task = 200
        c.eval.window = 64
        c.prkv.iters = 50
    return c
