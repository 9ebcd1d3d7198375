"""Text in, text out: prompts encoded and right-padded for :func:`lab.infer.generate`, and
batched completions decoded back to strings.

``complete`` pads every batch to one shape (the last batch repeats its last prompt), so
one compiled program serves every call of a given width and batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np


def encode_prompts(tokenizer, prompts: Sequence[str], width: int | None, add_bos: bool = True,
                   *, name: str = "width") -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ``(ids int32 [N, width], lengths int32 [N])`` of the prompts (``width``
    None: the longest prompt's); raises ValueError naming the first prompt longer than
    ``width`` and the setting ``name`` that sets it."""
    ids = [tokenizer.encode(p, add_bos=add_bos) for p in prompts]
    width = max(len(x) for x in ids) if width is None else width
    out = np.full((len(ids), width), tokenizer.pad_id, np.int32)
    for i, x in enumerate(ids):
        if len(x) > width:
            raise ValueError(f"prompt {i} has {len(x)} tokens > {name}={width}; raise {name}")
        out[i, :len(x)] = x
    return out, np.array([len(x) for x in ids], np.int32)


def complete(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int,
             width: int | None = None, batch: int = 64, temperature: float = 0.0,
             seed: int = 0) -> list[str]:
    """One completion per prompt (BOS + prompt, right-padded to ``width``, default the
    longest prompt), greedy at ``temperature=0``, in batches of ``batch`` rows (batch ``j``
    samples with ``seed + j``), cut at EOS and decoded."""
    from lab.infer.engine import generate

    prompts = list(prompts)
    if not prompts:
        return []
    if width is None:
        width = max(len(tokenizer.encode(p, add_bos=True)) for p in prompts)
    texts = []
    for j, i in enumerate(range(0, len(prompts), batch)):
        chunk = prompts[i:i + batch]
        m = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch - m)
        ids, lens = encode_prompts(tokenizer, chunk, width)
        kw = {} if temperature == 0 else {"temperature": float(temperature)}
        out = generate(model, ids, lengths=lens, max_new_tokens=max_new_tokens,
                       stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id,
                       seed=seed + j, **kw)
        toks, n = (np.asarray(x) for x in jax.device_get((out.tokens, out.lengths)))
        texts += [tokenizer.decode(toks[k, :n[k]]) for k in range(m)]
    return texts
