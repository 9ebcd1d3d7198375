"""Greedy decode and prefill speed: ``lab.infer`` against Hugging Face ``transformers``.

Both run the same randomly initialised Qwen3 (hidden 256, 4 layers, 8 heads,
2 KV heads, head_dim 32, vocab 256, d_ff 768): the benchmark builds
``Qwen3ForCausalLM``, copies its weights into ``lab.nn.Transformer`` and checks
that the logits agree before timing. Batch 8, prompt 128, 128 new tokens, on
this CPU in one process (torch on 2 threads, and on 1 thread too: on a loaded
machine torch's second thread can make it much slower, and the comparison
takes transformers' faster setting). Both sides are warmed up first
(compilation excluded) and each measurement is the best of ``--repeats``
interleaved runs, so that load from other processes hurts both sides alike;
CPU seconds (``time.process_time``, all threads) are printed beside wall time.

    python benchmarks/decode.py [--repeats 5] [--batch 8] [--prompt 128] [--new 128]

Prints tokens/s for each side, the ratios, and the KV cache's bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from lab import hf as lab_hf  # noqa: E402
from lab import infer  # noqa: E402
from lab.nn import Transformer, TransformerConfig  # noqa: E402

CONFIG = dict(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32,
              d_ff=768, rope_theta=10_000.0, norm_eps=1e-6, qk_norm=True, tie_embeddings=True,
              max_len=512)


def hf_model(seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised ``Qwen3ForCausalLM`` with :data:`CONFIG`'s shapes (float32)."""
    c = CONFIG
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=c["vocab_size"], hidden_size=c["d_model"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv_heads"], head_dim=c["head_dim"],
                      intermediate_size=c["d_ff"], rms_norm_eps=c["norm_eps"],
                      max_position_embeddings=c["max_len"], tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
                      pad_token_id=0, bos_token_id=None, eos_token_id=None)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # random init ties weights; give the norms non-trivial values too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def lab_from_hf(hf: Qwen3ForCausalLM) -> Transformer:
    """``lab.nn.Transformer`` with the weights of ``hf``, through ``lab.hf``'s loader
    (a ``save_pretrained`` directory; q/k/v and gate/up are fused on load)."""
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        model = lab_hf.load_pretrained(tmp, dtype="float32")
    assert model.config == TransformerConfig(**CONFIG), model.config
    return model


def timed(fn) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of this process)`` of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, t, n = args.batch, args.prompt, args.new

    hf = hf_model()
    lab = lab_from_hf(hf)
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, CONFIG["vocab_size"], (b, t)).astype(np.int64)
    ids = torch.from_numpy(prompt)

    # Same weights, same function: the logits must agree before anything is timed.
    with torch.no_grad():
        ref = hf(ids).logits.numpy()
    ours = np.asarray(infer.prefill(lab, prompt)[0])
    err = float(np.abs(ours - ref).max())
    assert err < 1e-3, f"lab and transformers logits differ by {err}"

    def hf_generate(impl):
        with torch.no_grad():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=n, min_new_tokens=n, cache_implementation=impl)

    def hf_prefill():
        with torch.no_grad():
            return hf(ids, use_cache=True).logits

    def lab_generate():
        return jax.block_until_ready(infer.generate(lab, prompt, max_new_tokens=n).tokens)

    def lab_prefill():
        return jax.block_until_ready(infer.prefill(lab, prompt))

    # Warm-up (compilation, allocator) and a check that both decode the same tokens.
    hf_tokens = hf_generate("dynamic")[:, t:].numpy()
    hf_generate("static")
    lab_tokens = np.asarray(lab_generate())
    hf_prefill(), lab_prefill()
    agree = float(np.mean(hf_tokens == lab_tokens))

    times = {k: [] for k in ("lab_gen", "lab_pre")}
    impls = [(threads, impl) for threads in sorted({args.threads, 1}, reverse=True)
             for impl in ("dynamic", "static")]
    for _ in range(args.repeats):  # interleaved, so load spikes hit both sides
        for threads, impl in impls:
            torch.set_num_threads(threads)
            times.setdefault(f"hf_gen[{threads}t,{impl}]", []).append(
                timed(lambda impl=impl: hf_generate(impl)))
            if impl == "static":
                times.setdefault(f"hf_pre[{threads}t]", []).append(timed(hf_prefill))
        torch.set_num_threads(args.threads)
        times["lab_gen"].append(timed(lab_generate))
        times["lab_pre"].append(timed(lab_prefill))
    best = {k: min(w for w, _ in v) for k, v in times.items()}
    cpu = {k: min(c for _, c in v) for k, v in times.items()}
    hf_key = min((k for k in best if k.startswith("hf_gen")), key=best.get)
    hf_2t = min((k for k in best if k.startswith(f"hf_gen[{args.threads}t")), key=best.get)
    hf_gen = best[hf_key]
    hf_pre_key = min((k for k in best if k.startswith("hf_pre")), key=best.get)
    best["hf_pre"] = best[hf_pre_key]
    new_tokens, prompt_tokens = b * n, b * t
    # Decode-only rates: generate time minus its prefill (each side's own prefill).
    lab_dec = new_tokens / max(best["lab_gen"] - best["lab_pre"], 1e-9)
    hf_threads = hf_key[len("hf_gen["):hf_key.index("t,")]
    hf_dec = new_tokens / max(hf_gen - best[f"hf_pre[{hf_threads}t]"], 1e-9)
    cache = infer.prefill(lab, prompt, capacity=t + n)[1]

    print(f"config: {CONFIG}")
    print(f"batch {b}, prompt {t}, new tokens {n}, torch threads {torch.get_num_threads()}, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, best of {args.repeats}")
    print(f"logits max |lab - hf| = {err:.2e}; greedy tokens agreeing: {agree:.3f}")
    print(f"generate (prefill + {n} steps), tokens/s: lab {new_tokens / best['lab_gen']:.0f}  "
          f"transformers {hf_key} {new_tokens / hf_gen:.0f}  "
          f"ratio {hf_gen / best['lab_gen']:.2f}x  (vs {hf_2t}: "
          f"{best[hf_2t] / best['lab_gen']:.2f}x)")
    print(f"decode only (generate - prefill), tokens/s: lab {lab_dec:.0f}  "
          f"transformers {hf_dec:.0f}  ratio {lab_dec / hf_dec:.2f}x")
    print(f"prefill, tokens/s: lab {prompt_tokens / best['lab_pre']:.0f}  "
          f"transformers {hf_pre_key} "
          f"{prompt_tokens / best['hf_pre']:.0f}  ratio {best['hf_pre'] / best['lab_pre']:.2f}x")
    print(f"KV cache for prompt + new ({t + n} slots x {b} rows): {cache.nbytes():,} bytes "
          f"(keys+values {cache.nbytes() - cache.positions.size * 4:,}, positions "
          f"{cache.positions.size * 4:,})")
    print(f"generate by CPU seconds (robust to load): lab {cpu['lab_gen']:.3f}s, "
          f"transformers {hf_key} {cpu[hf_key]:.3f}s, ratio {cpu[hf_key] / cpu['lab_gen']:.2f}x")
    for k, v in times.items():
        w = [x for x, _ in v]
        print(f"  {k}: wall best {min(w):.4f}s median {np.median(w):.4f}s, CPU best {cpu[k]:.4f}s")


if __name__ == "__main__":
    main()
