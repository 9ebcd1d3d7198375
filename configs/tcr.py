"""TCR-Agent and TCR-Former on TempoCausal stories, beside the plain Transformer, the
Transformer with CoT, and shortcut baselines.

Run:
  python -m experiments.tcr --config=configs/tcr.py:default --workdir=/tmp/tcr

The three neural models share one Transformer size, the same training stories, steps,
batch and learning rate; TCR-Former adds the causal-topological layout and mask and
the learned temporal-span bias, the CoT model writes the chain of events its answer
follows from before the answer.
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0
    c.impl = ""  # attention: "" = automatic, or "xla" / "pallas"
    c.data = ml_collections.ConfigDict(dict(
        n_train=2000, n_eval=400, n_events=(5, 6), n_links=(5, 8), n_distractors=(0, 1),
        paraphrase=0.2,
    ))
    c.model = ml_collections.ConfigDict(dict(
        d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, span_clip=8,
    ))
    c.train = ml_collections.ConfigDict(dict(steps=250, batch=32, learning_rate=5e-3))
    c.cot_max_trace = 20  # greedy decoding budget of the CoT model before "A:"
    if preset == "test":
        c.data.update(n_train=48, n_eval=40, n_events=(5, 5), n_links=(5, 6), n_distractors=(1, 1),
                      paraphrase=0.3)
        c.model.update(d_model=16, n_layers=1, n_heads=2, head_dim=8, d_ff=32)
        c.train.update(steps=2, batch=8)
        c.cot_max_trace = 3
    elif preset == "paper":
        c.data.update(n_train=50_000, n_eval=5000, n_events=(6, 12), n_links=(7, 18))
        c.model.update(d_model=256, n_layers=6, n_heads=8, head_dim=32, d_ff=768)
        c.train.update(steps=20_000, batch=64, learning_rate=1e-3)
    return c
