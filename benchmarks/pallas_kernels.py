"""Each Pallas kernel next to its XLA counterpart.

  python benchmarks/pallas_kernels.py            # CPU: interpret-mode correctness only
  python benchmarks/pallas_kernels.py --repeats 50   # GPU: median times and ratios
  python benchmarks/pallas_kernels.py --device   # GPU only: each taxonomy strategy's kernel vs XLA

On a CPU the kernels can only run in Pallas interpret mode, whose time says
nothing about GPU speed, so the benchmark reports correctness (max relative
error against the XLA reference) and says that no speed was measured. On a GPU
it times the compiled kernel and the XLA op at realistic shapes (median of
``--repeats`` runs after a warm-up) and prints the ratio XLA time / kernel time.

``--device`` times, on the GPU this process runs on (one of the taxonomy's four
targets), each strategy's expert kernel for that target at its hardware shape next to
XLA (``jnp.dot``, i.e. cuBLAS/hipBLASLt, for the matmuls) and next to the strategy's
unoptimised baseline, and prints the side-by-side ratios. The whole run stays under five
minutes (kernels past ``--budget-s`` are listed as not timed). Without a GPU it says so
and exits with status 2: nothing is timed and nothing is reported as measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax

from kernels_pallas.taxonomy import workloads as wl

# (name, workload at GPU size, workload at interpret size, kernel parameters)
_MM = dict(block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=8, split_k=1,
           group_m=8, grid_order="mn", fuse_epilogue=True)
CASES = [
    ("matmul bf16", wl.Workload("matmul", (4096, 4096, 4096), "bfloat16"),
     wl.Workload("matmul", (256, 256, 128), "bfloat16"), _MM),
    ("matmul fp8 e4m3", wl.Workload("matmul", (4096, 4096, 4096), "float8_e4m3fn"),
     wl.Workload("matmul", (256, 256, 128), "float8_e4m3fn"), _MM),
    ("scaled matmul fp8 (row scales)", wl.Workload("scaled_matmul", (4096, 4096, 4096),
                                                   "fp8_e4m3", "row"),
     wl.Workload("scaled_matmul", (128, 128, 128), "fp8_e4m3", "row"), _MM),
    ("scaled matmul mxfp4", wl.Workload("scaled_matmul", (4096, 4096, 4096), "mxfp4"),
     wl.Workload("scaled_matmul", (128, 128, 128), "mxfp4"), _MM),
    ("scaled matmul nvfp4", wl.Workload("scaled_matmul", (4096, 4096, 4096), "nvfp4"),
     wl.Workload("scaled_matmul", (128, 128, 128), "nvfp4"), _MM),
    ("flash attention bf16", wl.Workload("attention", (4, 16, 4096, 4096, 128), "bfloat16"),
     wl.Workload("attention", (1, 2, 128, 128, 64), "bfloat16"), dict(block_q=64, block_k=64)),
    ("rmsnorm + residual bf16", wl.Workload("rmsnorm", (16384, 4096), "bfloat16"),
     wl.Workload("rmsnorm", (64, 256), "bfloat16"), dict(block_rows=16)),
]


def _median(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def run(repeats: int = 20) -> list[dict]:
    """One row per kernel: correctness on CPU (interpret), time ratios on a GPU."""
    on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
    rows = []
    for name, big, small, params in CASES:
        w = big if on_gpu else small
        args = wl.make_inputs(w)
        out = wl.run_kernel(w, params, args, interpret=not on_gpu)
        err = wl.max_rel_error(out, wl.run_reference(w, args))
        row = {"kernel": name, "shape": "x".join(map(str, w.shape)), "max_rel_err": err,
               "ok": err <= wl.tolerance(w)}
        if on_gpu:
            t_k = _median(lambda w=w, a=args, p=params: wl.run_kernel(w, p, a, interpret=False),
                          repeats)
            t_x = _median(lambda w=w, a=args: wl.run_reference(w, a), repeats)
            row.update(kernel_ms=t_k * 1e3, xla_ms=t_x * 1e3, xla_over_kernel=t_x / t_k)
        rows.append(row)
    return rows


def _time_strategy(s, target: str, w: wl.Workload, repeats: int) -> dict:
    """The example of ``s`` for ``target`` on ``w``: error, kernel / XLA / baseline times."""
    params, args = s.params[target], wl.make_inputs(w)
    err = wl.max_rel_error(wl.run_kernel(w, params, args, interpret=False),
                           wl.run_reference(w, args))
    t_k = _median(lambda: wl.run_kernel(w, params, args, interpret=False), repeats)
    t_x = _median(lambda: wl.run_reference(w, args), repeats)
    base_w = w
    if s.name == "mma":   # the baseline is the same tiles on float32 operands
        base_w = dataclasses.replace(w, dtype="float32")
    elif s.name == "block_scaled_lowp":   # the baseline is the unscaled bf16 matmul
        base_w = wl.Workload("matmul", w.shape, "bfloat16")
    base_args = args if base_w is w else wl.make_inputs(base_w)
    t_b = _median(lambda: wl.run_kernel(base_w, s.baseline, base_args, interpret=False),
                  repeats)
    return dict(status="measured", max_rel_err=err, ok=err <= wl.tolerance(w, params),
                kernel_ms=t_k * 1e3, xla_ms=t_x * 1e3, xla_over_kernel=t_x / t_k,
                baseline_ms=t_b * 1e3, baseline_over_kernel=t_b / t_k)


def run_device(repeats: int = 10, budget_s: float = 270.0) -> list[dict]:
    """One row per strategy the running target has: its kernel vs XLA and vs its baseline."""
    from kernels_pallas import taxonomy as tx

    target = tx.detect()
    if target is None:
        dev = jax.devices()[0]
        raise RuntimeError(f"no GPU of the taxonomy's targets here ({dev.platform}:"
                           f"{dev.device_kind})")
    started, rows = time.perf_counter(), []
    for s in tx.STRATEGIES:
        if not s.supported(target):
            rows.append({"strategy": s.name, "target": target, "status": "target lacks it"})
            continue
        w = tx.workload_for(s, target, "hardware")
        row = {"strategy": s.name, "target": target, "shape": "x".join(map(str, w.shape)),
               "dtype": w.dtype}
        if time.perf_counter() - started > budget_s:
            rows.append(dict(row, status=f"not timed: past the {budget_s:.0f} s budget"))
            continue
        try:
            rows.append(dict(row, **_time_strategy(s, target, w, repeats)))
        except Exception as e:  # noqa: BLE001  (a kernel that fails here is reported)
            rows.append(dict(row, status=f"failed: {type(e).__name__}: {str(e)[:120]}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", action="store_true",
                        help="GPU only: time every strategy's kernel vs XLA and its baseline")
    parser.add_argument("--budget-s", type=float, default=270.0)
    args = parser.parse_args()
    dev = jax.devices()[0]
    if args.device:
        from kernels_pallas import taxonomy as tx
        from lab.outputs import markdown_table

        if dev.platform not in ("gpu", "cuda", "rocm") or tx.detect() is None:
            print(f"no GPU present (device {dev.platform}:{dev.device_kind}; --device needs an "
                  "Ampere, Hopper, Blackwell or MI350 GPU): nothing was timed.", file=sys.stderr)
            sys.exit(2)
        rows = run_device(min(args.repeats, 10), args.budget_s)
        print(f"device: {dev.platform}:{dev.device_kind} (target {tx.detect()})")
        print(markdown_table(rows, ["strategy", "target", "shape", "dtype", "status", "ok",
                                    "kernel_ms", "xla_ms", "xla_over_kernel", "baseline_ms",
                                    "baseline_over_kernel"]))
        return
    dev = jax.devices()[0]
    rows = run(args.repeats)
    print(f"device: {dev.platform}:{dev.device_kind}")
    if dev.platform == "cpu":
        print("CPU host: kernels ran in Pallas interpret mode; this reports correctness only "
              "(no speed was measured; interpret-mode time says nothing about GPU speed).")
    from lab.outputs import markdown_table

    print(markdown_table(rows))


if __name__ == "__main__":
    main()
