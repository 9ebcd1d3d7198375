"""CARD's rewriter: an LM that reads a teacher trajectory and writes a teaching trajectory,
trained by GRPO-style RL (:class:`lab.train.rl.RLTrainer`) on two registered rewards:

* ``card_coherence``: :func:`lab.methods.card.coherence.coherence_reward` of the rewrite
  (failed and misleading steps penalised, the final answer must stay correct);
* ``card_alignment``: the student's mean per-token log-likelihood of the rewrite after the
  problem (distribution alignment), :func:`register_alignment` binds the student.

It starts from a copy-SFT model (trained to reproduce the trajectory it reads: the "no
rewriting" start) and RL keeps a KL penalty to it. The teacher is never resampled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from flax import nnx

from lab.infer import complete
from lab.methods.card.coherence import coherence_for_prompt
from lab.methods.card.student import mean_token_logprob, train_sft
from lab.nn import Transformer
from lab.train import rewards
from lab.train.rl import RLConfig, RLTrainer

MARK = "\nrewrite:\n"
ALIGN_FAILURE = -5.0  # the alignment reward of a rewrite the student cannot score (too long)


def prompt(problem: str, trajectory: str) -> str:
    """The rewriter's prompt: the problem, the teacher trajectory, then :data:`MARK`."""
    return f"{problem}{trajectory}{MARK}"


def widened(model, max_len: int):
    """A copy of a zoo ``model`` whose position budget is ``max_len`` (RoPE has no table,
    so the weights carry over unchanged): the rewriter's prompt holds a whole trajectory."""
    cfg = dataclasses.replace(model.config, max_len=max_len)
    out = Transformer(cfg, rngs=nnx.Rngs(0))
    nnx.update(out, nnx.state(model))
    return out


def copy_sft(model, tokenizer, rows: Sequence[dict], **kw):
    """SFT of ``model`` to write back the trajectory it reads (the no-rewriting start)."""
    pairs = [(prompt(r["problem"], r["teacher"]), r["teacher"]) for r in rows]
    return train_sft(model, tokenizer, pairs, **kw)


@rewards.register("card_coherence", failure=-1.0)
def card_coherence(prompts, completions, *, problem, **_) -> list[float]:
    """The coherence reward of each rewrite against its row's ``problem``."""
    return [coherence_for_prompt(c, p) for c, p in zip(completions, problem, strict=True)]


def register_alignment(student, tokenizer, seq_len: int, name: str = "card_alignment"):
    """Registers ``name``: the ``student``'s mean token log-prob of each rewrite after its
    row's ``problem`` (None, scored :data:`ALIGN_FAILURE`, when it does not fit)."""
    def fn(prompts, completions, *, problem, **_):
        return mean_token_logprob(student, tokenizer, list(problem), list(completions),
                                  seq_len=seq_len)
    rewards.register(name, failure=ALIGN_FAILURE)(fn)
    return name


def rl_rows(rows: Sequence[dict]) -> list[dict]:
    return [{"prompt": prompt(r["problem"], r["teacher"]), "problem": r["problem"],
             "answer": r["answer"]} for r in rows]


def train_rl(model, tokenizer, rows: Sequence[dict], *, steps: int, prompts_per_step: int,
             group_size: int, max_new_tokens: int, max_prompt_len: int,
             learning_rate: float, kl_coef: float, weights=(1.0, 1.0), seed: int = 0,
             alignment: str = "card_alignment"):
    """GRPO on the rewriter (KL to the model as given, the copy-SFT one); returns
    ``(model, history)``."""
    cfg = RLConfig(steps=steps, prompts_per_step=prompts_per_step, group_size=group_size,
                   max_new_tokens=max_new_tokens, temperature=1.0,
                   max_prompt_len=max_prompt_len, rewards=("card_coherence", alignment),
                   reward_weights=tuple(weights), kl_coef=kl_coef, kl_estimator="k3",
                   clip_eps=0.2, clip_eps_high=0.28, aggregation="token",
                   learning_rate=learning_rate, seed=seed, progress=False)
    trainer = RLTrainer(model, tokenizer, cfg)
    trainer.fit(rl_rows(rows))
    return model, trainer.history


def rewrite(model, tokenizer, rows: Sequence[dict], *, max_new_tokens: int,
            batch: int = 128) -> list[str]:
    """Greedy rewrites of each row's teacher trajectory."""
    return complete(model, tokenizer, [prompt(r["problem"], r["teacher"]) for r in rows],
                    max_new_tokens=max_new_tokens, batch=batch)


def reward_means(texts: Sequence[str], rows: Sequence[dict], student, tokenizer,
                 seq_len: int) -> dict:
    """Mean coherence and alignment rewards of ``texts`` (one per row), with per-row values
    for paired comparisons."""
    coh = [coherence_for_prompt(t, r["problem"]) for t, r in zip(texts, rows, strict=True)]
    al = mean_token_logprob(student, tokenizer, [r["problem"] for r in rows], list(texts),
                            seq_len=seq_len)
    al = [ALIGN_FAILURE if a is None else a for a in al]
    return {"coherence": float(np.mean(coh)), "alignment": float(np.mean(al)),
            "coherence_rows": coh, "alignment_rows": al}
