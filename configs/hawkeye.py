"""Hawkeye: the taxonomy's correctness sweep and the strategy-stacking kernel search.

Run:
  python -m experiments.hawkeye --config=configs/hawkeye.py:default --workdir=/tmp/hawkeye

Presets: ``test`` (seconds: two strategies, tiny shapes, budget 3), ``default``
(about a minute on one CPU core: every strategy on every architecture in interpret mode
with its positive and negative unit tests, every format, four searches and the grounded vs
ungrounded comparison on four targets with an analytic cost model),
``paper`` (the same plus large budgets; on a GPU host the searches time the
kernels and report speed next to XLA/cuBLAS).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset

STRATEGIES = ["tiling", "pipelining", "mma", "bulk_copy", "warp_specialization", "split_k",
              "epilogue_fusion", "block_scaled_lowp", "online_softmax", "grid_swizzle"]
TARGETS = ["ampere", "hopper", "blackwell", "mi350"]
FORMATS = ["bf16", "fp8_e4m3", "fp8_e5m2", "mxfp4", "nvfp4"]


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seed = 0

    # Correctness sweep (interpret mode on any host).
    c.sweep = ml_collections.ConfigDict()
    c.sweep.strategies = list(STRATEGIES)
    c.sweep.targets = list(TARGETS)
    c.sweep.formats = list(FORMATS)
    c.sweep.lowering = True
    c.sweep.expert_kernels = True    # JAX's Mosaic GPU Hopper kernel in GPU interpret mode
    c.sweep.quant_rows = 8
    c.sweep.quant_cols = 80          # not a multiple of 32: exercises the padding
    c.sweep.matmul_shape = [32, 32, 64]

    # Search: "op:MxNxK:dtype@target" entries; budget = candidates tried per search.
    c.search = ml_collections.ConfigDict()
    # (the bf16 GEMMs are searched in the comparison below)
    c.search.workloads = [
        "scaled_matmul:4096x4096x4096:mxfp4@blackwell",
        "attention:4x16x4096x4096x128:bfloat16@hopper",
        "rmsnorm:16384x4096:bfloat16@mi350",
    ]
    c.search.budget = 8
    c.search.batch = 4

    # The paper's comparison: the search grounded in the taxonomy's unit tests vs the same
    # search without them (same proposer, seed and budget), one bf16 GEMM per target.
    c.compare = ml_collections.ConfigDict()
    c.compare.workloads = [f"matmul:4096x4096x4096:bfloat16@{t}" for t in TARGETS]
    c.compare.budget = 16

    # On a GPU host only: measured speed of the best kernels vs XLA/cuBLAS.
    c.gpu = ml_collections.ConfigDict()
    c.gpu.workloads = ["matmul:4096x4096x4096:bfloat16", "matmul:4096x4096x4096:float8_e4m3fn",
                       "attention:4x16x4096x4096x128:bfloat16"]
    c.gpu.budget = 16
    c.gpu.repeats = 20

    if preset == "test":
        c.sweep.strategies = ["split_k"]
        c.sweep.targets = ["ampere", "hopper"]
        c.sweep.formats = ["mxfp4"]
        c.sweep.quant_cols = 40
        c.sweep.expert_kernels = False
        c.search.workloads = ["matmul:256x256x256:float32@ampere"]
        c.search.budget = 2
        c.search.batch = 3
        c.compare.workloads = ["matmul:1024x1024x1024:bfloat16@mi350"]
        c.compare.budget = 4
        c.gpu.budget = 4
        c.gpu.repeats = 5
    elif preset == "paper":
        c.search.budget = 64
        c.compare.budget = 64
        c.gpu.budget = 64
    return c
