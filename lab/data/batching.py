"""From a prompt/completion Dataset to the trainer's SFT batches.

The batch contract is ``lab.train.sft_loss``'s: ``{"inputs" [B, T] int32,
"targets" [B, T] int32, "mask" [B, T] float32}``, where ``targets`` is
``inputs`` shifted by one and ``mask`` is 1 exactly on the targets that
belong to the completion (and its EOS), so the loss is on the completion only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def encode_example(tokenizer, prompt: str, completion: str, *, add_bos: bool = True,
                   add_eos: bool = True) -> tuple[list[int], int]:
    """Returns ``(ids, n_prompt)``: BOS + prompt + completion (+ EOS), and the prompt's length."""
    p = tokenizer.encode(prompt, add_bos=add_bos)
    c = tokenizer.encode(completion, add_eos=add_eos)
    return p + c, len(p)


def encode_sft(dataset, tokenizer, seq_len: int, *, add_bos: bool = True,
               add_eos: bool = True, prompt_weight: float = 0.0) -> dict[str, np.ndarray]:
    """Tokenises every row once: ``{"inputs", "targets", "mask"}`` of shape ``[N, seq_len]``.

    ``dataset``: a ``datasets.Dataset`` with ``prompt`` and ``completion`` columns, or a
    sequence of mappings with those keys.

    With ``prompt_weight > 0`` the prompt's tokens are trained too: ``mask`` is 1
    on every real target and a ``"weights"`` array holds ``prompt_weight`` on the
    prompt's targets and 1 on the completion's (``lab.train.sft_loss`` multiplies
    the token losses by it). A little loss on the prompt adds signal when
    completions are a few tokens of a long prompt (Shi et al. 2024, "Instruction
    Tuning With Loss Over Instructions").

    Raises ValueError naming the first row whose tokens exceed ``seq_len + 1``
    (no silent truncation: a cut completion would teach the wrong answer).
    """
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len={seq_len!r}; expected a positive int")
    if hasattr(dataset, "column_names"):
        for col in ("prompt", "completion"):
            if col not in dataset.column_names:
                raise ValueError(f"dataset lacks the column {col!r}; has "
                                 f"{dataset.column_names}")
        prompts, completions = dataset["prompt"], dataset["completion"]
    else:
        rows = list(dataset)
        for i, r in enumerate(rows):
            if not all(k in r for k in ("prompt", "completion")):
                raise ValueError(f"row {i} has keys {sorted(r)}; expected 'prompt' and "
                                 "'completion'")
        prompts, completions = [r["prompt"] for r in rows], [r["completion"] for r in rows]
    n = len(prompts)
    if n == 0:
        raise ValueError("dataset is empty")
    inputs = np.full((n, seq_len), tokenizer.pad_id, np.int32)
    targets = np.full((n, seq_len), tokenizer.pad_id, np.int32)
    mask = np.zeros((n, seq_len), np.float32)
    if not isinstance(prompt_weight, (int, float)) or prompt_weight < 0:
        raise ValueError(f"prompt_weight={prompt_weight!r}; expected a number >= 0")
    weights = np.zeros((n, seq_len), np.float32) if prompt_weight > 0 else None
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids, n_prompt = encode_example(tokenizer, p, c, add_bos=add_bos, add_eos=add_eos)
        if len(ids) > seq_len + 1:
            raise ValueError(f"row {i} has {len(ids)} tokens > seq_len + 1 = {seq_len + 1}; "
                             "raise seq_len or shorten the task")
        t = len(ids) - 1
        inputs[i, :t] = ids[:-1]
        targets[i, :t] = ids[1:]
        mask[i, n_prompt - 1:t] = 1.0  # targets from the first completion token on
        if weights is not None:
            weights[i, :t] = prompt_weight
            weights[i, n_prompt - 1:t] = 1.0
            mask[i, :t] = 1.0
    out = {"inputs": inputs, "targets": targets, "mask": mask}
    if weights is not None:
        out["weights"] = weights
    return out


