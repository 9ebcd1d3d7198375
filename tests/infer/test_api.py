"""The public inference API: eviction during decoding, continued generation, absolute
budgets, returned statistics, the policy registry and lazy imports."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from lab import infer
from lab.infer import decode, policies
from tests.infer.conftest import CFG


def prompt_batch(lengths, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, CFG.vocab_size, (len(lengths), max(lengths))).astype(np.int32)
    for b, n in enumerate(lengths):
        x[b, n:] = 0
    return x, np.array(lengths, np.int32)


def kept_per_head(cache) -> np.ndarray:
    """``[L, B, Hkv]`` valid entries."""
    return np.asarray((cache.positions >= 0).sum(-1))


def test_compress_every_equals_step_by_step_eviction(model):
    # The reference: prefill, then greedy steps with decode.step, and StreamingLLM
    # applied to the whole cache after every N steps, by hand on host.
    x, lens = prompt_batch([14, 10])
    budget, every, n = 8, 3, 10
    gen = infer.generate(model, x, lengths=lens, max_new_tokens=n, policy="streaming_llm",
                         budget=budget, compress_every=every, return_cache=True)
    logits, cache = infer.prefill(model, x, lengths=lens, policy="streaming_llm", budget=budget,
                                  capacity=budget + every + 1)
    tok = np.asarray(jnp.argmax(logits[np.arange(2), lens - 1], -1))
    want, peak = [tok], 0
    for i in range(1, n):
        step_logits, cache, _ = decode.step(model, cache, jnp.asarray(tok),
                                            jnp.asarray(lens + i - 1))
        peak = max(peak, kept_per_head(cache).max())
        if i % every == 0:
            cache = policies.streaming_llm(cache, policies.Stats(lengths=lens + i), budget)
        tok = np.asarray(jnp.argmax(step_logits, -1))
        want.append(tok)
    np.testing.assert_array_equal(gen.tokens, np.stack(want, 1))
    assert peak == budget + every  # the cache never grew past budget + compress_every
    # Without compression the same budget gives other tokens: the test sees eviction.
    plain = infer.generate(model, x, lengths=lens, max_new_tokens=n, policy="streaming_llm",
                           budget=budget)
    assert not np.array_equal(plain.tokens, gen.tokens)
    # The returned cache holds sinks + the most recent tokens, the last one included.
    pos = np.asarray(gen.cache.positions[0, 0, 0])
    assert {0, 1, 2, 3, 14 + n - 1} <= set(pos[pos >= 0].tolist())
    np.testing.assert_array_equal(gen.cache.next_position, lens + n)


@pytest.mark.parametrize("policy", ["snapkv", pytest.param("h2o", marks=pytest.mark.deep),
                                    pytest.param("tova", marks=pytest.mark.deep)])
def test_compress_every_scores_with_the_recent_queries(model, policy):
    x, lens = prompt_batch([16, 12], seed=3)
    n, every = 12, 4
    # A budget that holds everything evicts nothing: the tokens are full-cache decoding's.
    full = infer.generate(model, x, lengths=lens, max_new_tokens=n)
    roomy = infer.generate(model, x, lengths=lens, max_new_tokens=n, policy=policy,
                           budget=16 + n, compress_every=every, window=every)
    np.testing.assert_array_equal(roomy.tokens, full.tokens)
    # A tight one keeps each head within budget + every, and changes what is generated.
    tight = infer.generate(model, x, lengths=lens, max_new_tokens=n, policy=policy, budget=6,
                           compress_every=every, window=every, return_cache=True)
    assert kept_per_head(tight.cache).max() <= 6 + every
    assert not np.array_equal(tight.tokens, full.tokens)


def test_continue_generation_equals_generating_from_the_whole_conversation(model):
    x, lens = prompt_batch([9, 6], seed=4)
    first = infer.generate(model, x, lengths=lens, max_new_tokens=5, return_cache=True)
    turn = [[7, 8, 9], [10, 11]]
    second = infer.continue_generation(model, first.cache, turn, max_new_tokens=6)
    rows = [list(x[b, :lens[b]]) + list(np.asarray(first.tokens[b])) + turn[b] for b in (0, 1)]
    ref = infer.generate(model, rows, max_new_tokens=6)
    np.testing.assert_array_equal(second.tokens, ref.tokens)
    np.testing.assert_allclose(second.logprobs, ref.logprobs, atol=1e-4)
    # Continuing twice works the same way (the cache returned by a continuation).
    again = infer.continue_generation(model, infer.continue_generation(
        model, first.cache, turn, max_new_tokens=6, return_cache=True).cache, [[3], [4]],
        max_new_tokens=2)
    rows2 = [r + list(np.asarray(second.tokens[b])) + [[3], [4]][b] for b, r in enumerate(rows)]
    np.testing.assert_array_equal(again.tokens, infer.generate(model, rows2,
                                                               max_new_tokens=2).tokens)


def test_options_object_equals_keywords(model):
    x, lens = prompt_batch([8, 5], seed=5)
    opts = infer.GenerateOptions(max_new_tokens=6, temperature=0.8, top_k=5, seed=3)
    a = infer.generate(model, x, lengths=lens, options=opts)
    b = infer.generate(model, x, lengths=lens, max_new_tokens=6, temperature=0.8, top_k=5,
                       seed=3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="either in options= or as keywords"):
        infer.generate(model, x, lengths=lens, options=opts, temperature=0.5)


def test_prefill_budget_and_returned_stats(model):
    x, lens = prompt_batch([12, 7], seed=6)
    _, cache, stats = infer.prefill(model, x, lengths=lens, policy="snapkv", budget=9,
                                    return_stats=True, window=4)
    # min(budget, T) entries kept per head: 9 of 12, all 7 of the short row.
    np.testing.assert_array_equal(kept_per_head(cache)[:, 0], 9)
    np.testing.assert_array_equal(kept_per_head(cache)[:, 1], 7)
    assert stats.queries.shape == (CFG.n_layers, 2, CFG.n_heads, 4, CFG.head_dim)
    assert stats.attn is None and stats.attn_colsum is None   # what snapkv needs, only
    np.testing.assert_array_equal(stats.query_positions, [[8, 9, 10, 11], [3, 4, 5, 6]])


def test_bad_eviction_arguments_name_the_limit(model):
    x, lens = prompt_batch([12, 7])
    with pytest.raises(ValueError, match="budget=13 exceeds the context of 12 tokens"):
        infer.prefill(model, x, lengths=lens, policy="snapkv", budget=13)
    with pytest.raises(ValueError, match="ratio=0.5 and budget=4"):
        infer.prefill(model, x, lengths=lens, policy="snapkv", ratio=0.5, budget=4)
    with pytest.raises(ValueError, match="compress_every=0; expected an int >= 1"):
        infer.generate(model, x, lengths=lens, max_new_tokens=4, policy="snapkv", budget=4,
                       compress_every=0)
    from lab.methods.prkv import DENSE  # PRKV on the materialised Stats.attn
    with pytest.raises(ValueError, match="needs the prompt's full attention graph"):
        infer.generate(model, x, lengths=lens, max_new_tokens=4, policy=DENSE, budget=4,
                       compress_every=2)
    with pytest.raises(ValueError, match="return_stats="):
        infer.prefill(model, x, lengths=lens, return_stats=("logits",))
    first = infer.generate(model, x, lengths=lens, max_new_tokens=2, return_cache=True)
    with pytest.raises(ValueError, match="tokens has 1 rows; the cache holds 2"):
        infer.continue_generation(model, first.cache, [[1, 2]], max_new_tokens=2)


def test_registry_decorator_and_lazy_builtins():
    @policies.register("test_keep_latest")
    def keep_latest(cache, stats, budget):
        del stats
        return policies.compact(cache, cache.positions.astype(jnp.float32), budget)

    assert policies.get("test_keep_latest").fn is keep_latest
    assert {"prkv", "snapkv", "h2o", "test_keep_latest"} <= set(policies.names())


def test_import_lab_is_lazy_and_builtin_policies_resolve_on_first_use():
    code = ("import sys, lab; before = sorted(m for m in ('jax', 'lab.infer', 'lab.methods.prkv')"
            " if m in sys.modules); p = lab.infer.policies.get('prkv');"
            " print(before, p.needs, 'lab.methods.prkv' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[] ('all_queries', 'queries') True"
