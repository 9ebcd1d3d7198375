"""Jitted prefill, generate and score on :class:`lab.nn.Transformer`.

Each entry point splits the model once (``nnx.split``) and calls a module-level
``jax.jit`` of a pure function of the state, with the graph definition, the
policy and every shape-determining argument static, so repeated calls with the
same shapes reuse the compiled program (flax ``guides/performance.md``).
Prefill, the cache policy and the whole decode loop (``lax.while_loop``) run
inside one program.

Batches are right-padded: ``tokens [B, T]`` with ``lengths [B]`` (or a list of
lists of ids). Row ``b``'s prompt occupies cache slots ``0..lengths[b]-1`` at
positions ``0..lengths[b]-1``; padding is written as empty slots (position -1)
and never attended; the ``i``-th new token of row ``b`` sits at position
``lengths[b] + i``, whatever the cache policy kept.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.infer import decode, sampling
from lab.infer import policies as policies_lib
from lab.nn import KVCache, Transformer, check_tokens

GENERATE_CAPTURES = ("hidden", "last_hidden")


class Generation(NamedTuple):
    """What :func:`generate` returns.

    tokens:   ``[B, N]`` int32 generated ids (``N = max_new_tokens``); after a
              row's stop token (which is included) the row holds ``pad_id``.
    logprobs: ``[B, N]`` float32 log-probability of each chosen token under the
              model's untempered distribution (0 after the stop).
    hidden:   None unless asked: with ``capture=("hidden",)`` ``[L+1, B, N, D]``,
              the residual stream (embeddings, then every block's output, before
              the final norm) at the position whose logits chose token ``i``;
              with ``capture=("last_hidden",)`` ``[B, N, D]``, the last block's
              output only. Zero after the stop.
    lengths:  ``[B]`` int32 number of generated tokens per row (stop token included).
    """

    tokens: jax.Array
    logprobs: jax.Array
    hidden: jax.Array | None
    lengths: jax.Array


def as_batch(tokens, lengths=None, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ``(tokens [B, T] int32, lengths [B] int32)`` from either a list of
    lists of ids, a ``[B, T]`` array (with optional ``lengths``) or a ``[T]`` array."""
    if isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], (list, tuple)):
        if lengths is not None:
            raise ValueError("lengths is implied by a list of lists of ids; do not pass it")
        rows = [list(r) for r in tokens]
        lens = np.array([len(r) for r in rows], np.int32)
        out = np.full((len(rows), max(int(lens.max()), 1)), pad_id, np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        tokens, lengths = out, lens
    arr = np.asarray(tokens)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"tokens has shape {arr.shape}; expected [B, T] with B >= 1")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be integer token ids, got dtype {arr.dtype}")
    b, t = arr.shape
    lens = np.full((b,), t, np.int32) if lengths is None else np.asarray(lengths)
    if lens.shape != (b,) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(f"lengths has shape {lens.shape} dtype {lens.dtype}; expected [{b}] ints")
    if lens.min() < 1 or lens.max() > t:
        raise ValueError(f"lengths={lens.tolist()}; expected every prompt length in [1, {t}]")
    return arr.astype(np.int32), lens.astype(np.int32)


class _Plan(NamedTuple):
    tokens: np.ndarray
    lengths: np.ndarray
    policy: policies_lib.Policy
    budget: np.ndarray
    capacity: int
    window: int
    kwargs: tuple
    question_lengths: np.ndarray


def _plan(model: Transformer, tokens, lengths, pad_id, policy, ratio, capacity, max_new,
          policy_kwargs, question_lengths=None) -> _Plan:
    """Validates the request on host and sizes the cache."""
    cfg = model.config
    tokens, lengths = as_batch(tokens, lengths, pad_id)
    check_tokens(tokens, cfg.vocab_size)
    if not isinstance(pad_id, int) or not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(f"pad_id={pad_id!r}; expected an id in [0, {cfg.vocab_size})")
    pol = policies_lib.get(policy)
    kept = policies_lib.budgets(lengths, ratio)
    evicts = pol.evicts and ratio > 0
    budget = np.array(kept if evicts else lengths, np.int32)
    longest = int(lengths.max())
    if longest + max_new > cfg.max_len:
        raise ValueError(f"prompt length {longest} + max_new_tokens {max_new} = "
                         f"{longest + max_new} exceeds TransformerConfig.max_len={cfg.max_len}")
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"padded prompt length {tokens.shape[1]} exceeds "
                         f"TransformerConfig.max_len={cfg.max_len}")
    need = int(budget.max()) + max_new
    if capacity is None:
        capacity = need
    elif not isinstance(capacity, int) or capacity < need:
        raise ValueError(f"capacity={capacity!r} is below the {need} cache slots needed "
                         f"(kept prompt entries {int(budget.max())} + max_new_tokens {max_new})")
    kwargs = dict(policy_kwargs)
    window = int(kwargs.pop("window", pol.window))
    if question_lengths is None:
        qlens = np.full(lengths.shape, window, np.int32)
    else:
        qlens = np.asarray(question_lengths)
        if qlens.shape != lengths.shape or not np.issubdtype(qlens.dtype, np.integer):
            raise ValueError(f"question_lengths has shape {qlens.shape} dtype {qlens.dtype}; "
                             f"expected {list(lengths.shape)} ints")
        observed = evicts and "queries" in pol.needs  # the policy reads the window's queries
        if qlens.min() < 1 or np.any(qlens > lengths) or (observed and qlens.max() > window):
            raise ValueError(f"question_lengths={qlens.tolist()}; expected each in [1, the "
                             f"row's prompt length {lengths.tolist()}]"
                             + (f" and at most window={window} (pass a larger window=)"
                                if observed else ""))
    return _Plan(tokens, lengths, pol if evicts else None, budget, capacity, window,
                 tuple(sorted(kwargs.items())), qlens.astype(np.int32))