def step_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Row indices of batch ``step``: epoch ``e`` visits a permutation of the rows drawn
    from ``(seed, e)``, and batch ``step`` covers positions ``[step*B, (step+1)*B)`` of the
    concatenated epochs. A pure function of its arguments."""
    if step < 0:
        raise ValueError(f"step={step!r}; expected a non-negative int")
    pos = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, within = pos // n, pos % n
    out = np.empty_like(pos)
    for e in np.unique(epochs):
        perm = np.random.default_rng([seed, int(e)]).permutation(n)
        sel = epochs == e
        out[sel] = perm[within[sel]]
    return out


def sft_batches(dataset, tokenizer, batch_size: int, seq_len: int, seed: int = 0, *,
                add_bos: bool = True, add_eos: bool = True, prompt_weight: float = 0.0
                ) -> Callable[[int], dict[str, np.ndarray]]:
    """Returns ``batch_fn(step) -> {"inputs", "targets", "mask"}``, deterministic in ``step``.

    Rows are tokenised once (:func:`encode_sft`), then batch ``step`` is
    :func:`step_indices` of them, so a resumed run sees exactly the batches it
    would have seen. ``batch_fn.num_examples`` and ``batch_fn.arrays`` expose
    the tokenised data.
    """
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r}; expected a positive int")
    arrays = encode_sft(dataset, tokenizer, seq_len, add_bos=add_bos, add_eos=add_eos,
                        prompt_weight=prompt_weight)
    n = arrays["inputs"].shape[0]

    def batch_fn(step: int) -> dict[str, np.ndarray]:
        idx = step_indices(n, batch_size, int(step), seed)
        return {k: v[idx] for k, v in arrays.items()}

    batch_fn.num_examples = n
    batch_fn.arrays = arrays
    return batch_fn


def _pack_epoch(lengths: np.ndarray, seq_len: int, seed: int, epoch: int,
                window: int = 8) -> list[list[int]]:
    """Rows of example indices for one epoch: a seeded permutation packed first-fit.

    Each example goes into the first of the ``window`` most recently opened rows
    with room for it, else opens a new row (rows leave the window oldest first).
    """
    closed: list[list[int]] = []
    open_rows: list[tuple[list[int], int]] = []  # (indices, tokens used)
    for i in np.random.default_rng([seed, epoch]).permutation(len(lengths)):
        n = int(lengths[i])
        for j, (row, used) in enumerate(open_rows):
            if used + n <= seq_len:
                row.append(int(i))
                open_rows[j] = (row, used + n)
                break
        else:
            open_rows.append(([int(i)], n))
            if len(open_rows) > window:
                closed.append(open_rows.pop(0)[0])
    return closed + [row for row, _ in open_rows]


def packed_sft_batches(dataset, tokenizer, batch_size: int, seq_len: int, seed: int = 0, *,
                       add_bos: bool = True, add_eos: bool = True, prompt_weight: float = 0.0
                       ) -> Callable[[int], dict[str, np.ndarray]]:
    """Like :func:`sft_batches`, with several examples packed into each row.

    Each epoch packs a seeded permutation of the rows first-fit into rows of
    ``seq_len`` tokens (:func:`_pack_epoch`); batch ``step`` takes packed rows
    ``[step*B, (step+1)*B)`` of the concatenated epochs, so it is a pure
    function of ``step``. Besides ``inputs``, ``targets`` and ``mask`` the
    batch carries ``positions [B, T]`` (restarting at 0 in each example) and
    ``attention_mask [B, 1, T, T]`` (True where query and key belong to the
    same example), which ``lab.train.sft_loss`` passes to the model; causality
    comes from the positions. Every example thus sees exactly what it would
    see alone, while padding drops (on the zoo mixture rows are ~90% full, against ~42% unpacked).
    """
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r}; expected a positive int")
    arrays = encode_sft(dataset, tokenizer, seq_len, add_bos=add_bos, add_eos=add_eos,
                        prompt_weight=prompt_weight)
    lengths = (arrays["inputs"] != tokenizer.pad_id).sum(axis=1)
    # an input row is BOS + tokens, so its length is the count of non-pad inputs; pad ids
    # never occur inside an example (the tokenizer never produces them)
    epochs: list[list[list[int]]] = []
    starts = [0]  # global index of each epoch's first packed row

    def row_at(r: int) -> list[int]:
        while r >= starts[-1]:
            rows = _pack_epoch(lengths, seq_len, seed, len(epochs))
            epochs.append(rows)
            starts.append(starts[-1] + len(rows))
        e = int(np.searchsorted(starts, r, side="right")) - 1
        return epochs[e][r - starts[e]]

    def batch_fn(step: int) -> dict[str, np.ndarray]:
        if step < 0:
            raise ValueError(f"step={step!r}; expected a non-negative int")
        b, t = batch_size, seq_len
        out = {"inputs": np.full((b, t), tokenizer.pad_id, np.int32),
               "targets": np.full((b, t), tokenizer.pad_id, np.int32),
               "mask": np.zeros((b, t), np.float32),
               "positions": np.zeros((b, t), np.int32)}
        if "weights" in arrays:
            out["weights"] = np.zeros((b, t), np.float32)
        keys = [k for k in ("inputs", "targets", "mask", "weights") if k in arrays]
        segment = np.zeros((b, t), np.int32)  # 0 = padding
        for j in range(b):
            pos = 0
            for s, i in enumerate(row_at(int(step) * b + j), start=1):
                n = int(lengths[i])
                for k in keys:
                    out[k][j, pos:pos + n] = arrays[k][i, :n]
                out["positions"][j, pos:pos + n] = np.arange(n)
                segment[j, pos:pos + n] = s
                pos += n
        out["attention_mask"] = (segment[:, None, :, None] == segment[:, None, None, :])
        return out

    batch_fn.num_examples = len(lengths)
    batch_fn.arrays = arrays
    batch_fn.tokens_per_example = float(lengths.mean())
    return batch_fn
