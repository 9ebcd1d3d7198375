"""Training and evaluation of the TCR models: next-token cross-entropy on the completion
(teacher forcing), answers read as the highest-scoring option token.

The plain baseline and TCR-Former read the question and write ``A: <answer>``; the CoT
baseline writes its reasoning trace first and is decoded greedily (its answer is the
best option token after the ``A:`` it wrote).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lab.methods.tcr.former import Encoded, TCRFormer, WordVocab


def _batch(enc: Encoded, idx, former: bool):
    out = {"tokens": jnp.asarray(enc.tokens[idx]), "weights": jnp.asarray(enc.weights[idx])}
    if former:
        out["mask"] = jnp.asarray(enc.mask[idx])
        out["buckets"] = jnp.asarray(enc.buckets[idx])
    return out


def _logits(model: TCRFormer, batch):
    return model(batch["tokens"], batch.get("mask"), batch.get("buckets"))


def loss_fn(model: TCRFormer, batch) -> jax.Array:
    """Mean cross-entropy of the weighted next-token targets."""
    logits = _logits(model, batch)[:, :-1]
    targets = batch["tokens"][:, 1:]
    w = batch["weights"][:, :-1]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


def fit(model: TCRFormer, enc: Encoded, *, steps: int, batch: int, learning_rate: float,
        seed: int, warmup: int = 20) -> list[float]:
    """AdamW with linear warm-up and cosine decay over ``steps`` minibatches drawn from
    ``enc``; returns the loss per step."""
    warm = min(warmup, steps // 2)
    sched = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warm, max(steps, warm + 1),
                                               learning_rate * 0.1)
    opt = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0),
                                           optax.adamw(sched, weight_decay=0.01)),
                        wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, b):
        loss, grads = nnx.value_and_grad(loss_fn)(model, b)
        opt.update(model, grads)
        return loss

    rng = np.random.default_rng([seed, 5])
    n = enc.tokens.shape[0]
    losses = []
    for _ in range(steps):
        idx = rng.choice(n, size=min(batch, n), replace=False)
        losses.append(float(step(model, opt, _batch(enc, idx, model.former))))
    return losses


@nnx.jit
def _forward(model, b):
    return _logits(model, b)


def _pick(logits_row: np.ndarray, options: np.ndarray) -> int:
    opts = options[options >= 0]
    return int(opts[int(np.argmax(logits_row[opts]))])


def predict(model: TCRFormer, enc: Encoded, *, batch: int = 128) -> np.ndarray:
    """The answer token each row's model picks among its options (teacher-forced prompt)."""
    out = []
    for s in range(0, enc.tokens.shape[0], batch):
        idx = np.arange(s, min(s + batch, enc.tokens.shape[0]))
        logits = np.asarray(_forward(model, _batch(enc, idx, model.former)))
        out += [_pick(logits[k, enc.answer_pos[i]], enc.options[i]) for k, i in enumerate(idx)]
    return np.array(out, np.int32)


def predict_cot(model: TCRFormer, enc: Encoded, vocab: WordVocab, *, max_trace: int = 20,
                batch: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decoding from each prompt until the model writes ``A:`` (or ``max_trace``
    tokens); returns the picked answer token (-1 when it never wrote ``A:``) and the number
    of tokens written before it."""
    a_id = vocab.ids["A:"]
    answers, lengths = [], []
    for s in range(0, enc.tokens.shape[0], batch):
        idx = np.arange(s, min(s + batch, enc.tokens.shape[0]))
        toks = np.zeros_like(enc.tokens[idx])
        cur = enc.prompt_len[idx].copy()
        for k, i in enumerate(idx):
            toks[k, :cur[k]] = enc.tokens[i, :cur[k]]
        done = np.zeros(len(idx), bool)
        ans = np.full(len(idx), -1, np.int32)
        written = np.zeros(len(idx), np.int32)
        for _ in range(max_trace + 1):
            logits = np.asarray(_forward(model, {"tokens": jnp.asarray(toks)}))
            rows = np.arange(len(idx))
            last = logits[rows, np.minimum(cur, toks.shape[1]) - 1]
            for k in rows[~done]:
                if toks[k, cur[k] - 1] == a_id:
                    ans[k] = _pick(last[k], enc.options[idx[k]])
                    done[k] = True
                elif cur[k] < toks.shape[1]:
                    toks[k, cur[k]] = int(np.argmax(last[k]))
                    written[k] += 1
                    cur[k] += 1
                else:
                    done[k] = True
            if done.all():
                break
        answers += list(ans)
        lengths += list(written)
    return np.array(answers, np.int32), np.array(lengths, np.int32)
