"""Training throughput: ``lab.train.Trainer`` against a plain ``transformers`` + torch loop.

Both sides train the same Qwen3 (hidden 256, 4 layers, 8 heads, 2 KV heads,
head_dim 32, vocab 256, d_ff 768, tied embeddings, q/k norm; ~3.08M params) in
float32 on batch 8 x seq 256, with the same recipe: AdamW (lr 1e-3, betas 0.9 /
0.999, eps 1e-8, weight decay 0.1 on matrices only), warm-up + cosine schedule,
global-norm clip 1.0, mean token cross-entropy. The torch model is the Lab model
written with ``lab.hf.save_pretrained`` and loaded by
``Qwen3ForCausalLM.from_pretrained`` (SDPA attention), so both start from the
same weights; the benchmark checks that their first losses agree and that their
losses still agree after the timed steps (same function, same optimizer).

Timing, on this CPU in one process, torch on ``--threads`` threads (XLA uses the
machine's cores, or one thread with ``--threads 1``). Both sides share the
process's allocator: glibc's defaults, or with ``LAB_MALLOC=tuned`` the settings of
:mod:`lab.host` (measured per host in docs/benchmarks.md):

* Lab: ``Trainer(model, sft_loss, config).fit(batch_fn)`` end to end (workdir
  None), after one identical warm-up fit that compiles the step, so each timed
  fit is ``--steps`` updates including the Trainer's own setup and host->device
  batch transfer;
* torch: ``--steps`` iterations of forward, loss, backward, clip, ``step``,
  scheduler, ``zero_grad`` after two warm-up iterations.

Each side is timed ``--repeats`` times, interleaved, and the best run is kept so
that load from other processes on the machine hurts both alike. Besides
wall-clock tokens/s the benchmark prints tokens per CPU-second of this process
(``time.process_time``), which load from other processes does not inflate, and
a third line: the same jitted ``value_and_grad`` + optax step without the
Trainer, which isolates the Trainer's own overhead from the model's speed.

Model-FLOPs utilisation: ``MFU = 6 * N * tokens_per_s / peak`` (Kaplan et al.
2020's 6N FLOPs per trained token, N = all parameters with the tied embedding
counted once because it is also the LM head; attention's T-dependent FLOPs are
left out, as in the 6N convention, and printed separately). ``peak`` is
measured: the best FLOP/s of a jitted float32 ``[n, n] @ [n, n]`` matmul in JAX
(``2 n^3`` FLOPs per call) on this CPU.

Last, the step's linear layers alone: forward, weight-gradient and input-gradient
products of each shape, jitted JAX against torch (MKL on this wheel), and the two
sums weighted by the step's FLOPs. That bounds what Lab can reach here: a step
cannot run faster than its matmuls.

bfloat16 mixed precision (``--precision bfloat16``, or ``both`` for the two
comparisons in one run): Lab's ``TrainConfig(precision="bfloat16")`` (the
Linear products in bfloat16 with float32 accumulation, see
:mod:`lab.train.step`) against the same torch loop with forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)``; both keep float32 weights and
AdamW state, so the recipe is unchanged, and their losses after the timed
updates agree to 2e-2. The matmul table then times the bf16 products each side
issues (Lab's float32-result products with materialised transposes, torch's
bf16 ``@``).

XLA's CPU options are read from ``XLA_FLAGS`` at start-up (the benchmark prints
them), e.g. ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=+reduce``; an
option the installed jaxlib does not know aborts the process.

    python benchmarks/train.py [--steps 8] [--repeats 3] [--threads 2]
                               [--precision float32|bfloat16|both]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _threads_from_argv(default: int = 2) -> int:
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return default


# XLA's CPU thread pool is sized at start-up: with --threads 1 both sides run single-threaded
# (on a 2-core machine the default XLA pool, 2 threads, matches --threads 2).
if _threads_from_argv() == 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
                               "false intra_op_parallelism_threads=1").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import Qwen3ForCausalLM  # noqa: E402

import lab  # noqa: E402
from lab.hf import save_pretrained  # noqa: E402
from lab.nn import Transformer, TransformerConfig  # noqa: E402
from lab.train import TrainConfig, Trainer, make_optimizer, sft_loss  # noqa: E402
from lab.train.config import PRECISIONS  # noqa: E402
from lab.train.step import _row_major_transpose, use_mixed_matmul  # noqa: E402

MODEL = TransformerConfig(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2,
                          head_dim=32, d_ff=768, qk_norm=True, tie_embeddings=True, max_len=512)
LR, WD, WARMUP, CLIP = 1e-3, 0.1, 2, 1.0


def _best(fn, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls of ``fn`` after one warm-up (compile) call."""
    fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
    """Best measured FLOP/s of a jitted float32 ``[n, n] @ [n, n]`` in JAX."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    return 2 * n**3 / _best(lambda: f(a, b).block_until_ready(), repeats)


def gemm_rates(tokens: int, repeats: int = 20,
               precision: str = "float32") -> list[tuple[str, float, float, float]]:
    """GFLOP/s of JAX (jitted) and torch on the step's linear layers, per product: forward
    ``x @ W``, weight gradient ``x.T @ dy`` and input gradient ``dy @ W.T`` with ``x`` of
    ``tokens`` rows. Returns ``(name, flops per step, jax, torch)`` rows, the FLOPs counting
    how many layers of the model have that shape: where the step's matmul time goes.

    ``precision="bfloat16"``: bf16 operands on both sides; JAX's products are the ones
    ``lab.train.step.MixedMatmul`` issues (float32 results, transposes materialised),
    torch's are plain bf16 ``@`` (bf16 results), as under autocast."""
    m = MODEL
    shapes = {"q/o": (m.d_model, m.n_heads * m.head_dim, 2 * m.n_layers),
              "k/v": (m.d_model, m.n_kv_heads * m.head_dim, 2 * m.n_layers),
              "gate/up": (m.d_model, m.d_ff, 2 * m.n_layers),
              "down": (m.d_ff, m.d_model, m.n_layers), "lm_head": (m.d_model, m.vocab_size, 1)}
    rng = np.random.default_rng(0)
    rows = []
    for name, (k, n, count) in shapes.items():
        x, w, dy = (rng.normal(size=s).astype(np.float32)
                    for s in ((tokens, k), (k, n), (tokens, n)))
        flops = 2 * tokens * k * n
        products = {"fwd": (lambda a, b: a @ b, x, w), "dW": (lambda a, b: a.T @ b, x, dy),
                    "dX": (lambda a, b: a @ b.T, dy, w)}
        mixed = {"fwd": lambda a, b: _dot32(a, b),
                 "dW": lambda a, b: _dot32(_row_major_transpose(a), b),
                 "dX": lambda a, b: _dot32(a, _row_major_transpose(b))}
        for kind, (f, a, b) in products.items():
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            jf = jax.jit(f)
            if precision == "bfloat16":
                jf, ja, jb = jax.jit(mixed[kind]), ja.astype(jnp.bfloat16), jb.astype(jnp.bfloat16)
                ta, tb = ta.bfloat16(), tb.bfloat16()
            t_jax = _best(lambda jf=jf, ja=ja, jb=jb: jf(ja, jb).block_until_ready(), repeats)
            t_torch = _best(lambda f=f, ta=ta, tb=tb: f(ta, tb), repeats)
            rows.append((f"{name} {kind} [{tokens}x{k}x{n}]", count * flops,
                         flops / t_jax / 1e9, flops / t_torch / 1e9))
    return rows