def _window_queries(model: Transformer, hidden, lengths, window: int, qlens=None):
    """Queries after smear, q-norm and RoPE of each row's last ``window`` prompt tokens:
    ``([L, B, H, W, hd], positions [B, W])`` (position -1 where the row is shorter, or
    before the row's last ``qlens[b]`` tokens: its question)."""
    t = hidden.shape[2]
    w = min(window, t)
    before = model.config.qk_smear  # the tokens a smeared query mixes in
    idx = lengths[:, None] - w - before + jnp.arange(w + before, dtype=jnp.int32)[None, :]
    qpos = jnp.where(idx >= 0, idx, -1)
    take = jnp.clip(idx, 0)[..., None]
    qs = []
    for i, layer in enumerate(model.layers):
        h = jnp.take_along_axis(hidden[i], take, axis=1)
        q, _, _ = layer.attn.project(layer.attn_norm(h), qpos)
        qs.append(q[:, :, before:])
    qpos = qpos[:, before:]
    if qlens is not None:
        qpos = jnp.where(qpos >= (lengths - qlens)[:, None], qpos, -1)
    return jnp.stack(qs), qpos


def _prefill(model: Transformer, tokens, lengths, budget, *, policy, kwargs, window, capacity,
             hidden: bool, qlens=None):
    """Prompt forward writing the cache, then the policy, then the final capacity
    (``qlens [B]``: each row's question length, see :func:`prefill`).

    Returns ``(logits [B, T, V], cache, hidden [L+1, B, T, D] or None)``.
    """
    b, t = tokens.shape
    slot = jnp.arange(t, dtype=jnp.int32)
    # Padding gets position -1: it is written as an empty slot and, as a query,
    # attends to nothing, so it adds nothing to the attention statistics.
    positions = jnp.where(slot[None, :] < lengths[:, None], slot[None, :], -1)
    needs = policy.needs if policy is not None else ()
    capture = tuple(n for n in ("attn", "attn_colsum") if n in needs)
    if hidden or "queries" in needs:
        capture += ("hidden",)
    cache = KVCache.init(model.config, b, t)
    out = model(tokens, positions=positions, cache=cache, capture=capture)
    logits, cache = out[0], out[1]
    inter = out[2] if capture else None
    cache = cache._replace(length=lengths)
    if policy is not None:
        queries = qpos = None
        if "queries" in needs:
            queries, qpos = _window_queries(model, inter.hidden, lengths, window, qlens)
        stats = policies_lib.Stats(
            lengths=lengths,
            attn_colsum=inter.attn_colsum if "attn_colsum" in needs else None,
            queries=queries, query_positions=qpos,
            attn=inter.attn if "attn" in needs else None)
        cache = policy(cache, stats, budget, **dict(kwargs))
    cache = policies_lib.resize(cache, capacity)
    return logits, cache, (inter.hidden if hidden else None)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("policy", "kwargs", "window", "capacity"))
def _prefill_jit(graphdef, state, tokens, lengths, budget, qlens, *, policy, kwargs, window,
                 capacity):
    model = nnx.merge(graphdef, state)
    logits, cache, _ = _prefill(model, tokens, lengths, budget, policy=policy, kwargs=kwargs,
                                window=window, capacity=capacity, hidden=False, qlens=qlens)
    return logits, cache


