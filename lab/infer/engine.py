"""Jitted prefill, generate and score on :class:`lab.nn.Transformer`.

Each entry point splits the model once (``nnx.split``) and calls a module-level
``jax.jit`` of a pure function of the state, with the graph definition, the
policy and every shape-determining argument static, so repeated calls with the
same shapes reuse the compiled program (flax ``guides/performance.md``).
Prefill, the cache policy and the whole decode loop (``lax.while_loop``) run
inside one program.

On a model sharded over a mesh (:func:`lab.parallel.shard_model`), :func:`generate`
also splits the batch over the mesh's ``"data"`` axis when that axis divides it.

Batches are right-padded: ``tokens [B, T]`` with ``lengths [B]`` (or a list of
lists of ids). Row ``b``'s prompt occupies cache slots ``0..lengths[b]-1`` at
positions ``0..lengths[b]-1``; padding is written as empty slots (position -1)
and never attended; the ``i``-th new token of row ``b`` sits at position
``lengths[b] + i``, whatever the cache policy kept.

A vision-language prompt (:class:`lab.nn.VLM`) enters as ``embedded=``, the
:class:`lab.nn.Embedded` that ``VLM.embed`` returns: its embeddings, M-RoPE
positions and DeepStack features replace the token embeddings in the prefill, the
cache stores its mask positions, and decoding continues at its ``next_position``
(Qwen3-VL's ``max(position) + 1``) on the same loop as text.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab import parallel
from lab.infer import decode, sampling
from lab.infer import policies as policies_lib
from lab.infer.options import GENERATE_CAPTURES, Eviction, GenerateOptions
from lab.nn import VLM, Embedded, KVCache, Transformer, check_tokens
from lab.nn.cache import check_cache

__all__ = ["GENERATE_CAPTURES", "Generation", "GenerateOptions", "as_batch",
           "continue_generation", "generate", "generate_memory", "memory_analysis", "prefill",
           "score"]


class Generation(NamedTuple):
    """What :func:`generate` and :func:`continue_generation` return.

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
    cache:    with ``return_cache=True``, the :class:`KVCache` holding the prompt and
              every generated token (the last one included), ready for
              :func:`continue_generation`; None otherwise.
    """

    tokens: jax.Array
    logprobs: jax.Array
    hidden: jax.Array | None
    lengths: jax.Array
    cache: KVCache | None = None


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
    budget: np.ndarray          # [B] kept after the chunk
    decode_budget: np.ndarray   # [B] kept by each compression while decoding
    question_lengths: np.ndarray
    eviction: Eviction


def _budgets(lengths, ratio, budget, context, compress_every) -> np.ndarray:
    """Entries kept per KV head of each row: kvpress's ``max(1, int(T * (1 - ratio)))``, or
    ``min(budget, T)`` for an absolute ``budget`` (``lengths``: the tokens each row's
    cache holds after the chunk; ``context``: the most it can ever hold)."""
    if budget is None:
        return np.array(policies_lib.budgets(lengths, ratio), np.int32)
    if ratio:
        raise ValueError(f"ratio={ratio!r} and budget={budget!r}; pass one of them")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget={budget!r}; expected an int >= 1 (KV entries per head)")
    if budget > context:
        what = "prompt + max_new_tokens" if compress_every else "the longest prompt"
        raise ValueError(f"budget={budget} exceeds the context of {context} tokens ({what}); "
                         f"expected at most {context}")
    return np.minimum(np.asarray(lengths), budget).astype(np.int32)


def _plan(model: Transformer, tokens, *, lengths=None, pad_id=0, policy="full", ratio=0.0,
          budget=None, capacity=None, max_new=0, policy_kwargs=(), question_lengths=None,
          compress_every=None, held=None, start=None) -> _Plan:
    """Validates a request on host and sizes the cache.

    ``held [B]``, ``start [B]``: for :func:`continue_generation`, the entries the cache
    already holds and each row's next position (None for a prompt).
    """
    cfg = model.config
    tokens, lengths = as_batch(tokens, lengths, pad_id)
    check_tokens(tokens, cfg.vocab_size)
    if not isinstance(pad_id, int) or not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(f"pad_id={pad_id!r}; expected an id in [0, {cfg.vocab_size})")
    pol = policies_lib.get(policy)
    if compress_every is not None:
        if not isinstance(compress_every, int) or isinstance(compress_every, bool) \
                or compress_every < 1:
            raise ValueError(f"compress_every={compress_every!r}; expected an int >= 1 "
                             "(new tokens between compressions) or None")
        if "attn" in pol.needs:
            raise ValueError(f"policy {policy!r} needs the prompt's full attention graph "
                             "(Stats.attn), which decoding does not keep; compress_every "
                             "works with policies that score from queries, attention column "
                             "sums, keys or positions")
    fresh = held is None
    held = np.zeros_like(lengths) if held is None else np.asarray(held, np.int32)
    start = np.zeros_like(lengths) if start is None else np.asarray(start, np.int32)
    longest = int(np.max(start + lengths))
    if longest + max_new > cfg.max_len:
        raise ValueError(f"prompt length {longest} + max_new_tokens {max_new} = "
                         f"{longest + max_new} exceeds TransformerConfig.max_len={cfg.max_len}")
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"padded prompt length {tokens.shape[1]} exceeds "
                         f"TransformerConfig.max_len={cfg.max_len}")
    evicts = pol.evicts and (bool(ratio) or budget is not None)
    total = held + lengths                               # entries after the chunk, per row
    context = int(total.max()) + (max_new if compress_every else 0)
    # While decoding, the cache holds the kept entries plus what was generated since
    # the last compression (every new token when compress_every is unset); writing a
    # padded chunk onto a held cache needs held + T slots first.
    grow = min(compress_every, max_new) if (evicts and compress_every) else max_new

    def slots(total):
        kept = _budgets(total, ratio, budget, context, compress_every)
        after = kept if evicts else total
        # An absolute budget is the cache's size while decoding (kvpress's target_size),
        # which may exceed a short prompt; a ratio keeps the prompt's kept count.
        during = np.full_like(after, budget) if (evicts and budget is not None) else after
        return after, during, int(max(after.max(), during.max())) + grow

    after, during, need = slots(total)
    if held.any():
        need = max(need, int(held.max()) + tokens.shape[1])
    if capacity is None:
        # A prompt's default is sized from its padded width, not from its rows' lengths,
        # so that every batch of one shape runs one compiled program (sized from the
        # lengths, each batch whose longest row differed compiled its own).
        capacity = max(need, min(slots(np.full_like(total, tokens.shape[1]))[2],
                                 cfg.max_len)) if fresh else need
    elif not isinstance(capacity, int) or capacity < need:
        raise ValueError(f"capacity={capacity!r} is below the {need} cache slots needed "
                         f"(kept entries {int(after.max())} + max_new_tokens {max_new})")
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
    eviction = Eviction(pol if evicts else None, tuple(sorted(kwargs.items())), window,
                        capacity, compress_every if evicts else None)
    return _Plan(tokens, lengths, after.astype(np.int32), during.astype(np.int32),
                 qlens.astype(np.int32), eviction)


def _window(queries, positions, lengths, window: int, qlens):
    """The last ``window`` valid queries of each row of a chunk: ``([L, B, H, W, hd],
    positions [B, W])``, position -1 where the row is shorter, or before the row's
    last ``qlens[b]`` tokens (its question)."""
    t = queries.shape[3]
    w = min(window, t)
    idx = lengths[:, None] - w + jnp.arange(w, dtype=jnp.int32)[None, :]
    take = jnp.clip(idx, 0)
    q = jnp.take_along_axis(queries, take[None, :, None, :, None], axis=3)
    qpos = jnp.where(idx >= 0, jnp.take_along_axis(positions, take, axis=1), -1)
    if qlens is not None:
        qpos = jnp.where(idx >= (lengths - qlens)[:, None], qpos, -1)
    return q, qpos


def _extend(model: Transformer, cache: KVCache, tokens, lengths, budget, qlens, *,
            eviction: Eviction, stats: tuple[str, ...] = (), hidden: bool = False,
            fresh: bool = False, embedded: Embedded | None = None):
    """Feeds a right-padded chunk ``tokens [B, T]`` (``lengths [B]`` valid) onto
    ``cache`` (``fresh``: an empty one of capacity ``T``), then applies the policy
    (``budget [B]`` entries kept per KV head) and resizes to the plan's capacity. A
    prompt is a chunk on an empty cache; ``embedded`` (a fresh prompt only) replaces the
    tokens' embeddings and positions.

    Returns ``(logits [B, T, V], cache, Stats or None, hidden [L+1, B, T, D] or None)``;
    the Stats (of the chunk's queries over the cache before eviction) hold what the
    policy needs and the names in ``stats``.
    """
    b, t = tokens.shape
    slot = jnp.arange(t, dtype=jnp.int32)[None, :]
    start = cache.next_positions
    # Padding gets position -1: it is written as an empty slot and, as a query,
    # attends to nothing, so it adds nothing to the attention statistics.
    positions = jnp.where(slot < lengths[:, None], start[:, None] + slot, -1)
    want = set(eviction.needs) | set(stats)
    captured = want | ({"queries"} if "all_queries" in want else set())
    capture = tuple(n for n in ("attn", "attn_colsum", "queries") if n in captured)
    if hidden:
        capture += ("hidden",)
    if embedded is None:
        run = functools.partial(model, tokens, positions=positions, cache=cache, fresh=fresh)
        next_position = start + lengths
    else:
        positions = jnp.where(slot < lengths[:, None], embedded.positions, -1)
        run = functools.partial(model, inputs_embeds=embedded.inputs_embeds,
                                positions=positions, rope_positions=embedded.rope_positions,
                                deepstack=embedded.deepstack, cache=cache, fresh=fresh)
        next_position = embedded.next_position
    logits, new, inter = run(capture=capture) if capture else (*run(), None)
    new = new._replace(length=cache.length + lengths, next_position=next_position)
    out = None
    if want:
        queries = qpos = None
        if "queries" in want:
            queries, qpos = _window(inter.queries, positions, lengths, eviction.window, qlens)
        out = policies_lib.Stats(
            lengths=new.next_position,
            attn_colsum=inter.attn_colsum if "attn_colsum" in want else None,
            queries=queries, query_positions=qpos,
            attn=inter.attn if "attn" in want else None,
            query_start=policies_lib.first_position(positions, new.next_position),
            all_queries=inter.queries if "all_queries" in want else None)
    if eviction.policy is not None:
        new = eviction.policy(new, out, budget, **dict(eviction.kwargs))
    new = policies_lib.resize(new, eviction.capacity)
    return logits, new, out, (inter.hidden if hidden else None)


def _empty(model: Transformer, b: int, t: int) -> KVCache:
    return KVCache.init(model.config, b, t)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("eviction", "stats"))
def _prefill_jit(graphdef, state, tokens, lengths, budget, qlens, embedded, *, eviction, stats):
    model = nnx.merge(graphdef, state)
    logits, cache, st, _ = _extend(model, _empty(model, *tokens.shape), tokens, lengths, budget,
                                   qlens, eviction=eviction, stats=stats, fresh=True,
                                   embedded=embedded)
    return logits, cache, st


def prefill(model: Transformer, tokens, *, policy: str = "full", ratio: float = 0.0,
            budget: int | None = None, capacity: int | None = None, lengths=None,
            pad_id: int = 0, question_lengths=None, return_stats=False,
            embedded: Embedded | None = None, **policy_kwargs):
    """Runs the prompt and returns ``(logits [B, T, V], cache)`` (one jitted program).

    Args:
      tokens: ``[B, T]`` right-padded ids (with ``lengths [B]``) or a list of lists.
        ``model`` may be a :class:`lab.nn.VLM`; its decoder runs on ``embedded``.
      embedded: the prompt as :meth:`lab.nn.VLM.embed` returns it (images in place,
        M-RoPE positions); default for a VLM: ``model.embed(tokens)`` (text only).
      policy: a name in :func:`lab.infer.policies.names` (or a ``Policy``),
        applied after the prompt with ``budget = int(T_b * (1 - ratio))`` per row
        (kvpress's rule); ``ratio=0`` keeps everything.
      budget: instead of ``ratio``, keep ``min(budget, T_b)`` entries per KV head.
      capacity: slots per KV head of the returned cache (default: what a row of
        the padded width ``T`` keeps, so the program depends on shapes only); must be
        at least the largest budget.
      policy_kwargs: passed to the policy (static, so hashable); ``window=``
        sets how many last queries are captured for policies that need them.
      question_lengths: ``[B]`` ints, each row's question = its last
        ``question_lengths[b]`` prompt tokens (at most ``window``): the
        observation window of SnapKV and PRKV (their restart span) is then the
        question alone, as SnapKV's paper defines it, instead of the last
        ``window`` tokens. Default: the last ``window`` tokens.
      return_stats: True for ``(logits, cache, stats)``, the
        :class:`~lab.infer.policies.Stats` the policy scored (of the uncompressed
        prompt cache); or a tuple of names in :data:`~lab.infer.policies.STATS`
        to capture those too (e.g. every statistic under ``policy="full"``).

    Logits at padding positions are meaningless; ``cache.length`` is the next
    slot to write per row. Raises ValueError for out-of-vocabulary ids, a ratio
    outside [0, 1), a budget beyond the prompt, an unknown policy, or a prompt
    longer than ``max_len``.
    """
    stats = _stat_names(return_stats)
    model, embedded = _unwrap(model, tokens, lengths, pad_id, embedded)
    plan = _plan(model, tokens, lengths=lengths, pad_id=pad_id, policy=policy, ratio=ratio,
                 budget=budget, capacity=capacity, policy_kwargs=policy_kwargs,
                 question_lengths=question_lengths)
    embedded = _check_embedded(embedded, plan.tokens, model.config)
    graphdef, state = nnx.split(model)
    logits, cache, st = _prefill_jit(graphdef, state, plan.tokens, plan.lengths, plan.budget,
                                     plan.question_lengths, embedded, eviction=plan.eviction,
                                     stats=stats)
    return (logits, cache, st) if return_stats is not False else (logits, cache)


def _unwrap(model, tokens, lengths, pad_id, embedded):
    """``(decoder, embedded)``: a :class:`lab.nn.VLM`'s language model and its prompt
    (``model.embed`` of the tokens when ``embedded`` is None); a Transformer as is."""
    if not isinstance(model, VLM):
        return model, embedded
    if embedded is None:
        toks, lens = as_batch(tokens, lengths, pad_id)
        embedded = model.embed(toks, lengths=lens)
    return model.language_model, embedded


def _check_embedded(embedded, tokens: np.ndarray, config) -> Embedded | None:
    """Raises ValueError unless ``embedded`` fits the padded prompt ``tokens [B, T]``."""
    if embedded is None:
        return None
    if not isinstance(embedded, Embedded):
        raise ValueError(f"embedded is a {type(embedded).__name__}; expected lab.nn.Embedded "
                         "(what VLM.embed returns)")
    b, t = tokens.shape
    want = {"inputs_embeds": (b, t, config.d_model), "positions": (b, t),
            "rope_positions": (3, b, t), "next_position": (b,)}
    for name, shape in want.items():
        got = tuple(np.shape(getattr(embedded, name)))
        if got != shape:
            raise ValueError(f"embedded.{name} has shape {got}; the prompt [B, T] = "
                             f"{[b, t]} needs {shape}")
    return embedded


def _stat_names(return_stats) -> tuple[str, ...]:
    if isinstance(return_stats, bool):
        return ()
    names = (return_stats,) if isinstance(return_stats, str) else tuple(return_stats)
    bad = [n for n in names if n not in policies_lib.STATS]
    if bad:
        raise ValueError(f"return_stats={return_stats!r}; expected a bool or names from "
                         f"{policies_lib.STATS}")
    return tuple(sorted(names))


def _last(x, lengths, axis):
    """``x`` at index ``lengths - 1`` along ``axis`` (the batch axis is ``axis - 1``)."""
    idx = (lengths - 1).reshape((1,) * (axis - 1) + (-1, 1) + (1,) * (x.ndim - axis - 1))
    return jnp.take_along_axis(x, idx, axis=axis).squeeze(axis)


def _decode_from(model, cache, hid, lengths, key, temperature, *, opts, eviction, budget,
                 return_cache):
    # budget: [B] entries each compression keeps while decoding
    """Samples token 0 from the chunk's last hidden state, then runs the decode loop."""
    h_last = _last(hid, lengths, axis=2)                       # [L+1, B, D]
    tok, lp = sampling.choose(model.unembed(h_last[-1]), jax.random.fold_in(key, 0),
                              temperature, greedy=opts.greedy, top_k=opts.top_k,
                              top_p=opts.top_p)
    out = decode.loop(model, cache, (tok, lp, h_last), key, temperature, budget,
                      opts=opts, eviction=eviction, return_cache=return_cache)
    return Generation(*out)


_GEN_STATIC = ("opts", "eviction", "return_cache")


@functools.partial(jax.jit, static_argnums=0, static_argnames=_GEN_STATIC)
def _generate_jit(graphdef, state, tokens, lengths, budgets, qlens, key, temperature, embedded,
                  *, opts, eviction, return_cache):
    model = nnx.merge(graphdef, state)
    _, cache, _, hid = _extend(model, _empty(model, *tokens.shape), tokens, lengths, budgets[0],
                               qlens, eviction=eviction, hidden=True, fresh=True,
                               embedded=embedded)
    return _decode_from(model, cache, hid, lengths, key, temperature, opts=opts,
                        eviction=eviction, budget=budgets[1], return_cache=return_cache)


@functools.partial(jax.jit, static_argnums=0, static_argnames=_GEN_STATIC)
def _continue_jit(graphdef, state, cache, tokens, lengths, budgets, qlens, key, temperature,
                  *, opts, eviction, return_cache):
    model = nnx.merge(graphdef, state)
    cache = policies_lib.resize(cache, eviction.capacity)
    _, cache, _, hid = _extend(model, cache, tokens, lengths, budgets[0], qlens,
                               eviction=eviction, hidden=True)
    return _decode_from(model, cache, hid, lengths, key, temperature, opts=opts,
                        eviction=eviction, budget=budgets[1], return_cache=return_cache)


def _options(options: GenerateOptions | None, max_new_tokens, sampling_kwargs: dict,
             vocab_size: int) -> GenerateOptions:
    if options is None:
        if max_new_tokens is None:
            raise ValueError("max_new_tokens=None; pass max_new_tokens= or options=")
        options = GenerateOptions(max_new_tokens, **sampling_kwargs)
    elif max_new_tokens is not None or sampling_kwargs:
        raise ValueError("pass the sampling arguments either in options= or as keywords, "
                         f"not both (got options and {sorted(sampling_kwargs)})")
    sampling.check(options.temperature, options.top_k, options.top_p, vocab_size)
    check_tokens(np.array(options.stop_tokens, np.int64), vocab_size, name="stop_tokens")
    return options


def _temperature(opts: GenerateOptions) -> jax.Array:
    """The run-time temperature (1 for greedy, where it is unused)."""
    return jnp.float32(1.0 if opts.greedy else opts.temperature)


_SAMPLING = ("temperature", "top_k", "top_p", "stop_tokens", "seed", "capture")


def _split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """``(sampling keywords, policy keywords)``."""
    return ({k: v for k, v in kwargs.items() if k in _SAMPLING},
            {k: v for k, v in kwargs.items() if k not in _SAMPLING})


def generate(model: Transformer, tokens, *, max_new_tokens: int | None = None,
             options: GenerateOptions | None = None, policy: str = "full", ratio: float = 0.0,
             budget: int | None = None, compress_every: int | None = None, lengths=None,
             pad_id: int = 0, capacity: int | None = None, question_lengths=None,
             return_cache: bool = False, embedded: Embedded | None = None,
             **kwargs) -> Generation:
    """Generates ``max_new_tokens`` per row after the prompts (one jitted program).

    Args:
      tokens: ``[B, T]`` right-padded ids with ``lengths [B]``, or a list of lists.
        ``model`` may be a :class:`lab.nn.VLM` (its decoder generates).
      embedded: a VLM prompt as :meth:`lab.nn.VLM.embed` returns it (see
        :func:`prefill`); decoding continues at its ``next_position``.
      max_new_tokens, temperature, top_k, top_p, stop_tokens, seed, capture: the
        sampling options (see :class:`GenerateOptions`), as keywords or grouped in
        ``options=``.
      policy, ratio, budget, question_lengths, window and other keywords: the cache
        policy applied after the prompt (see :func:`prefill`); decoding continues
        on the compressed cache.
      compress_every: also evict during decoding, as kvpress's ``DecodingPress``:
        every this many new tokens the policy re-scores the cache with the queries
        of those tokens and keeps it at the prompt's budget, so a long generation
        stays within ``budget + compress_every`` entries per KV head.
      capacity: cache slots per KV head (default: the entries a row of the padded
        width ``T`` keeps + max_new_tokens, or + compress_every when compressing, at
        most ``max_len``: one compiled program serves every batch of one shape).
      return_cache: also return the cache (prompt and generated tokens) in
        ``Generation.cache``, for :func:`continue_generation`.

    Returns:
      :class:`Generation` ``(tokens, logprobs, hidden, lengths, cache)``.

    Raises ValueError for out-of-vocabulary ids, prompt + max_new_tokens beyond
    ``max_len`` or the capacity, bad sampling arguments, an unknown policy or capture,
    a budget beyond the context, ``compress_every < 1``.
    """
    args, static = _generate_call(model, tokens, max_new_tokens, options, kwargs, policy=policy,
                                  ratio=ratio, budget=budget, compress_every=compress_every,
                                  lengths=lengths, pad_id=pad_id, capacity=capacity,
                                  question_lengths=question_lengths, return_cache=return_cache,
                                  embedded=embedded)
    return _generate_jit(*args, **static)


def _generate_call(model, tokens, max_new_tokens, options, kwargs, **plan_kwargs):
    """Checks :func:`generate`'s arguments; returns ``_generate_jit``'s ``(args, static)``."""
    sampling_kwargs, policy_kwargs = _split_kwargs(kwargs)
    return_cache = plan_kwargs.pop("return_cache")
    model, embedded = _unwrap(model, tokens, plan_kwargs["lengths"], plan_kwargs["pad_id"],
                              plan_kwargs.pop("embedded", None))
    opts = _options(options, max_new_tokens, sampling_kwargs, model.config.vocab_size)
    plan = _plan(model, tokens, max_new=opts.max_new_tokens + int(return_cache),
                 policy_kwargs=policy_kwargs, **plan_kwargs)
    embedded = _check_embedded(embedded, plan.tokens, model.config)
    if opts.pad_id != plan_kwargs["pad_id"]:
        opts = dataclasses.replace(opts, pad_id=plan_kwargs["pad_id"])
    graphdef, state = nnx.split(model)
    rows = _data_split((plan.tokens, plan.lengths, (plan.budget, plan.decode_budget),
                        plan.question_lengths), state)
    args = (graphdef, state, *rows, jax.random.key(opts.seed), _temperature(opts), embedded)
    return args, dict(opts=opts.static(), eviction=plan.eviction, return_cache=return_cache)


def _data_split(rows, state):
    """The per-row arrays ``rows`` split over the ``"data"`` axis of the mesh ``state`` is
    sharded on (:func:`lab.parallel.shard_model`), when that axis has several devices and
    divides the batch; otherwise ``rows`` unchanged. GSPMD then runs each data group's rows
    on its own devices (prefill, cache, decode loop), with the weights as they are placed."""
    mesh = parallel.mesh_of(state)
    if mesh is None or dict(mesh.shape).get("data", 1) == 1:
        return rows
    if len(rows[0]) % mesh.shape["data"]:
        return rows  # replicated rows: every data group decodes the whole batch
    return parallel.shard_batch(rows, mesh)


def continue_generation(model: Transformer, cache: KVCache, tokens, *,
                        max_new_tokens: int | None = None,
                        options: GenerateOptions | None = None, policy: str = "full",
                        budget: int | None = None, compress_every: int | None = None,
                        lengths=None, pad_id: int = 0, capacity: int | None = None,
                        return_cache: bool = False, **kwargs) -> Generation:
    """Feeds ``tokens`` (the next turn, right-padded ``[B, T]`` or a list of lists) onto
    a cache that :func:`generate` or :func:`continue_generation` returned
    (``return_cache=True``), then generates as :func:`generate` does, without
    recomputing what the cache holds. Each row's tokens continue at its
    ``cache.next_position``; ``policy``/``budget`` evict after the new tokens (and,
    with ``compress_every``, during decoding), scoring with their queries.

    Returns a :class:`Generation`; raises ValueError as :func:`generate` does, and for
    a cache whose batch differs from ``tokens``'.
    """
    if isinstance(model, VLM):  # the next turn is text: the decoder continues
        model = model.language_model
    if not isinstance(cache, KVCache) or cache.next_position is None:
        raise ValueError("cache must be a KVCache from generate(..., return_cache=True) or "
                         "prefill (one that tracks next_position)")
    check_cache(cache, model.config)
    toks, lens = as_batch(tokens, lengths, pad_id)
    if toks.shape[0] != cache.length.shape[0]:
        raise ValueError(f"tokens has {toks.shape[0]} rows; the cache holds "
                         f"{cache.length.shape[0]}")
    sampling_kwargs, policy_kwargs = _split_kwargs(kwargs)
    opts = _options(options, max_new_tokens, sampling_kwargs, model.config.vocab_size)
    plan = _plan(model, toks, lengths=lens, pad_id=pad_id, policy=policy, budget=budget,
                 capacity=capacity, max_new=opts.max_new_tokens + int(return_cache),
                 policy_kwargs=policy_kwargs, compress_every=compress_every,
                 held=np.asarray(cache.length), start=np.asarray(cache.next_position))
    if opts.pad_id != pad_id:
        opts = dataclasses.replace(opts, pad_id=pad_id)
    graphdef, state = nnx.split(model)
    return _continue_jit(graphdef, state, cache, plan.tokens, plan.lengths,
                         (plan.budget, plan.decode_budget), plan.question_lengths,
                         jax.random.key(opts.seed), _temperature(opts),
                         opts=opts.static(), eviction=plan.eviction, return_cache=return_cache)


# XLA's buffer assignment (what ``memory_analysis`` reports) is fixed by its HLO passes;
# the CPU backend's optimisation level only changes how LLVM optimises the emitted
# code. Compiled for the analysis alone at level 0, a program reports the same bytes and
# compiles faster (tests/infer/test_policies.py checks that the bytes agree; the saving is
# in docs/benchmarks.md).
_ANALYSIS_OPTIONS = {"cpu": {"xla_backend_optimization_level": 0}}


def memory_analysis(lowered: jax.stages.Lowered) -> dict:
    """XLA's memory analysis of a lowered program, compiled for the analysis only (the
    executable is not kept; on CPU without LLVM's optimisations, see above).

    Returns bytes: ``arguments``, ``outputs``, ``temp`` (XLA's temporary allocation:
    every intermediate buffer, with buffers whose live ranges do not overlap sharing
    space) and ``total`` = their sum, the device memory the program needs.
    """
    options = _ANALYSIS_OPTIONS.get(jax.default_backend())
    stats = lowered.compile(options).memory_analysis()
    out = {"arguments": int(stats.argument_size_in_bytes),
           "outputs": int(stats.output_size_in_bytes),
           "temp": int(stats.temp_size_in_bytes)}
    return {**out, "total": sum(out.values())}


def generate_memory(model: Transformer, tokens, *, max_new_tokens: int, **kwargs) -> dict:
    """XLA's memory analysis of the compiled greedy :func:`generate` program (not run).

    Takes :func:`generate`'s arguments. Returns :func:`memory_analysis`'s bytes, the KV
    caches and the policy's statistics in ``temp``. The prompt forward's full cache and
    activations count too, since eviction happens after the prefill, as in kvpress.
    These come from the compiler's buffer assignment, so they are exact for the compiled
    program on this backend and cost a compile, not a run.
    """
    # generate's own defaults, so the analysed program is the one generate would run.
    bound = inspect.signature(generate).bind(model, tokens, max_new_tokens=max_new_tokens,
                                             **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    args, static = _generate_call(a.pop("model"), a.pop("tokens"), a.pop("max_new_tokens"),
                                  a.pop("options"), a.pop("kwargs"), **a)
    return memory_analysis(_generate_jit.lower(*args, **static))


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