def _dot32(a, b):
    return jax.lax.dot(a, b, preferred_element_type=jnp.float32)


def make_batch(b: int, t: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.integers(0, MODEL.vocab_size, (b, t + 1))
    return {"inputs": x[:, :-1].astype(np.int32), "targets": x[:, 1:].astype(np.int32),
            "mask": np.ones((b, t), np.float32)}


def torch_trainer(hf: Qwen3ForCausalLM, steps: int, batch: dict, autocast: bool = False):
    """Returns ``run(n) -> last loss``: n plain torch training iterations, same recipe as Lab.

    ``autocast``: forward and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``
    (the float32 weights and AdamW state unchanged), PyTorch's bf16 mixed precision."""
    decay = [p for p in hf.parameters() if p.ndim >= 2]
    no_decay = [p for p in hf.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8)

    def lr_lambda(s):  # optax.warmup_cosine_decay_schedule(0, LR, WARMUP, steps, 0) / LR
        if s < WARMUP:
            return s / WARMUP
        span = max(steps, WARMUP + 1) - WARMUP
        return 0.5 * (1 + math.cos(math.pi * min(s - WARMUP, span) / span))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    inputs = torch.from_numpy(batch["inputs"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    hf.train()

    def run(n: int) -> float:
        for _ in range(n):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = hf(input_ids=inputs).logits
            logits = logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), CLIP)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=(*PRECISIONS, "both"), default="float32",
                    help="float32 (default), bfloat16 mixed precision against torch autocast, "
                         "or both")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, t, steps = args.batch, args.seq, args.steps
    tokens = b * t
    batch = make_batch(b, t)

    init = Transformer(MODEL, rngs=nnx.Rngs(0))
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(init, d)
        hf = Qwen3ForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    init_state = nnx.state(init)
    n_params = MODEL.num_params()
    assert n_params == sum(p.numel() for p in hf.parameters()), "parameter counts differ"

    # Same weights: the first losses must agree.
    lab_loss0 = float(sft_loss(init, batch)[0])
    with torch.no_grad():
        logits = hf(input_ids=torch.from_numpy(batch["inputs"].astype(np.int64))).logits
        torch_loss0 = float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            torch.from_numpy(batch["targets"].astype(np.int64)).reshape(-1)))
    assert abs(lab_loss0 - torch_loss0) < 1e-4, (lab_loss0, torch_loss0)

    results = {p: compare(p, args, init, init_state, batch)
               for p in (PRECISIONS if args.precision == "both" else (args.precision,))}
    print(f"model: Qwen3 {n_params / 1e6:.3f}M params, batch {b} x seq {t} = {tokens} tokens/step,"
          f" {steps} steps per timed run, best of {args.repeats}; torch threads "
          f"{torch.get_num_threads()}, jax devices {jax.devices()}, os.cpu_count {os.cpu_count()}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; LAB_MALLOC={lab.host.mode()} (tuned: "
          f"{lab.MALLOC_TUNED}); load average at the end: {os.getloadavg()}")
    print(f"first loss  lab {lab_loss0:.6f}  torch {torch_loss0:.6f}")
    work = tokens * steps
    for precision, res in results.items():
        tps = {k: work / min(w for w, _ in v) for k, v in res["runs"].items()}
        cpu_tps = {k: work / min(c for _, c in v) for k, v in res["runs"].items()}
        res["tps"] = tps
        if precision == "bfloat16":
            print("bfloat16 mixed precision: lab TrainConfig(precision='bfloat16') | torch "
                  "torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss; "
                  "float32 master weights and AdamW state on both sides")
        print(f"[{precision}] loss after {steps} updates  lab {res['lab_last']:.6f}  torch "
              f"{res['torch_last']:.6f}")
        names = {"lab": "lab Trainer.fit", "bare": "bare jitted jax step",
                 "torch": "torch train loop"}
        for k, name in names.items():
            walls = [round(w, 2) for w, _ in res["runs"][k]]
            cpus = [round(c, 2) for _, c in res["runs"][k]]
            print(f"[{precision}] {name:21s}: {tps[k]:8.0f} tokens/s wall (runs {walls} s), "
                  f"{cpu_tps[k]:8.0f} tokens per CPU-second (CPU {cpus} s)")
        print(f"[{precision}] (lab's first fit, compile included: {res['compile_s']:.1f} s)")
        print(f"[{precision}] ratio lab / torch : {tps['lab'] / tps['torch']:.2f}x wall-clock "
              f"(target >= 1.0x); {cpu_tps['lab'] / cpu_tps['torch']:.2f}x per CPU-second; "
              f"Trainer / bare jax step: {tps['lab'] / tps['bare']:.2f}x")
    if set(results) == set(PRECISIONS):
        f32, bf16 = results["float32"]["tps"], results["bfloat16"]["tps"]
        print(f"bfloat16 / float32 speed-up: lab {bf16['lab'] / f32['lab']:.2f}x, torch "
              f"{bf16['torch'] / f32['torch']:.2f}x")
    if "float32" not in results:
        print_gemms(tokens, "bfloat16")
        return
    tps = results["float32"]["tps"]
    peak = matmul_peak()
    flops_tok = 6 * n_params
    attn_tok = 6 * MODEL.n_layers * t * MODEL.n_heads * MODEL.head_dim  # 6 * L * T * d_attn
    print(f"[float32] peak (best jitted jax f32 matmul 2048^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"[float32] MFU = 6*N*tokens/s / peak: lab {flops_tok * tps['lab'] / peak:.1%}, "
          f"torch {flops_tok * tps['torch'] / peak:.1%}  (6N = {flops_tok / 1e6:.1f} MFLOP/token;"
          f" with attention +{attn_tok / 1e6:.1f} MFLOP/token: lab "
          f"{(flops_tok + attn_tok) * tps['lab'] / peak:.1%}, torch "
          f"{(flops_tok + attn_tok) * tps['torch'] / peak:.1%})")
    for precision in results:
        print_gemms(tokens, precision)


