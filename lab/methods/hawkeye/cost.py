"""Cost functions for the Hawkeye search: measured wall time, or an analytic model.

A cost is an object with ``kind`` (``"measured"`` or ``"analytic"``, printed
next to every number it produces), ``__call__(workload, params) -> seconds``
(``inf`` for a configuration the target cannot run) and
``baseline(workload) -> seconds | None`` (the XLA/cuBLAS time, ``None`` when it
was not measured).

:class:`MeasuredCost` times the compiled kernel and the XLA reference on the
device this process runs on (median of ``repeats`` runs after a warm-up): the
only cost whose numbers are speeds. :class:`RooflineCost` is a roofline-style
model of a target from public spec-sheet figures (peak dense throughput per
dtype, HBM bandwidth, SM/CU count, shared memory), with tile efficiency, wave
quantisation, pipelining overlap, swizzle reuse, split-K reduction traffic and the
Mosaic GPU path (TMA copies issued by a producer warp: the consumer warps lose the
copy-issue share of their instruction slots, assumed 15%, and copies overlap the MMAs).
It is feature-naive on purpose: the target enters only through its spec-sheet
numbers, so it credits a knob wherever it is set (a Mosaic GPU backend on a GPU without
TMA, four stages where the compiler pipelines two, tiles that do not fit the MMA shape);
which features a target really has is what the taxonomy's unit tests decide. It ranks
configurations on a host without that GPU; it is not a measurement and it has no XLA
baseline.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax

from kernels_pallas.taxonomy import workloads as wl

# Approximate public spec-sheet figures (dense TFLOP/s, TB/s, SMs/CUs, KB shared memory).
SPECS = {
    "ampere": dict(tflops={"bf16": 312, "fp8": 312, "fp4": 312, "f32": 19.5}, tbps=2.0, units=108,
                   smem_kb=164),
    "hopper": dict(tflops={"bf16": 989, "fp8": 1979, "fp4": 1979, "f32": 67}, tbps=3.35,
                   units=132, smem_kb=228),
    "blackwell": dict(tflops={"bf16": 2250, "fp8": 4500, "fp4": 9000, "f32": 80}, tbps=8.0,
                      units=148, smem_kb=228),
    "mi350": dict(tflops={"bf16": 2300, "fp8": 4600, "fp4": 9200, "f32": 157}, tbps=8.0,
                  units=256, smem_kb=160),
}
_BYTES = {"float32": 4, "bfloat16": 2, "float8_e4m3fn": 1, "bf16": 2, "fp8_e4m3": 1,
          "fp8_e5m2": 1, "mxfp4": 0.53, "nvfp4": 0.56}
_CLASS = {"float32": "f32", "bfloat16": "bf16", "float8_e4m3fn": "fp8", "bf16": "bf16",
          "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "mxfp4": "fp4", "nvfp4": "fp4"}


@dataclasses.dataclass
class MeasuredCost:
    """Median wall time of the compiled kernel on this device (seconds)."""

    repeats: int = 10
    kind: str = "measured"

    def _time(self, fn) -> float:
        jax.block_until_ready(fn())
        ts = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    def __call__(self, w: wl.Workload, params: dict) -> float:
        args = wl.make_inputs(w)
        return self._time(lambda: wl.run_kernel(w, params, args, interpret=False))

    def baseline(self, w: wl.Workload) -> float:
        args = wl.make_inputs(w)
        return self._time(lambda: wl.run_reference(w, args))


@dataclasses.dataclass
class RooflineCost:
    """Analytic roofline-style time of a candidate on ``target`` (module docstring)."""

    target: str
    kind: str = "analytic"
    launch_us: float = 3.0

    def __call__(self, w: wl.Workload, params: dict) -> float:
        spec = SPECS[self.target]
        if w.op in ("matmul", "scaled_matmul"):
            return self._matmul(w, params, spec)
        if w.op == "attention":
            b, h, t, s, d = w.shape
            bq, bk = params["block_q"], params["block_k"]
            smem = (bq * d + 2 * bk * d) * _BYTES[w.dtype] + bq * bk * 4
            if smem > spec["smem_kb"] * 1024:
                return math.inf
            programs = b * h * math.ceil(t / bq)
            eff = min(1.0, bq / 64) * min(1.0, bk / 64)
            flops = w.flops / (spec["tflops"][_CLASS[w.dtype]] * 1e12 * eff)
            traffic = (b * h * (t + 2 * s * math.ceil(t / bq)) * d * _BYTES[w.dtype]) / (
                spec["tbps"] * 1e12)
            waves = math.ceil(programs / spec["units"]) * spec["units"] / programs
            return max(flops * waves, traffic) + self.launch_us * 1e-6
        rows, d = w.shape  # bandwidth-bound: enough programs to fill the GPU, few enough
        programs = math.ceil(rows / params["block_rows"])  # to amortise per-program overhead
        traffic = 3 * rows * d * _BYTES[w.dtype] / (spec["tbps"] * 1e12)
        fill = min(1.0, programs / spec["units"])
        return traffic / fill + programs * 0.2e-6 / spec["units"] + self.launch_us * 1e-6

    def _matmul(self, w, p, spec) -> float:
        m, n, k = w.shape
        backend = p.get("backend", "triton")
        bm, bn, bk = p["block_m"], p["block_n"], p["block_k"]
        if backend == "mosaic_hopper":   # two consumer warpgroups side by side along N
            bn *= 2
        nbytes = _BYTES[w.dtype]
        smem = (bm * bk + bk * bn) * max(nbytes, 1) * max(p["num_stages"], 1)
        if smem > spec["smem_kb"] * 1024 or k < bk * p["split_k"]:
            return math.inf
        n_m, n_n = math.ceil(m / bm), math.ceil(n / bn)
        programs = n_m * n_n * p["split_k"]
        # tensor-core efficiency grows with the tile up to 128 and with the warps to feed it
        eff = min(1.0, bm / 128) * min(1.0, bn / 128) * min(1.0, bk / 32)
        if backend == "triton":
            eff *= 1.0 if p["num_warps"] * 32 * 32 >= bm * bn / 4 else 0.7
            eff *= 0.85   # consumer warps also issue the copies (assumed share, docstring)
        pad = (n_m * bm * n_n * bn) / (m * n)
        t_compute = w.flops * pad / (spec["tflops"][_CLASS[w.dtype]] * 1e12 * eff)
        waves = math.ceil(programs / spec["units"]) * spec["units"] / programs
        t_compute *= waves
        # operand traffic: A is re-read once per column of tiles, B once per row; grouped
        # ordering lets the programs of a group share panels through L2.
        reuse = min(p["group_m"], n_m) ** 0.5 if p["group_m"] > 1 else 1.0
        traffic = (m * k * n_n + k * n * n_m) * nbytes / reuse + m * n * 4 * p["split_k"]
        if not p["fuse_epilogue"]:
            traffic += 2 * m * n * 4
        t_mem = traffic / (spec["tbps"] * 1e12)
        overlap = p["num_stages"] >= 2 or backend != "triton"
        t = max(t_compute, t_mem) if overlap else t_compute + t_mem
        if p["num_stages"] > 2:
            t *= 1.0 - 0.03 * (p["num_stages"] - 2)
        return t + self.launch_us * 1e-6 * (2 if p["split_k"] > 1 else 1)

    def baseline(self, w: wl.Workload) -> None:
        return None