def prefill(model: Transformer, tokens, *, policy: str = "full", ratio: float = 0.0,
            capacity: int | None = None, lengths=None, pad_id: int = 0,
            question_lengths=None, **policy_kwargs) -> tuple[jax.Array, KVCache]:
    """Runs the prompt and returns ``(logits [B, T, V], cache)``.

    Args:
      tokens: ``[B, T]`` right-padded ids (with ``lengths [B]``) or a list of lists.
      policy: a name in :func:`lab.infer.policies.names` (or a ``Policy``),
        applied after the prompt with ``budget = int(T_b * (1 - ratio))`` per row
        (kvpress's rule); ``ratio=0`` keeps everything.
      capacity: slots per KV head of the returned cache (default: just enough
        for the kept entries); must be at least the largest budget.
      policy_kwargs: passed to the policy (static, so hashable); ``window=``
        sets how many last queries are captured for policies that need them.
      question_lengths: ``[B]`` ints, each row's question = its last
        ``question_lengths[b]`` prompt tokens (at most ``window``): the
        observation window of SnapKV and PRKV (their restart span) is then the
        question alone, as SnapKV's paper defines it, instead of the last
        ``window`` tokens. Default: the last ``window`` tokens.

    Logits at padding positions are meaningless; ``cache.length`` is the next
    slot to write per row. Raises ValueError for out-of-vocabulary ids, a ratio
    outside [0, 1), an unknown policy, or a prompt longer than ``max_len``.
    """
    plan = _plan(model, tokens, lengths, pad_id, policy, ratio, capacity, 0, policy_kwargs,
                 question_lengths)
    graphdef, state = nnx.split(model)
    return _prefill_jit(graphdef, state, plan.tokens, plan.lengths, plan.budget,
                        plan.question_lengths, policy=plan.policy, kwargs=plan.kwargs,
                        window=plan.window, capacity=plan.capacity)


def _last(x, lengths, axis):
    """``x`` at index ``lengths - 1`` along ``axis`` (the batch axis is ``axis - 1``)."""
    idx = (lengths - 1).reshape((1,) * (axis - 1) + (-1, 1) + (1,) * (x.ndim - axis - 1))
    return jnp.take_along_axis(x, idx, axis=axis).squeeze(axis)


@functools.partial(jax.jit, static_argnums=0, static_argnames=(
    "policy", "kwargs", "window", "capacity", "max_new", "greedy", "top_k", "top_p", "stop",
    "pad_id", "capture"))
def _generate_jit(graphdef, state, tokens, lengths, budget, qlens, key, temperature, *, policy,
                  kwargs, window, capacity, max_new, greedy, top_k, top_p, stop, pad_id,
                  capture):
    model = nnx.merge(graphdef, state)
    _, cache, hid = _prefill(model, tokens, lengths, budget, policy=policy, kwargs=kwargs,
                             window=window, capacity=capacity, hidden=True, qlens=qlens)
    h_last = _last(hid, lengths, axis=2)                       # [L+1, B, D]
    tok, lp = sampling.choose(model.unembed(h_last[-1]), jax.random.fold_in(key, 0),
                              temperature, greedy=greedy, top_k=top_k, top_p=top_p)
    out = decode.loop(model, cache, (tok, lp, h_last), lengths, key, temperature,
                      max_new=max_new, greedy=greedy, top_k=top_k, top_p=top_p, stop=stop,
                      pad_id=pad_id, capture=capture)
    return Generation(*out)


def generate(model: Transformer, tokens, *, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             stop_tokens: Sequence[int] = (), seed: int = 0, policy: str = "full",
             ratio: float = 0.0, capture: Sequence[str] = (), lengths=None, pad_id: int = 0,
             capacity: int | None = None, question_lengths=None,
             **policy_kwargs) -> Generation:
    """Generates ``max_new_tokens`` per row after the prompts (one jitted program).

    Args:
      tokens: ``[B, T]`` right-padded ids with ``lengths [B]``, or a list of lists.
      temperature: 0 = greedy; otherwise softmax sampling at this temperature,
        restricted to ``top_k`` tokens and/or the ``top_p`` nucleus.
      stop_tokens: ids that end a row (kept in the output); the row then emits
        ``pad_id`` and its cache stops changing; the loop exits when every row stopped.
      seed: the sampling key (one key per step, shared by the rows).
      policy, ratio, question_lengths, policy_kwargs: the cache policy applied after
        the prompt (see :func:`prefill`); decoding continues on the compressed cache.
      capture: ``("hidden",)`` for every layer's residual stream per step,
        ``("last_hidden",)`` for the last block's only (see :class:`Generation`).
      capacity: cache slots per KV head (default: kept prompt entries + max_new_tokens).

    Returns:
      :class:`Generation` ``(tokens, logprobs, hidden, lengths)``.

    Raises ValueError for out-of-vocabulary ids, prompt + max_new_tokens beyond
    ``max_len`` or the capacity, bad sampling arguments, an unknown policy or capture.
    """
    args, static = _generate_call(model, tokens, max_new_tokens, temperature, top_k, top_p,
                                  stop_tokens, seed, policy, ratio, capture, lengths, pad_id,
                                  capacity, policy_kwargs, question_lengths)
    return _generate_jit(*args, **static)


