"""Chains of thought generated with their hidden-state trajectories.

:func:`trajectories` decodes each problem's chain with :func:`lab.infer.generate`
(``capture=("hidden",)``) and keeps the residual stream of the generated tokens at the
requested layers: step ``i`` of a trajectory is the state at the position whose logits
chose generated token ``i`` (the prompt's last token for ``i = 0``), for every token up
to and including the stop token. Rows are decoded in batches of one compiled shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from lab import infer


class Trajectories(NamedTuple):
    """What :func:`trajectories` returns (``N`` problems, ``T = max_new_tokens``).

    hidden:         ``[K, N, T, d]`` float32 residual stream at ``layers`` (0 = the
                    embeddings, ``l`` = block ``l``'s output; zero after the stop).
    layers:         the ``K`` layer indices of ``hidden``, non-negative.
    mask:           ``[N, T]`` bool, True for generated steps (stop token included).
    lengths:        ``[N]`` generated tokens per chain (stop token included).
    tokens:         ``[N, T]`` generated ids; logprobs: ``[N, T]`` their log-probabilities.
    texts:          the decoded completions, cut before the stop token.
    prompt_lengths: ``[N]`` prompt tokens (BOS included).
    """

    hidden: np.ndarray
    layers: tuple[int, ...]
    mask: np.ndarray
    lengths: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    texts: list[str]
    prompt_lengths: np.ndarray

    def at(self, layer: int) -> np.ndarray:
        """``[N, T, d]``: the trajectories at ``layer`` (one of :attr:`layers`)."""
        if layer not in self.layers:
            raise ValueError(f"layer={layer!r} was not captured; captured: {self.layers}")
        return self.hidden[self.layers.index(layer)]


def resolve_layers(layer, n_layers: int) -> tuple[int, ...]:
    """Layer indices in ``0..n_layers`` (0 = embeddings) from an int (negative counts from
    the last block), a sequence of them, or ``"all"``; ValueError for anything else."""
    if isinstance(layer, str):
        if layer != "all":
            raise ValueError(f"layer={layer!r}; expected an int, a list of ints or 'all'")
        return tuple(range(n_layers + 1))
    items = [layer] if isinstance(layer, (int, np.integer)) else list(layer)
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"layer={layer!r}; expected ints in [-{n_layers + 1}, {n_layers}]")
        i = int(item) + (n_layers + 1 if item < 0 else 0)
        if not 0 <= i <= n_layers:
            raise ValueError(f"layer={item} is outside the model's layers 0..{n_layers} "
                             f"(0 = embeddings, {n_layers} = last block; negative from the end)")
        if i not in out:
            out.append(i)
    if not out:
        raise ValueError("layer=[] names no layer")
    return tuple(out)


def _prompts(problems, prompt_key: str) -> list[str]:
    if isinstance(problems, str):
        raise ValueError("problems is one string; expected a list of prompts or of rows")
    rows = list(problems) if not hasattr(problems, "column_names") else None
    if rows is None:  # a datasets.Dataset
        if prompt_key not in problems.column_names:
            raise ValueError(f"problems have no column {prompt_key!r}; columns: "
                             f"{problems.column_names}")
        return list(problems[prompt_key])
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, str):
            out.append(r)
        elif isinstance(r, Mapping) and prompt_key in r:
            out.append(r[prompt_key])
        else:
            raise ValueError(f"problem {i} is {type(r).__name__} without a {prompt_key!r} "
                             "field; expected a prompt string or a row with one")
    if not out:
        raise ValueError("problems is empty")
    return out


def trajectories(model, problems: Sequence, *, tokenizer, layer="all",
                 max_new_tokens: int = 96, batch_size: int = 256, prompt_key: str = "prompt",
                 temperature: float = 0.0, seed: int = 0) -> Trajectories:
    """Generates a chain for each problem and captures its hidden-state trajectory.

    Args:
      model: a :class:`lab.nn.Transformer` (a reasoning zoo model, ``lab.zoo.load``, or a
        Hugging Face checkpoint, ``lab.zoo.load_model(dir)`` / ``lab.hf.load_pretrained``).
      problems: prompt strings, rows with a ``prompt_key`` field, or a Dataset.
      tokenizer: the model's tokenizer (prompts get BOS when it has one; EOS stops a chain).
      layer: which residual streams to keep: an int, ints, or ``"all"`` (0 = embeddings).
      max_new_tokens: the longest chain; batch_size: rows per generation call.
      temperature: 0 = greedy; otherwise sampled with ``seed`` (+ the batch index).

    Returns a :class:`Trajectories`. Raises ValueError for bad ``layer``, empty problems,
    or a prompt + ``max_new_tokens`` beyond the model's ``max_len``.
    """
    prompts = _prompts(problems, prompt_key)
    layers = resolve_layers(layer, model.config.n_layers)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected an int >= 1")
    add_bos = tokenizer.bos_id is not None
    ids = [tokenizer.encode(p, add_bos=add_bos) for p in prompts]
    width = max(len(x) for x in ids)
    if width + max_new_tokens > model.config.max_len:
        raise ValueError(f"the longest prompt ({width} tokens) + max_new_tokens={max_new_tokens} "
                         f"exceeds the model's max_len={model.config.max_len}")
    b = min(batch_size, len(ids))
    eos = () if tokenizer.eos_id is None else (int(tokenizer.eos_id),)
    hidden, toks, lps, lens = [], [], [], []
    for j, start in enumerate(range(0, len(ids), b)):
        chunk = ids[start:start + b]
        m = len(chunk)
        chunk = chunk + [chunk[0]] * (b - m)  # one compiled shape
        batch = np.full((b, width), tokenizer.pad_id, np.int32)
        for i, x in enumerate(chunk):
            batch[i, :len(x)] = x
        out = infer.generate(model, batch, lengths=np.array([len(x) for x in chunk], np.int32),
                             max_new_tokens=max_new_tokens, temperature=temperature,
                             stop_tokens=eos, seed=seed + j, pad_id=tokenizer.pad_id,
                             capture=("hidden",))
        hidden.append(np.asarray(out.hidden)[list(layers), :m].astype(np.float32))
        toks.append(np.asarray(out.tokens)[:m])
        lps.append(np.asarray(out.logprobs)[:m])
        lens.append(np.asarray(out.lengths)[:m])
    tokens, lengths = np.concatenate(toks), np.concatenate(lens).astype(np.int32)
    mask = np.arange(max_new_tokens)[None, :] < lengths[:, None]
    texts = []
    for row, n in zip(tokens, lengths, strict=True):
        row = row[:n].tolist()
        if eos and row and row[-1] == eos[0]:
            row = row[:-1]
        texts.append(tokenizer.decode(row))
    return Trajectories(np.concatenate(hidden, axis=1), layers, mask, lengths, tokens,
                        np.concatenate(lps) * mask, texts,
                        np.array([len(x) for x in ids], np.int32))
