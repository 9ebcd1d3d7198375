"""PRKV vs kvpress's eviction baselines on long-context synthetic tasks.

A zoo LM (``config.model`` names one, default ``lm-xs-long``; ``""`` trains the one
``config.zoo`` describes; cached by ``lab.zoo``) or a Hugging Face checkpoint
(``--config.model=<dir>``) answers multi-hop
variable tracking, needle retrieval and multi-step arithmetic after a prefill
whose KV cache every policy compresses at every ratio; the answer is decoded
greedily on the compressed cache and scored by exact match. Each batch's prompt
runs once (:func:`prefill_once`) and every policy compresses that cache
(:func:`baseline_accuracy`); PRKV's PageRank, matrix-free from the prompt's
queries and keys, is solved once per batch for every ratio and pooling
(:func:`prkv_accuracy`); both give what ``generate(policy=...)`` gives. The
paper's claims, as it states them: accuracy against the baselines at each ratio;
the peak memory of prefill + scoring + decoding against the full cache
(:func:`memory_costs`: the compiled generate program per policy and ratio at the
run's widest prompt, with the bytes of weights, prompt cache, captured
statistics, scoring scratch and decode cache, and PRKV on materialised attention
beside it); the end-to-end overhead (one
generate call of PRKV, captures and scoring included, over the full cache's:
:func:`cache_costs`). Also measured: the kept KV bytes per example, each
policy's scoring time as a fraction of the prefill forward, and a question-only
row (the prompt's context removed) that says what the model gets without the
evidence.

  python -m experiments.prkv --config=configs/prkv.py:default --workdir=/tmp/prkv
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from configs.prkv import POLICIES, get_config
from lab import infer, launch, timing, zoo
from lab.config import check
from lab.data.synthetic import extract_answer, generate
from lab.infer import policies
from lab.methods import prkv as prkv_lib
from lab.nn import KVCache
from lab.outputs import claim, markdown_table, regime, save_figure, write_outputs
from lab.zoo import ZooSpec

TASKS = ("variable_tracking", "needle", "arithmetic")
POLICY_KWARGS = {"random": ("seed",), "prkv": ("alpha", "iters", "graph", "n_sink", "n_recent",
                                                 "kernel_size", "solver")}


def check_config(config):
    """Validates ``config`` against its preset; raises ValueError naming the key."""
    pos = (lambda v: v > 0, "> 0")

    def odd(k):
        return k >= 1 and k % 2 == 1

    def alpha(a):
        return 0 <= a < 1
    return check(config, get_config, {
        "tasks.names": (lambda v: len(v) > 0 and all(t in TASKS for t in v),
                        f"a non-empty list of {TASKS}"),
        "tasks.context": (lambda v: len(v) == 2 and 0 < v[0] <= v[1], "[low, high] tokens"),
        "eval.policies": (lambda v: len(v) > 0 and all(p in POLICIES for p in v),
                          f"a non-empty list of {POLICIES}"),
        "eval.ratios": (lambda v: len(v) > 0 and all(0 <= r < 1 for r in v) and 0.0 in v,
                        "ratios in [0, 1), including 0"),
        "eval.n_per_task": pos, "eval.batch_size": pos, "eval.max_new_tokens": pos,
        "eval.cost_batch_size": (lambda v: isinstance(v, int) and 0 < v <= config.eval.batch_size,
                                 "an int in [1, eval.batch_size]"),
        "eval.window": pos, "eval.timing_repeats": pos,
        "prkv.alpha": (alpha, "0 <= alpha < 1"),
        "prkv.iters": pos,
        "prkv.solver": (lambda v: v in prkv_lib.SOLVERS, f"one of {prkv_lib.SOLVERS}"),
        "prkv.kernel_size": (odd, "a positive odd int"),
        "prkv.graph": (lambda v: v in prkv_lib.GRAPHS, f"one of {prkv_lib.GRAPHS}"),
        "ablation.task": (lambda v: v == "" or v in config.tasks.names,
                          "'' or one of tasks.names"),
        "ablation.alphas": (lambda v: len(v) > 0 and all(map(alpha, v)),
                            "a non-empty list in [0, 1)"),
        "ablation.kernel_sizes": (lambda v: len(v) > 0 and all(map(odd, v)),
                                  "a non-empty list of positive odd ints"),
        "ablation.question_restart": (lambda v: isinstance(v, bool), "a bool"),
        "zoo.steps": pos, "zoo.seq_len": pos, "claims.max_overhead": pos,
    })


def task_kwargs(config) -> dict:
    """Generator keyword arguments per task (lab.data.synthetic), from ``config.tasks``."""
    t = config.tasks
    ctx = tuple(int(x) for x in t.context)
    every = {
        "variable_tracking": {"hops": tuple(t.hops), "context_len": ctx, "n_chains": t.n_chains},
        "needle": {"context_len": ctx, "n_needles": t.n_needles},
        "arithmetic": {"steps": tuple(t.arith_steps), "digits": t.arith_digits, "ops": "+-"},
    }
    return {name: every[name] for name in t.names}


def zoo_spec(config) -> ZooSpec:
    """The zoo LM of ``config.zoo``, trained on ``config.tasks`` (equal weights)."""
    z = config.zoo
    return zoo.spec_from_config(
        z, task_kwargs(config), seed=config.seed,
        warmup_steps=min(50, max(z.steps // 10, 1)), checkpoint_every=100,
        description="PRKV's LM: long-context variable tracking, needles, arithmetic")


def load_model(config):
    """``(model, tokenizer, info)``: a named zoo LM or the HF checkpoint directory
    ``config.model`` (:func:`lab.zoo.load_model`), or (``config.model == ""``) the zoo LM
    described by ``config.zoo``."""
    if config.model and config.model not in zoo.NAMED:
        model, tok = zoo.load_model(config.model)
        return model, tok, {"source": config.model}
    spec = zoo.get_spec(config.model) if config.model else zoo_spec(config)
    t0 = time.time()
    model, tok = zoo.load_spec(spec, progress=False)
    m = zoo.metrics(spec)
    return model, tok, {"source": spec.key, "load_seconds": time.time() - t0,
                        "train_seconds": m["seconds"]["train"], "steps": m["steps"],
                        "params": m["params"], "zoo_held_out": m["held_out"]}


def policy_kwargs(name, config) -> dict:
    """Keyword arguments of policy ``name`` (:data:`lab.methods.prkv.DENSE` takes PRKV's)."""
    extra = {"seed": config.seed, **{k: config.prkv[k] for k in POLICY_KWARGS["prkv"]}}
    name = "prkv" if name == prkv_lib.DENSE else name
    return {k: extra[k] for k in POLICY_KWARGS.get(name, ())}


def encode(tok, prompts, pad_id: int, width: int):
    rows = [tok.encode(p, add_bos=True) for p in prompts]
    if max(len(r) for r in rows) > width:
        raise ValueError(f"a prompt has {max(len(r) for r in rows)} tokens; the padded width "
                         f"is {width}")
    x = np.full((len(rows), width), pad_id, np.int32)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    return x, np.array([len(r) for r in rows], np.int32)


def generate_kwargs(tok, *, policy, ratio, config, capacity, overrides=None,
                    question_lengths=None) -> dict:
    """:func:`lab.infer.generate`'s keyword arguments for one evaluation cell: greedy
    answers after a prefill compressed by ``policy`` at ``ratio`` (``"full"`` at 0).
    ``overrides`` replace policy keyword arguments (the ablation); ``question_lengths``
    make each row's question the observation window (:func:`lab.infer.prefill`);
    ``capacity``: the decode cache's (None: what the policy keeps plus the new tokens)."""
    e = config.eval
    kw = {} if ratio == 0 else {**policy_kwargs(policy, config), "window": e.window,
                                **(overrides or {})}
    return dict(max_new_tokens=e.max_new_tokens, stop_tokens=[tok.eos_id],
                policy=policy if ratio else "full", ratio=float(ratio),
                pad_id=int(tok.pad_id or 0), capacity=capacity,
                question_lengths=question_lengths if ratio else None, **kw)


def accuracy(model, tok, x, lengths, answers, **cell):
    """``(correct, texts)``: exact match of each greedy answer after a compressed prefill,
    and the generated texts; ``cell`` as :func:`generate_kwargs` takes it."""
    gen = infer.generate(model, x, lengths=lengths, **generate_kwargs(tok, **cell))
    texts = _texts(tok, gen.tokens, gen.lengths)
    return [extract_answer(t) == a for t, a in zip(texts, answers, strict=True)], texts


def _texts(tok, tokens, lengths) -> list[str]:
    return [tok.decode([int(t) for t in row[:n] if t != tok.eos_id])
            for row, n in zip(np.asarray(tokens), np.asarray(lengths), strict=True)]


# The policy's two steps, jitted apart so that one solve serves every ratio and pooling.
_prkv_scores = jax.jit(prkv_lib.prefill_scores, static_argnames=("alpha", "iters", "graph",
                                                                 "impl", "solver"))
_prkv_keep = jax.jit(prkv_lib.keep, static_argnames=("n_sink", "n_recent", "kernel_size"))


class Prefilled(NamedTuple):
    """One batch's prompt, run once under ``"full"``: the first answer token of each row
    (from the prompt's last logits), whether it is the stop token, and the uncompressed
    cache with the statistics every policy scores from."""
    first: np.ndarray
    stopped: np.ndarray
    cache: KVCache
    stats: policies.Stats


def prefill_once(model, tok, x, lengths, *, needs, window, question_lengths=None
                 ) -> Prefilled:
    """:class:`Prefilled` of the batch ``x``: ``lab.infer.prefill`` under ``"full"``
    capturing ``needs`` (``window`` last queries, or each row's question with
    ``question_lengths``), as ``generate`` does before it applies a policy."""
    logits, cache, stats = infer.prefill(
        model, x, lengths=lengths, return_stats=tuple(needs), window=window,
        question_lengths=question_lengths, capacity=x.shape[1])
    first = np.asarray(jnp.argmax(logits[jnp.arange(x.shape[0]), jnp.asarray(lengths) - 1],
                                  axis=-1)).astype(np.int32)
    return Prefilled(first, first == tok.eos_id, cache, stats)


def decode_kept(model, tok, pre: Prefilled, kept: KVCache, answers, *, config, capacity):
    """``(correct, texts)`` of greedy decoding on the compressed cache ``kept``: token 0
    is the prompt's (``pre.first``), the rest :func:`lab.infer.continue_generation` from
    it, exactly what :func:`lab.infer.generate` decodes after that policy."""
    e = config.eval
    if e.max_new_tokens > 1:
        gen = infer.continue_generation(
            model, kept, pre.first[:, None], max_new_tokens=e.max_new_tokens - 1,
            stop_tokens=[tok.eos_id], pad_id=int(tok.pad_id or 0), capacity=capacity)
        tokens = np.concatenate([pre.first[:, None], np.asarray(gen.tokens)], axis=1)
        n = np.where(pre.stopped, 1, 1 + np.asarray(gen.lengths))
    else:
        tokens, n = pre.first[:, None], np.ones_like(pre.first)
    texts = _texts(tok, tokens, n)
    return [extract_answer(t) == a for t, a in zip(texts, answers, strict=True)], texts


def baseline_accuracy(model, tok, pre: Prefilled, lengths, answers, *, fns, ratios, config,
                      capacity) -> dict:
    """``{(policy, ratio): (correct, texts)}`` of every evicting policy in ``fns``
    (:func:`scorers`) at every ratio, each applied to the one prefill ``pre``: the
    policy's function on its cache and statistics at the ratio's budgets, then
    :func:`decode_kept` (``tests/experiments/test_prkv.py`` checks the texts are
    ``generate(policy=...)``'s)."""
    out = {}
    for name, fn in fns.items():
        if name == "prkv" or not policies.get(name).evicts:
            continue
        for r in ratios:
            budget = jnp.asarray(policies.budgets(lengths, r), jnp.int32)
            out[(name, r)] = decode_kept(model, tok, pre, fn(pre.cache, pre.stats, budget),
                                         answers, config=config, capacity=capacity)
    return out


def prkv_accuracy(model, tok, x, lengths, answers, *, ratios, config, capacity, variants,
                  question_lengths=None, window=None, pre: Prefilled | None = None) -> dict:
    """``{(alpha, kernel_size, ratio): (correct, texts)}``: :func:`accuracy` of the ``"prkv"``
    policy for every variant and ratio, each PageRank solved once.

    The policy's steps, split so that one solve serves every ratio and pooling (the scores
    depend on neither): the prompt's cache and statistics (:func:`prefill_once`, or
    ``pre`` when the caller has run it with PRKV's statistics and the same window), the
    matrix-free scores per ``alpha``
    (:func:`lab.methods.prkv.prkv_scores_matrix_free`), then per (kernel, ratio) the
    policy's compaction (:func:`lab.methods.prkv.keep`) and :func:`decode_kept`. This is
    what ``generate(policy="prkv")`` computes (``tests/experiments/test_prkv.py`` checks
    the texts are equal). ``variants``: ``(alpha, kernel_size)`` pairs;
    ``question_lengths``/``window`` as :func:`generate_kwargs`.
    """
    e, p = config.eval, config.prkv
    if pre is None:
        pre = prefill_once(model, tok, x, lengths, needs=policies.get("prkv").needs,
                           window=e.window if window is None else window,
                           question_lengths=question_lengths)
    out, scores = {}, {}
    for alpha, kernel in variants:
        if alpha not in scores:
            scores[alpha] = _prkv_scores(pre.cache, pre.stats, alpha=float(alpha),
                                         iters=p.iters, graph=p.graph, solver=p.solver)
        for r in ratios:
            budget = jnp.asarray(policies.budgets(lengths, r), jnp.int32)
            kept = _prkv_keep(pre.cache, pre.stats, scores[alpha], budget, n_sink=p.n_sink,
                              n_recent=p.n_recent, kernel_size=int(kernel))
            out[(alpha, kernel, r)] = decode_kept(model, tok, pre, kept, answers,
                                                  config=config, capacity=capacity)
    return out


def _timed(fns: Mapping[str, Callable], repeats: int, why: str) -> dict[str, float]:
    """Median seconds of each of ``fns`` over ``repeats`` calls, after one call of each to
    compile. The timed calls interleave (each repeat calls every function once) inside one
    :func:`lab.timing.alone` section (``why``: what is timed), so the functions compared
    see the same host."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    with timing.alone(why):
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def scorers(names, config) -> dict:
    """``{policy: jitted fn(cache, stats, budget)}``, built once so that every task's
    :func:`cache_costs` reuses the compiled programs."""
    return {n: jax.jit(functools.partial(policies.get(n).fn, **policy_kwargs(n, config)))
            for n in names}


def policy_needs(names) -> tuple[str, ...]:
    """The prefill statistics the policies ``names`` score with (their union)."""
    return tuple(sorted({n for p in names for n in policies.get(p).needs}))


def cache_costs(model, tok, x, lengths, fns, ratios, config):
    """Kept KV bytes per example at every ratio, scoring / prefill seconds, and PRKV's
    end-to-end time against full-cache inference, on one batch.

    The prefill statistics the policies need (:func:`_needs`: the queries of every prompt
    token for PRKV, the window's for SnapKV and TOVA, attention column sums for H2O; no
    attention probabilities) are captured once (``infer.prefill`` under ``"full"`` with
    ``return_stats``, which returns the uncompressed cache); each policy's jitted function
    (``fns``, :func:`scorers`) is then timed on them alone, against the prefill forward
    without captures. ``end_to_end``: one greedy :func:`lab.infer.generate` call (prefill,
    PRKV's captures, its scoring and ``eval.max_new_tokens`` decoding steps, no stop token,
    the decode cache sized to what is kept) at the highest ratio, against the same call
    with the full cache (prefill and decoding); ``overhead`` = PRKV's seconds / full's.
    """
    e = config.eval

    def capture():
        return infer.prefill(model, x, lengths=lengths, return_stats=policy_needs(fns),
                             window=e.window, capacity=x.shape[1])[1:]

    def forward():  # the prefill forward alone: no captures, no policy
        return infer.prefill(model, x, lengths=lengths, capacity=x.shape[1])[1]

    cache, stats = capture()
    out = {"policies": {}}
    timed = {"forward": forward, "capture": capture}
    p = config.prkv
    for name, fn in fns.items():
        pol = policies.get(name)
        row = {"kept_bytes": {}}
        if name == "prkv":  # the policy's own steps, one PageRank solve for every ratio
            scores = _prkv_scores(cache, stats, alpha=p.alpha, iters=p.iters, graph=p.graph,
                                  solver=p.solver)
            def fn(c, st, b, scores=scores):
                return _prkv_keep(c, st, scores, b, n_sink=p.n_sink, n_recent=p.n_recent,
                                  kernel_size=p.kernel_size)
        for r in ratios:
            budget = jnp.asarray(policies.budgets(lengths, r) if (r and pol.evicts)
                                 else lengths, jnp.int32)
            kept = fn(cache, stats, budget) if (r and pol.evicts) else cache
            row["kept_bytes"][str(r)] = float(kept.kept_bytes()) / x.shape[0]
        b = jnp.asarray(policies.budgets(lengths, max(ratios)), jnp.int32)
        fn = fns[name]                                   # the registered policy, timed
        timed[name] = lambda fn=fn, b=b: fn(cache, stats, b)
        out["policies"][name] = row
    seconds = _timed(timed, e.timing_repeats, "policies' scoring against the prefill forward")
    out["prefill_seconds"], out["capture_seconds"] = seconds["forward"], seconds["capture"]
    for name, row in out["policies"].items():
        row["score_seconds"] = seconds[name]
        row["score_fraction"] = seconds[name] / seconds["forward"]
    if "prkv" in fns:
        top = max(ratios)

        def run(policy, ratio):
            kw = generate_kwargs(tok, policy=policy, ratio=ratio, config=config, capacity=None)
            kw["stop_tokens"] = []            # every row decodes max_new_tokens
            return lambda: infer.generate(model, x, lengths=lengths, **kw).tokens

        seconds = _timed({"full": run("full", 0.0), "prkv": run("prkv", top)},
                         e.timing_repeats, "PRKV's generate against the full cache's")
        full_s, prkv_s = seconds["full"], seconds["prkv"]
        out["end_to_end"] = {"ratio": top, "full_seconds": full_s, "prkv_seconds": prkv_s,
                             "overhead": prkv_s / full_s}
    return out


def _tree_bytes(tree) -> int:
    return sum(int(v.size) * jnp.dtype(v.dtype).itemsize for v in jax.tree.leaves(tree))


def stat_shapes(cfg, needs, batch: int, t: int, window: int) -> dict:
    """``{field: ShapeDtypeStruct}`` of the :class:`lab.infer.policies.Stats` fields the
    statistics ``needs`` fill for ``batch`` prompts of ``t`` tokens (attention float32,
    queries in the model's dtype; the window's query positions with its queries)."""
    lbh, w = (cfg.n_layers, batch, cfg.n_heads), min(window, t)
    every = {"attn": ((*lbh, t, t), jnp.float32), "attn_colsum": ((*lbh, t), jnp.float32),
             "queries": ((*lbh, w, cfg.head_dim), cfg.jnp_dtype),
             "all_queries": ((*lbh, t, cfg.head_dim), cfg.jnp_dtype)}
    out = {n: jax.ShapeDtypeStruct(*every[n]) for n in needs}
    if "queries" in needs:
        out["query_positions"] = jax.ShapeDtypeStruct((batch, w), jnp.int32)
    return out


def stat_bytes(cfg, needs, batch: int, t: int, window: int) -> int:
    """Bytes of the prefill statistics ``needs`` (:func:`stat_shapes`)."""
    return _tree_bytes(stat_shapes(cfg, needs, batch, t, window))


def memory_costs(model, tok, x, names, ratios, config) -> dict:
    """Peak device memory of prefill + scoring + decoding per policy and ratio, against the
    full cache, at the experiment's longest context, with the bytes of each component.

    ``x``: ``eval.cost_batch_size`` prompts padded to the widest prompt of the run (``T``
    tokens); every row is taken as ``T`` tokens long (memory depends on shapes only, nothing
    is run). ``peak``: :func:`lab.infer.generate_memory` of the compiled greedy generate
    program, which holds the prompt forward, the policy's captures and scoring, the
    compaction and the decode loop: its arguments (weights, prompts) + outputs + XLA's
    temporary allocation (every intermediate, with buffers whose live ranges do not overlap
    sharing space: the compiler's own accounting of what is live together), with the decode
    cache sized to what the policy keeps plus ``eval.max_new_tokens``. Components, from
    shapes: ``weights`` (the model's state), ``prompt_cache`` (keys, values and positions of
    the ``T`` prompt tokens, live until eviction), ``decode_cache`` (the same at the decode
    capacity), ``statistics`` (:func:`stat_bytes` of what the policy captures) and
    ``scoring_temp`` (XLA's temporary allocation of the policy's jitted function alone on
    those inputs; PRKV's two variants only, 0 elsewhere). ``full`` at 0, PRKV at every
    ratio, every other evicting policy and ``prkv_dense`` (the same scores from materialised
    attention, :data:`lab.methods.prkv.DENSE`) at the highest: one compile each."""
    cfg, e = model.config, config.eval
    b, t = x.shape
    lengths = np.full((b,), t, np.int32)
    top, evicting = max(ratios), [r for r in ratios if r > 0]
    weights = _tree_bytes(nnx.state(model))
    cache = KVCache.init(cfg, b, t)
    prompt_cache = _tree_bytes(cache)
    budget = jax.ShapeDtypeStruct((b,), jnp.int32)

    def scoring_temp(pol, kwargs):
        stats = policies.Stats(lengths=jax.ShapeDtypeStruct((b,), jnp.int32),
                               **stat_shapes(cfg, pol.needs, b, t, e.window))
        fn = jax.jit(functools.partial(pol.fn, **kwargs))
        return infer.memory_analysis(fn.lower(cache, stats, budget))["temp"]

    out = {"context": t, "batch": b, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
           "head_dim": cfg.head_dim, "weights": weights, "prompt_cache": prompt_cache,
           "policies": {}}
    cells = [(n, r) for n in names for r in (
        [0.0] if n == "full" else evicting if n == "prkv" else [top])]
    cells += [("prkv_dense", top)] if "prkv" in names else []
    temps = {}
    for name, r in cells:
        pol = prkv_lib.DENSE if name == "prkv_dense" else policies.get(name)
        kwargs = policy_kwargs("prkv" if name == "prkv_dense" else name, config)
        kw = generate_kwargs(tok, policy=pol, ratio=r, config=config, capacity=None)
        mem = infer.generate_memory(model, x, lengths=lengths, **kw)
        if name not in temps and name in ("prkv", "prkv_dense") and r:
            temps[name] = scoring_temp(pol, kwargs)
        kept = int(policies.budgets([t], r)[0]) if (r and pol.evicts) else t
        row = {"peak": mem["total"], "arguments": mem["arguments"], "outputs": mem["outputs"],
               "temp": mem["temp"],
               "decode_cache": _tree_bytes(KVCache.init(cfg, b, kept + e.max_new_tokens)),
               "statistics": stat_bytes(cfg, pol.needs if (r and pol.evicts) else (), b, t,
                                        e.window),
               "scoring_temp": temps.get(name, 0) if (r and pol.evicts) else 0}
        out["policies"].setdefault(name, {})[str(r)] = row
    return out


def question_only(prompt: str) -> str:
    """The prompt's last line (the question), the context removed."""
    lines = prompt.rstrip("\n").split("\n")
    return lines[-1] + "\n"


def _claims(acc, agreement, costs, memory, solved, config) -> list[dict]:
    c, e = config.claims, config.eval
    high = [r for r in c.high_ratios if r in e.ratios]
    baselines = [p for p in e.policies if p not in ("full", "prkv")]
    out = []
    tasks = [t for t in acc if solved[t]]  # the model at full cache is a regime check
    if "prkv" in e.policies and baselines and high and tasks:
        def mean(p, ts):
            return float(np.mean([acc[t][p][str(r)] for t in ts for r in high]))
        best = max(baselines, key=lambda p: mean(p, tasks))
        out.append(claim(
            f"PRKV is at least on par with the best baseline at ratios {high} (mean over the "
            f"solved tasks {tasks}, margin {c.margin})", "mean exact match",
            {"prkv": mean("prkv", tasks), best: mean(best, tasks)},
            mean("prkv", tasks) >= mean(best, tasks) - c.margin))
        mh = c.multihop_task
        if mh in tasks:
            best_mh = max(baselines, key=lambda p: mean(p, [mh]))
            out.append(claim(f"PRKV is ahead of every baseline on {mh} at ratios {high}",
                             f"mean exact match on {mh}",
                             {"prkv": mean("prkv", [mh]), best_mh: mean(best_mh, [mh])},
                             mean("prkv", [mh]) > mean(best_mh, [mh])))
        else:
            out.append(claim(f"PRKV is ahead of every baseline on {mh} at ratios {high}",
                             f"mean exact match on {mh}", "task not solved at full cache",
                             False))
    if "prkv" in e.policies and baselines and high:
        def agree(p):
            return float(np.mean([agreement[t][p][str(r)] for t in agreement for r in high]))
        best = max(baselines, key=agree)
        # Testable only when some policy preserves more than the margin: 0 vs 0 says nothing.
        out.append(claim(f"PRKV preserves the full-cache output at least as often as the best "
                         f"baseline at ratios {high} (all tasks, margin {c.margin}; some policy "
                         f"must agree more than the margin)",
                         "mean agreement with the full-cache generation",
                         {"prkv": agree("prkv"), best: agree(best)},
                         agree("prkv") >= agree(best) - c.margin
                         and max(agree("prkv"), agree(best)) > c.margin))
    if "prkv" in memory.get("policies", {}) and "full" in memory["policies"]:
        full = memory["policies"]["full"]["0.0"]["peak"]
        rel = {r: row["peak"] / full for r, row in memory["policies"]["prkv"].items()}
        out.append(claim(f"PRKV's peak memory of prefill + scoring + decoding is at most the "
                         f"full cache's at every ratio ({memory['batch']} prompts of "
                         f"{memory['context']} tokens, compiled generate program)",
                         "PRKV peak / full-cache peak, per ratio", rel,
                         all(v <= 1.0 for v in rel.values())))
    first = next(iter(costs.values()))
    if "prkv" in first["policies"]:
        frac = first["policies"]["prkv"]["score_fraction"]
        out.append(claim("PRKV's scoring costs less than the prefill forward it follows",
                         "PRKV scoring time / prefill forward time", frac, frac < 1.0))
    if "end_to_end" in first:
        ee = first["end_to_end"]
        out.append(claim(f"PRKV's end-to-end overhead is low: prefill + captures + scoring + "
                         f"decoding at ratio {ee['ratio']:g} take at most "
                         f"{c.max_overhead:g}x the full cache's prefill + decoding",
                         "PRKV generate time / full-cache generate time", ee["overhead"],
                         ee["overhead"] <= c.max_overhead))
    return out


# Full-cache exact match each task must reach for the comparison to say anything.
REGIME_BAND = (0.3, 0.95)


def regime_checks(acc, band=REGIME_BAND) -> list[dict]:
    """PRKV's regime (``results["regime"]``), from ``results["accuracy"]`` alone: on every
    task the claims average over, the model answers at full cache with exact match in
    ``band`` (inclusive, to 1e-9). Below 0.3 the model rarely answers even with every key
    kept, so the policies' scores differ by a few prompts of noise and none can show what it
    keeps; above 0.95 the task is at the model's ceiling for its length, where the answer
    usually survives moderate eviction under every policy and the comparison rests on the
    highest ratios alone."""
    lo, hi = band
    return [regime(f"the model solves {t} at full cache, not at ceiling: exact match in "
                   f"[{lo:g}, {hi:g}]", acc[t]["full"]["0.0"],
                   lo - 1e-9 <= acc[t]["full"]["0.0"] <= hi + 1e-9) for t in acc]


def main_table(results) -> list[dict]:
    """Exact match per policy (rows) and ratio (columns), mean over the tasks: the report's
    "mean over tasks" table, from ``results["accuracy"]``."""
    acc = results["accuracy"]
    first = next(iter(acc.values()))
    ratios = sorted(first["full"], key=float)
    return [{"policy": p, **{f"r={float(r):g}": float(np.mean([acc[t][p][r] for t in acc]))
                             for r in ratios if r in first[p]}}
            for p in first if p != "question_only"]


def ablation_name(alpha: float, kernel_size: int, restart: str = "window") -> str:
    name = f"alpha={alpha:g} kernel={kernel_size}"
    return name if restart == "window" else f"{name} restart={restart}"


def question_lengths(tok, prompts) -> np.ndarray:
    """Tokens of each prompt's question (its last line, :func:`question_only`)."""
    return np.array([len(tok.encode(question_only(p), add_bos=False)) for p in prompts],
                    np.int32)


def ablation_pairs(config) -> list[tuple[float, int]]:
    """The ablation's ``(alpha, kernel_size)`` pairs other than the main configuration's."""
    a, main = config.ablation, (config.prkv.alpha, config.prkv.kernel_size)
    return [(al, k) for al in a.alphas for k in a.kernel_sizes
            if ablation_name(al, k) != ablation_name(*main)]


def _ablation(model, tok, data, acc, width, capacity, ratios, config, shared=None) -> dict:
    """PRKV's exact match on ``config.ablation.task`` for every (alpha, kernel_size) pair
    at the non-zero ratios: ``{"task", "full", "main", "variants": {name: {ratio: acc}}}``
    (``{}`` when ``ablation.task`` is empty). The main configuration's row is the main
    table's (``acc``), not run twice; ``shared`` (``{(alpha, kernel, ratio): [correct]}``)
    holds the pairs the main loop already decoded from its own prefill and PageRank
    solves. With ``ablation.question_restart`` one more row: the main configuration
    restarting on each prompt's question instead of its last ``eval.window`` tokens (the
    paper's other restart choice)."""
    a = config.ablation
    if not a.task:
        return {}
    shared = shared or {}
    d, bs = data[a.task], config.eval.batch_size
    pad_id = int(tok.pad_id or 0)
    batches = [encode(tok, d["prompt"][i:i + bs], pad_id, width)
               + (d["answer"][i:i + bs], question_lengths(tok, d["prompt"][i:i + bs]))
               for i in range(0, len(d), bs)]
    # the question row observes up to the task's longest question (one window, one compile)
    question_window = max(config.eval.window, *(int(b[3].max()) for b in batches))

    main = ablation_name(config.prkv.alpha, config.prkv.kernel_size)
    done = acc[a.task].get("prkv", {})
    evicting = [r for r in ratios if r > 0]
    pairs = [(al, k) for al in a.alphas for k in a.kernel_sizes
             if not (ablation_name(al, k) == main and done)
             and (al, k, evicting[0]) not in shared]
    correct = {key: list(v) for key, v in shared.items()}
    for x, lengths, answers, qlens in batches if (pairs or a.question_restart) else ():
        cells = prkv_accuracy(model, tok, x, lengths, answers, ratios=evicting, config=config,
                              capacity=capacity, variants=pairs) if pairs else {}
        if a.question_restart:
            q = prkv_accuracy(model, tok, x, lengths, answers, ratios=evicting, config=config,
                              capacity=capacity, question_lengths=qlens,
                              window=question_window,
                              variants=[(config.prkv.alpha, config.prkv.kernel_size)])
            cells.update({("question", *key): v for key, v in q.items()})
        for key, (v, _) in cells.items():
            correct.setdefault(key, []).extend(v)
    variants = {}
    for al in a.alphas:
        for k in a.kernel_sizes:
            name = ablation_name(al, k)
            variants[name] = {str(r): done[str(r)] if name == main and done
                              else float(np.mean(correct[(al, k, r)])) for r in evicting}
    if a.question_restart:
        variants[ablation_name(config.prkv.alpha, config.prkv.kernel_size, "question")] = {
            str(r): float(np.mean(correct[("question", config.prkv.alpha,
                                           config.prkv.kernel_size, r)])) for r in evicting}
    return {"task": a.task, "full": acc[a.task]["full"]["0.0"], "main": main,
            "variants": variants}


def _ablation_claims(ablation, config) -> list[dict]:
    """The paper's premise on its multi-hop task: propagating importance over several hops
    (the largest alpha) keeps more than one hop from the window (the smallest alpha)."""
    if not ablation or len(config.ablation.alphas) < 2:
        return []
    high = [r for r in config.claims.high_ratios if r in config.eval.ratios]
    lo, hi, k = (min(config.ablation.alphas), max(config.ablation.alphas),
                 config.prkv.kernel_size if config.prkv.kernel_size in config.ablation.kernel_sizes
                 else config.ablation.kernel_sizes[0])

    def mean(alpha):
        row = ablation["variants"][ablation_name(alpha, k)]
        return float(np.mean([row[str(float(r))] for r in high]))

    return [claim(f"multi-hop PageRank (alpha={hi:g}) keeps more of {ablation['task']} than "
                  f"near one-hop scoring (alpha={lo:g}) at ratios {high} (kernel {k})",
                  "mean exact match", {f"alpha={hi:g}": mean(hi), f"alpha={lo:g}": mean(lo),
                                       "full cache": ablation["full"]},
                  mean(hi) > mean(lo))] if high else []


def _plot(acc, ratios, workdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(acc), figsize=(4.5 * len(acc), 3.6), squeeze=False)
    for ax, (task, rows) in zip(axes[0], acc.items(), strict=True):
        for p, row in rows.items():
            if p == "question_only":
                ax.axhline(row["0.0"], color="gray", ls=":", label="question only")
                continue
            ax.plot(ratios, [row[str(r)] for r in ratios], marker="o",
                    lw=2.5 if p == "prkv" else 1.2, label=p)
        ax.set(title=task, xlabel="compression ratio", ylabel="exact match", ylim=(-0.02, 1.02))
    axes[0][-1].legend(fontsize=7, loc="lower left")
    return save_figure(fig, workdir, "accuracy_vs_ratio.png")


def run(config, workdir: str) -> dict:
    """Runs the comparison; writes config.json, results.json, report.md and the plot."""
    check_config(config)
    t0 = time.time()
    e = config.eval
    model, tok, info = load_model(config)
    logging.info("prkv: model %s ready (%.0f s)", info["source"], time.time() - t0)
    pad_id = int(tok.pad_id or 0)
    kwargs = task_kwargs(config)
    data = {t: generate(t, e.n_per_task, seed=config.tasks.eval_seed, **kwargs[t])
            for t in config.tasks.names}
    longest = max(len(tok.encode(p, add_bos=True)) for d in data.values() for p in d["prompt"])
    width = -(-longest // 32) * 32
    capacity = width + e.max_new_tokens
    if capacity > model.config.max_len:
        raise ValueError(f"prompts of {width} tokens + eval.max_new_tokens {e.max_new_tokens} "
                         f"exceed the model's max_len {model.config.max_len}")
    ratios = [float(r) for r in e.ratios]
    acc, agreement, costs, memory, ablated = {}, {}, {}, {}, {}
    bs = e.batch_size
    fns = scorers(e.policies, config)
    for task, d in data.items():
        n = len(d)
        idx = [list(range(i, i + bs)) for i in range(0, n, bs)]
        idx = [[j % n for j in b] for b in idx]                 # the last batch wraps around
        rows, agree = {}, {}
        for b_i, b in enumerate(idx):
            x, lengths = encode(tok, [d["prompt"][j] for j in b], pad_id, width)
            qx, qlen = encode(tok, [question_only(d["prompt"][j]) for j in b], pad_id, width)
            answers = [d["answer"][j] for j in b]
            take = len(b) if b_i < len(idx) - 1 else n - b_i * bs
            ok = {"question_only": {0.0: accuracy(model, tok, qx, qlen, answers, policy="full",
                                                  ratio=0.0, config=config,
                                                  capacity=capacity)}}
            full = accuracy(model, tok, x, lengths, answers, policy="full", ratio=0.0,
                            config=config, capacity=capacity)
            # one prompt forward for every policy and ratio (what each generate call would
            # recompute), then each policy's compaction and decoding
            pre = prefill_once(model, tok, x, lengths, needs=policy_needs(e.policies),
                               window=e.window)
            evicting = [r for r in ratios if r > 0]
            cells = baseline_accuracy(model, tok, pre, lengths, answers, fns=fns,
                                      ratios=evicting, config=config, capacity=capacity)
            if "prkv" in e.policies:  # with the ablation's pairs on its task: same solves
                main = (config.prkv.alpha, config.prkv.kernel_size)
                pairs = ablation_pairs(config) if task == config.ablation.task else []
                for (al, k, r), v in prkv_accuracy(
                        model, tok, x, lengths, answers, ratios=evicting, config=config,
                        capacity=capacity, variants=[main, *pairs], pre=pre).items():
                    if (al, k) == main:
                        cells[("prkv", r)] = v
                    else:
                        ablated.setdefault((al, k, r), []).extend(v[0][:take])
            for p in e.policies:
                ok[p] = {r: full if r == 0 or not policies.get(p).evicts else cells[(p, r)]
                         for r in ratios if p != "full" or r == 0}
            for p, per_ratio in ok.items():
                for r, (v, texts) in per_ratio.items():
                    rows.setdefault(p, {}).setdefault(str(r), []).extend(v[:take])
                    same = [a == b for a, b in zip(texts, full[1], strict=True)]
                    agree.setdefault(p, {}).setdefault(str(r), []).extend(same[:take])
            if b_i == 0:
                cx, cl = x[:e.cost_batch_size], lengths[:e.cost_batch_size]
                if not costs:  # the first task's first batch
                    costs[task] = cache_costs(model, tok, cx, cl, fns, ratios, config)
                    memory = memory_costs(model, tok, cx, list(e.policies), ratios, config)
            logging.info("prkv: %s batch %d/%d done (%.0fs)", task, b_i + 1, len(idx),
                         time.time() - t0)
        acc[task] = {p: {r: float(np.mean(v)) for r, v in per.items()} for p, per in rows.items()}
        acc[task]["full"] = {str(r): acc[task]["full"]["0.0"] for r in ratios}
        agreement[task] = {p: {r: float(np.mean(v)) for r, v in per.items()}
                           for p, per in agree.items() if p not in ("full", "question_only")}
    ablation = _ablation(model, tok, data, acc, width, capacity, ratios, config, ablated)
    solved = {t: acc[t]["full"]["0.0"] >= config.claims.solved_accuracy for t in acc}
    claims = (_claims(acc, agreement, costs, memory, solved, config)
              + _ablation_claims(ablation, config))
    plot = _plot(acc, ratios, workdir)
    results = {"model": info, "width": width, "n_per_task": e.n_per_task, "accuracy": acc,
               "agreement": agreement, "solved": solved, "costs": costs, "memory": memory,
               "ablation": ablation, "claims": claims, "regime": regime_checks(acc),
               "seconds": time.time() - t0}
    write_outputs(workdir, name="prkv", config=config, results=results,
                  report=_report(acc, agreement, costs, memory, ablation, info, ratios,
                                 config),
                  plots=[plot])
    return results


def _report(acc, agreement, costs, memory, ablation, info, ratios, config) -> str:
    lines = [f"Model: `{info['source']}`"]
    if "train_seconds" in info:
        lines.append(f" ({info['params']} parameters, {info['steps']} steps, trained in "
                     f"{info['train_seconds']:.0f} s on this host when first built).")
    lines.append(f"\n{config.eval.n_per_task} prompts per task, greedy answers, exact match. "
                 "`question_only`: the prompt's last line alone (no context), at full cache; "
                 "for arithmetic the question is the whole prompt.\n")
    for task, rows in acc.items():
        table = [{"policy": p, **{f"r={r:g}": row.get(str(r)) for r in ratios}}
                 for p, row in rows.items()]
        lines += [f"### {task}", markdown_table(table, floatfmt=".3f")]
    mean_rows = []
    for p in config.eval.policies:
        mean_rows.append({"policy": p, **{f"r={r:g}": float(np.mean(
            [acc[t][p][str(r)] for t in acc])) for r in ratios}})
    lines += ["### mean over tasks", markdown_table(mean_rows, floatfmt=".3f")]
    agree_rows = [{"policy": p, **{f"r={r:g}": float(np.mean([agreement[t][p][str(r)]
                                                             for t in agreement]))
                                   for r in ratios}}
                  for p in config.eval.policies if p != "full"]
    lines += ["### agreement with the full cache (same generated text), mean over tasks",
              "Meaningful even where the model does not solve a task: how much of the "
              "model's own behaviour each policy preserves.",
              markdown_table(agree_rows, floatfmt=".3f")]
    if ablation:
        rows = [{"prkv": name + (" (main table)" if name == ablation["main"] else ""),
                 **{f"r={r:g}": row[str(r)] for r in ratios if r > 0}}
                for name, row in ablation["variants"].items()]
        lines += [f"### PRKV ablation on {ablation['task']}: damping alpha x score pooling",
                  f"Full cache {ablation['full']:.3f}. alpha near 0 scores one hop from the "
                  "window (SnapKV-like); 0.85 (networkx's default) walks about 6.7 hops before "
                  "a restart. kernel = average pooling of the scores over neighbouring "
                  "positions (1 = none; SnapKV's is 5). restart=question: the walk restarts "
                  "on the prompt's question (its last line) instead of its last "
                  f"{config.eval.window} tokens.", markdown_table(rows, floatfmt=".3f")]
    for task, tc in costs.items():
        kb = [{"policy": p, **{f"r={r:g}": row["kept_bytes"][str(r)] for r in ratios},
               "score ms": 1e3 * row["score_seconds"], "score / prefill": row["score_fraction"]}
              for p, row in tc["policies"].items()]
        lines += [f"### KV bytes kept per example and scoring time: {task}",
                  f"prefill forward {1e3 * tc['prefill_seconds']:.1f} ms per batch of "
                  f"{config.eval.cost_batch_size} prompts; the forward capturing the "
                  f"statistics the policies need ({', '.join(policy_needs(config.eval.policies))}) "
                  f"{1e3 * tc['capture_seconds']:.1f} ms.", markdown_table(kb, floatfmt=".4g")]
        if "end_to_end" in tc:
            ee = tc["end_to_end"]
            lines += [f"End to end (one generate call, {config.eval.max_new_tokens} new tokens "
                      f"per row, no stop token): full cache {ee['full_seconds']:.3f} s, PRKV at "
                      f"ratio {ee['ratio']:g} (prefill, captures, scoring, decoding) "
                      f"{ee['prkv_seconds']:.3f} s: overhead {ee['overhead']:.3g}x."]
    lines += [memory_report(memory)]
    return "\n\n".join(lines) + "\n"


MIB = 2 ** 20


def memory_rows(memory) -> list[dict]:
    """The memory table (MiB): one row per (policy, ratio) of :func:`memory_costs`."""
    rows = []
    for p, per in memory["policies"].items():
        for r, m in per.items():
            rows.append({"policy": p, "ratio": float(r), "peak": m["peak"] / MIB,
                         "XLA temp": m["temp"] / MIB, "statistics": m["statistics"] / MIB,
                         "scoring temp": m["scoring_temp"] / MIB,
                         "decode cache": m["decode_cache"] / MIB,
                         "peak / full": m["peak"] / memory["policies"]["full"]["0.0"]["peak"]})
    return rows


def memory_report(memory) -> str:
    return "\n\n".join([
        f"### Peak memory of prefill + scoring + decoding (MiB; {memory['batch']} prompts of "
        f"{memory['context']} tokens)",
        f"`peak`: arguments + outputs + XLA's temporaries of the compiled generate program "
        f"(`lab.infer.generate_memory`). Held by every row: weights "
        f"{memory['weights'] / MIB:.3g} MiB (in the arguments) and the prompt's full cache "
        f"{memory['prompt_cache'] / MIB:.3g} MiB until eviction (in the temporaries). "
        f"`statistics`: what the policy captures; `scoring temp`: the policy's jitted function's "
        f"own temporaries (PRKV's variants only); `decode cache`: kept entries + new tokens. "
        f"`prkv_dense`: PRKV on materialised attention (`Stats.attn`), the same kept set.",
        markdown_table(memory_rows(memory), floatfmt=".4g")])


if __name__ == "__main__":
    launch.main(run)
