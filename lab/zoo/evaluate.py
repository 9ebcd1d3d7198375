"""Per-task accuracy of a zoo model on prompt/completion data, by one teacher-forced pass.

``exact_match`` counts an example as solved when every completion token
(chain of thought, answer, EOS) is the model's argmax given the true prefix.
That is exactly the event that greedy decoding from the prompt reproduces
the completion token for token (each greedy step then sees the true
prefix), so it equals greedy-decoding accuracy with the whole chain required
to match, at the cost of one forward pass. ``answer_accuracy`` relaxes it to
the tokens of the final answer line given the true chain (teacher-forced):
for chain-of-thought tasks that is mostly copying the chain's last value, so
it is an upper bound, not a task accuracy; ``exact_match`` is the headline.
"""

from __future__ import annotations

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.data.batching import encode_example, encode_sft
from lab.data.synthetic.base import ANSWER_PREFIX


@nnx.jit
def _argmax_logits(model, inputs):
    return jnp.argmax(model(inputs), axis=-1)


def _answer_spans(dataset, tokenizer) -> np.ndarray:
    """Index of the first target position of the answer line, per row."""
    starts = []
    for p, c in zip(dataset["prompt"], dataset["completion"], strict=True):
        _, n_prompt = encode_example(tokenizer, p, c)
        head = c[: c.rfind(ANSWER_PREFIX)] if ANSWER_PREFIX in c else ""
        starts.append(n_prompt - 1 + len(tokenizer.encode(head)))
    return np.asarray(starts)


def evaluate(model, dataset, tokenizer, seq_len: int, batch_size: int = 32) -> dict:
    """Returns ``{task: {"exact_match", "answer_accuracy", "token_accuracy", "n"}}`` plus
    ``"all"`` (the mean over examples).

    ``dataset`` needs ``prompt``, ``completion`` and ``task`` columns; rows
    longer than ``seq_len + 1`` tokens raise ValueError (see
    :func:`lab.data.encode_sft`).
    """
    arrays = encode_sft(dataset, tokenizer, seq_len)
    n = arrays["inputs"].shape[0]
    correct = np.zeros((n, seq_len), bool)
    for i in range(0, n, batch_size):
        chunk = arrays["inputs"][i:i + batch_size]
        m = chunk.shape[0]
        if m < batch_size:  # keep one compiled shape
            fill = np.full((batch_size - m, seq_len), tokenizer.pad_id, np.int32)
            chunk = np.concatenate([chunk, fill])
        pred = np.asarray(jax.device_get(_argmax_logits(model, jnp.asarray(chunk))))[:m]
        correct[i:i + m] = pred == arrays["targets"][i:i + m]
    mask = arrays["mask"].astype(bool)
    answer_mask = mask & (np.arange(seq_len)[None, :] >= _answer_spans(dataset, tokenizer)[:, None])
    exact = np.all(correct | ~mask, axis=1)
    answer = np.all(correct | ~answer_mask, axis=1)
    token = (correct & mask).sum(1) / np.maximum(mask.sum(1), 1)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, task in enumerate(dataset["task"]):
        groups[task].append(i)
    out = {}
    for task, idx in sorted(groups.items()) + [("all", list(range(n)))]:
        idx = np.asarray(idx)
        out[task] = {"exact_match": float(exact[idx].mean()),
                     "answer_accuracy": float(answer[idx].mean()),
                     "token_accuracy": float(token[idx].mean()), "n": int(len(idx))}
    return out
