"""Scaling of the sharded train step: ``lab.train.Trainer(mesh=...)`` on 1, 2, 4, 8 devices.

For each device count ``n`` a subprocess starts JAX with
``XLA_FLAGS=--xla_force_host_platform_device_count=n`` (host CPU devices; on a
GPU or TPU host pass ``--platform`` to use the real ones) and trains a
Transformer (``--size``) on a ``(n, 1)`` data-parallel mesh for a fixed global
batch (``--batch`` x ``--seq`` tokens per step), so more devices split the same
work. Timing: one warm-up ``fit`` compiles the step (``compiled_step`` caches
it), then ``--repeats`` timed ``fit`` calls of ``--steps`` updates each; the best
is kept. Printed per ``n``:

* tokens/s (wall clock) and tokens per CPU-second of the process;
* scaling efficiency ``tokens/s(n) / (n * tokens/s(1))`` (strong scaling: 1.0 is
  a perfect ``n``-fold speed-up). Host CPU devices share the machine's cores, so
  on a CPU this measures what sharding costs (collectives, partitioned
  programs), not a speed-up;
* the bytes of parameters + optimizer state (AdamW: two moments) on the device
  holding the most, as placed by ``Trainer.initial_state()`` (the arrays'
  ``addressable_shards``), without and with ``fsdp=True``, and their ratio, which
  ZeRO-3 / FSDP makes ``n`` (the check: within 10% of ``n``).

``python benchmarks/scale.py --devices 1 2 4 8 --size small`` prints a markdown
table (and ``--json PATH`` writes the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {  # d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, vocab
    "tiny": (64, 2, 8, 4, 8, 256, 256),
    "small": (128, 4, 8, 8, 16, 512, 1024),
    "medium": (256, 6, 8, 8, 32, 1024, 4096),
}


def child(args) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from lab import parallel
    from lab.nn import Transformer, TransformerConfig
    from lab.train import TrainConfig, Trainer, sft_loss

    n = jax.device_count()
    d, layers, heads, kv, hd, ff, vocab = SIZES[args.size]
    config = TransformerConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads,
                               n_kv_heads=kv, head_dim=hd, d_ff=ff, max_len=args.seq)
    train = TrainConfig(steps=args.steps, learning_rate=1e-3, warmup_steps=0,
                        schedule="constant", weight_decay=0.1, log_every=args.steps,
                        progress=False)
    rng = np.random.default_rng(0)
    data = rng.integers(0, vocab, (args.batch, args.seq + 1)).astype(np.int32)
    batch = {"inputs": data[:, :-1], "targets": data[:, 1:],
             "mask": np.ones((args.batch, args.seq), np.float32)}
    mesh = parallel.make_mesh(data=n, model=1)

    def build():
        return Transformer(config, rngs=nnx.Rngs(0))

    def per_device_bytes(fsdp: bool) -> int:
        state = Trainer(build(), sft_loss, train, mesh=mesh, fsdp=fsdp).initial_state()
        held: dict = {}
        for leaf in jax.tree.leaves((state["params"], state["opt_state"])):
            for shard in leaf.addressable_shards:
                held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
        return max(held.values())

    Trainer(build(), sft_loss, train.replace(steps=1), mesh=mesh).fit(lambda s: batch)
    best_wall, best_cpu, loss = float("inf"), float("inf"), None
    for _ in range(args.repeats):
        trainer = Trainer(build(), sft_loss, train, mesh=mesh)
        w0, c0 = time.perf_counter(), time.process_time()
        trainer.fit(lambda s: batch)
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
        loss = trainer.history[-1]["loss"]
    tokens = args.steps * args.batch * args.seq
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(build(), nnx.Param)))
    return {"devices": n, "platform": jax.devices()[0].platform, "params": int(n_params),
            "tokens_per_s": tokens / best_wall, "tokens_per_cpu_s": tokens / best_cpu,
            "final_loss": loss, "bytes": per_device_bytes(False),
            "bytes_fsdp": per_device_bytes(True)}


def run(args) -> list[dict]:
    rows = []
    for n in args.devices:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if args.platform == "cpu":
            env.update(JAX_PLATFORMS="cpu",
                       XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--size", args.size,
               "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
               "--repeats", str(args.repeats)]
        if args.platform != "cpu":  # the first n real devices
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(n)))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            raise SystemExit(f"devices={n} failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"# devices={n} done", file=sys.stderr, flush=True)
    base = rows[0]["tokens_per_s"] / rows[0]["devices"]
    for r in rows:
        r["efficiency"] = r["tokens_per_s"] / (r["devices"] * base)
        r["fsdp_ratio"] = r["bytes"] / r["bytes_fsdp"]
        r["fsdp_within_10pct"] = abs(r["fsdp_ratio"] / r["devices"] - 1) <= 0.10
    return rows


def table(rows: list[dict], args) -> str:
    head = (f"size {args.size} ({rows[0]['params'] / 1e6:.2f}M params), global batch "
            f"{args.batch} x {args.seq} tokens, {args.steps} steps, best of {args.repeats}, "
            f"mesh (n, 1), {rows[0]['platform']}\n\n")
    lines = ["| devices | tokens/s | tokens/CPU-s | scaling efficiency | params + opt bytes "
             "per device | with FSDP | ratio (ideal = devices) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['devices']} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_cpu_s']:,.0f} | {r['efficiency']:.2f} | "
                     f"{r['bytes'] / 2**20:.2f} MiB | {r['bytes_fsdp'] / 2**20:.3f} MiB | "
                     f"{r['fsdp_ratio']:.2f}{'' if r['fsdp_within_10pct'] else ' (off by >10%)'}"
                     " |")
    return head + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bad = [n for n in args.devices if n < 1 or args.batch % n]
    if bad:
        raise SystemExit(f"--devices {bad}: each must be >= 1 and divide --batch={args.batch}")
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = run(args)
    print(table(rows, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
