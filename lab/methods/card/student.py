"""CARD's student side: generation, distillation by token-weighted SFT, answer accuracy,
the student's per-token log-likelihood of a trajectory (the distribution-alignment
reward), and the shortcut answers reported beside the student."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import infer
from lab.data.batching import encode_sft, step_indices
from lab.data.synthetic.arithmetic import parse_answer, parse_prompt
from lab.train import TrainConfig, Trainer, sft_loss
from lab.train.losses import token_logprobs


def train_sft(model, tokenizer, pairs: Sequence[tuple[str, str]], *, steps: int,
              batch_size: int, learning_rate: float, seq_len: int, seed: int = 0,
              warmup_steps: int = 5):
    """Token-weighted SFT (:func:`lab.train.sft_loss`, AdamW, cosine) of ``model`` on the
    pairs; returns ``(model, history)``."""
    arrays = encode_sft([{"prompt": p, "completion": c} for p, c in pairs], tokenizer,
                        seq_len)
    cfg = TrainConfig(steps=steps, learning_rate=learning_rate,
                      warmup_steps=min(warmup_steps, max(steps - 1, 0)), schedule="cosine",
                      seed=seed, progress=False)
    n = len(pairs)

    def batch_fn(step):
        idx = step_indices(n, batch_size, step, seed)
        return {k: v[idx] for k, v in arrays.items()}

    trainer = Trainer(model, sft_loss, cfg)
    return trainer.fit(batch_fn), trainer.history


def accuracy(model, tokenizer, rows: Sequence[dict], *, max_new_tokens: int,
             batch: int = 128) -> float:
    """Greedy answer accuracy on problem rows (``problem``, ``answer``)."""
    texts = infer.complete(model, tokenizer, [r["problem"] for r in rows],
                           max_new_tokens=max_new_tokens, batch=batch)
    return float(np.mean([parse_answer(t) is not None and str(parse_answer(t)) == r["answer"]
                          for t, r in zip(texts, rows, strict=True)]))


@nnx.jit
def _mean_logprob(model, inputs, targets, mask):
    lp = token_logprobs(model, inputs, targets)
    return jnp.sum(lp * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1.0)


def mean_token_logprob(model, tokenizer, prompts: Sequence[str], completions: Sequence[str],
                       *, seq_len: int, batch: int = 64) -> list[float | None]:
    """The student's mean per-token log-likelihood of each completion (and its EOS) after
    its prompt; None for a pair longer than ``seq_len`` tokens (it cannot be scored)."""
    out: list[float | None] = [None] * len(prompts)
    fits = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if len(tokenizer.encode(p, add_bos=True)) + len(tokenizer.encode(c)) + 1 <= seq_len + 1:
            fits.append(i)
    for s in range(0, len(fits), batch):
        sel = fits[s:s + batch]
        pairs = [(prompts[i], completions[i]) for i in sel]
        pairs += [pairs[-1]] * (batch - len(sel))
        a = encode_sft([{"prompt": p, "completion": c} for p, c in pairs], tokenizer, seq_len)
        v = np.asarray(_mean_logprob(model, jnp.asarray(a["inputs"]), jnp.asarray(a["targets"]),
                                     jnp.asarray(a["mask"])))
        for k, i in enumerate(sel):
            out[i] = float(v[k])
    return out


def _first(p):
    return parse_prompt(p)[0][0]


def _last(p):
    return parse_prompt(p)[0][-1]


def shortcut_answers(name: str, train_rows: Sequence[dict]) -> Callable[[str], int]:
    """A heuristic ``problem -> answer``: ``"majority"`` (the commonest training answer),
    ``"first"`` / ``"last"`` (the first / last operand)."""
    if name == "majority":
        top = int(Counter(r["answer"] for r in train_rows).most_common(1)[0][0])
        return lambda p: top
    if name == "first":
        return _first
    if name == "last":
        return _last
    raise ValueError(f"shortcut={name!r}; expected one of {SHORTCUTS}")


SHORTCUTS = ("majority", "first", "last")


def shortcut_accuracy(fn: Callable[[str], int], rows: Sequence[dict]) -> float:
    return float(np.mean([str(fn(r["problem"])) == r["answer"] for r in rows]))