def print_gemms(tokens: int, precision: str) -> None:
    print(f"the step's matmuls alone in {precision}, GFLOP/s (jax jitted | torch), best of 20:")
    rates = gemm_rates(tokens, precision=precision)
    for name, _, jx, tr in rates:
        print(f"  {name:30s} {jx:7.1f} | {tr:7.1f}   jax/torch {jx / tr:.2f}x")
    jax_s = sum(f / jx for _, f, jx, _ in rates)
    torch_s = sum(f / tr for _, f, _, tr in rates)
    print(f"  all of them, weighted by the step's FLOPs: jax/torch {torch_s / jax_s:.2f}x "
          f"(jax {jax_s * 1e3 / 1e9:.0f} ms, torch {torch_s * 1e3 / 1e9:.0f} ms per step)")


def compare(precision: str, args, init, init_state, batch) -> dict:
    """Times Lab's Trainer, the bare jitted step and the torch loop in ``precision``.

    Returns ``{"runs": {side: [(wall s, CPU s), ...]}, "lab_last", "torch_last",
    "compile_s"}``; the losses after ``args.steps`` updates from the same weights must agree
    (to 1e-3 in float32, 2e-2 under bfloat16, where the two sides round differently)."""
    steps = args.steps
    cfg = TrainConfig(steps=steps, learning_rate=LR, warmup_steps=WARMUP, schedule="cosine",
                      optimizer="adamw", weight_decay=WD, grad_clip=CLIP, log_every=steps,
                      progress=False, precision=precision)
    autocast = precision == "bfloat16"

    def timed(fn):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        return time.perf_counter() - w0, time.process_time() - c0, out

    def lab_fit():
        model = Transformer(MODEL, rngs=nnx.Rngs(0))
        nnx.update(model, init_state)
        trainer = Trainer(model, sft_loss, cfg)
        trainer.fit(lambda step: batch)
        return trainer.history[-1]["loss"]

    # The same computation without the Trainer: one jitted value_and_grad + optax step.
    graphdef, params0 = nnx.split(init, nnx.Param)
    tx = make_optimizer(cfg)

    def loss_of(p, batch):
        model = nnx.merge(graphdef, p)
        if autocast:
            use_mixed_matmul(model, "bfloat16")
        return sft_loss(model, batch)[0]

    @jax.jit
    def bare_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_of)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jbatch = jax.tree.map(jnp.asarray, batch)

    def bare_fit():
        params, opt_state = params0, tx.init(params0)
        for _ in range(steps):
            params, opt_state, loss = bare_step(params, opt_state, jbatch)
        return float(loss)

    def hf_model():
        with tempfile.TemporaryDirectory() as d:
            save_pretrained(init, d)
            return Qwen3ForCausalLM.from_pretrained(d, torch_dtype=torch.float32)

    w0 = time.perf_counter()
    lab_fit()  # compiles the step
    compile_s = time.perf_counter() - w0
    bare_fit()
    run_torch = torch_trainer(hf_model(), 10**9, batch, autocast=autocast)
    run_torch(2)  # warm-up

    runs = {"lab": [], "bare": [], "torch": []}
    for _ in range(args.repeats):
        *lab_t, lab_last = timed(lab_fit)
        runs["lab"].append(lab_t)
        runs["bare"].append(timed(bare_fit)[:2])
        runs["torch"].append(timed(lambda: run_torch(steps))[:2])

    # Same function and optimizer: after `steps` identical updates the losses agree.
    torch_last = torch_trainer(hf_model(), steps, batch, autocast=autocast)(steps)
    tol = 2e-2 if autocast else 1e-3
    assert abs(lab_last - torch_last) < tol, (precision, lab_last, torch_last)
    return {"runs": runs, "lab_last": lab_last, "torch_last": torch_last,
            "compile_s": compile_s}


if __name__ == "__main__":
    main()