def _generate_call(model, tokens, max_new_tokens, temperature, top_k, top_p, stop_tokens, seed,
                   policy, ratio, capture, lengths, pad_id, capacity, policy_kwargs,
                   question_lengths=None):
    """Checks :func:`generate`'s arguments; returns ``_generate_jit``'s ``(args, static)``."""
    cfg = model.config
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}; expected an int >= 1")
    sampling.check(temperature, top_k, top_p, cfg.vocab_size)
    capture = tuple(capture)
    if len(capture) > 1 or any(c not in GENERATE_CAPTURES for c in capture):
        raise ValueError(f"capture={capture!r}; expected () or one of {GENERATE_CAPTURES}")
    stop = tuple(int(s) for s in stop_tokens)
    check_tokens(np.array(stop, np.int64), cfg.vocab_size, name="stop_tokens")
    plan = _plan(model, tokens, lengths, pad_id, policy, ratio, capacity, max_new_tokens,
                 policy_kwargs, question_lengths)
    graphdef, state = nnx.split(model)
    greedy = float(temperature) == 0.0
    args = (graphdef, state, plan.tokens, plan.lengths, plan.budget, plan.question_lengths,
            jax.random.key(seed), jnp.float32(temperature if not greedy else 1.0))
    static = dict(policy=plan.policy, kwargs=plan.kwargs, window=plan.window,
                  capacity=plan.capacity, max_new=max_new_tokens, greedy=greedy, top_k=top_k,
                  top_p=None if top_p is None else float(top_p), stop=stop, pad_id=pad_id,
                  capture=capture[0] if capture else None)
    return args, static


def generate_memory(model: Transformer, tokens, *, max_new_tokens: int, policy: str = "full",
                    ratio: float = 0.0, lengths=None, pad_id: int = 0,
                    capacity: int | None = None, question_lengths=None,
                    **policy_kwargs) -> dict:
    """XLA's memory analysis of the compiled greedy :func:`generate` program (not run).

    Returns bytes: ``arguments`` (weights and prompts), ``outputs``, ``temp``
    (XLA's temporary allocation: every intermediate buffer, the KV caches and
    the policy's statistics included, with buffers whose live ranges do not
    overlap sharing space) and ``total`` = their sum, the device memory the
    program needs. The prompt forward's full cache and activations count too,
    since eviction happens after the prefill, as in kvpress. These come from the
    compiler's buffer assignment, so they are exact for the compiled program on
    this backend and cost a compile, not a run.
    """
    args, static = _generate_call(model, tokens, max_new_tokens, 0.0, None, None, (), 0, policy,
                                  ratio, (), lengths, pad_id, capacity, policy_kwargs,
                                  question_lengths)
    stats = _generate_jit.lower(*args, **static).compile().memory_analysis()
    return {"arguments": int(stats.argument_size_in_bytes),
            "outputs": int(stats.output_size_in_bytes),
            "temp": int(stats.temp_size_in_bytes),
            "total": int(stats.argument_size_in_bytes + stats.output_size_in_bytes
                         + stats.temp_size_in_bytes)}


@functools.partial(jax.jit, static_argnums=0)
def _score_jit(graphdef, state, tokens, targets, mask):
    model = nnx.merge(graphdef, state)
    # Positions count valid tokens only, so left or right padding gives the same
    # numbers; masked tokens get position -1 and are never attended.
    positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, -1).astype(jnp.int32)
    logp = jax.nn.log_softmax(model(tokens, positions=positions), axis=-1)
    out = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.where(mask, out, 0.0)


def score(model: Transformer, tokens, targets, *, mask=None) -> jax.Array:
    """Per-token log-probabilities ``[B, T]`` of ``targets`` given ``tokens``.

    ``out[b, t] = log p(targets[b, t] | tokens[b, :t+1])`` (teacher forcing; for
    next-token scoring pass ``targets = tokens`` shifted left). ``mask [B, T]``
    (True = real token) marks padding, which is neither attended nor scored
    (its entries are 0); sum over ``t`` for sequence log-likelihoods.
    """
    cfg = model.config
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if tokens.ndim != 2 or targets.shape != tokens.shape:
        raise ValueError(f"tokens {tokens.shape} and targets {targets.shape} must both be [B, T]")
    check_tokens(tokens, cfg.vocab_size)
    check_tokens(targets, cfg.vocab_size, name="targets")
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds "
                         f"TransformerConfig.max_len={cfg.max_len}")
    mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
    if mask.shape != tokens.shape:
        raise ValueError(f"mask has shape {mask.shape}; expected {tokens.shape}")
    graphdef, state = nnx.split(model)
    return _score_jit(graphdef, state, tokens.astype(np.int32), targets.astype(np.int32), mask)
