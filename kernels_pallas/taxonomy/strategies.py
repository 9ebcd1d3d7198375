"""The ten recurring optimisation strategies of Hawkeye's taxonomy, one record each.

Each :class:`Strategy` says what it exploits, how each target architecture
provides it (absent = the architecture lacks the feature), its expert example
(a workload and, per architecture, the kernel parameters an expert picks), the
unoptimised baseline the example must beat on hardware, and what to look for in
code: ``lowering_markers`` (``{field}`` filled from the parameters) in the Triton
module lowered for the target's platform, one of the facts
:func:`~kernels_pallas.taxonomy.checks.unit_test` checks (a CPU host can run it),
``device_markers[arch]`` in the compiled device code (PTX/SASS or AMDGCN;
checked only on that hardware).

Examples run at a small "interpret" shape on CPU (the correctness test) and at
a "hardware" shape on a GPU (the payoff test). Where a feature is reachable only
through the Mosaic GPU backend (TMA bulk copies, warp specialisation), the
record names JAX's expert Mosaic GPU kernels as ``hardware_example``, and the
examples themselves select them through ``MatmulConfig.backend``.
"""

from __future__ import annotations

import dataclasses

from kernels_pallas.taxonomy.arch import NAMES
from kernels_pallas.taxonomy.workloads import Workload

_MM = dict(block_m=64, block_n=64, block_k=32, num_stages=2, num_warps=4, split_k=1, group_m=1,
           grid_order="mn", backend="triton", fuse_epilogue=True)
DOT = "\\00dot\\00"  # the tt.dot op name in the Triton module's string table
UNTILED = dict(_MM, block_m=16, block_n=16, block_k=16, num_stages=1)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One optimisation strategy of the taxonomy (module docstring)."""

    name: str
    exploits: str
    support: dict[str, str]            # arch -> how the hardware provides it
    interpret_workload: Workload
    hardware_workload: Workload
    params: dict[str, dict]            # arch -> the expert's kernel parameters
    baseline: dict                     # the unoptimised kernel parameters
    lowering_markers: tuple[str, ...] = ()
    device_markers: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    hardware_example: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: str = ""

    def supported(self, arch: str) -> bool:
        return arch in self.support

    def text(self) -> str:
        """A plain-text description (what a coding agent is given as context)."""
        lines = [f"## {self.name}", f"Exploits: {self.exploits}"]
        for a in NAMES:
            lines.append(f"- {a}: {self.support.get(a, 'not available')}; expert parameters "
                         f"{self.params.get(a)}; device markers {self.device_markers.get(a, ())}")
        lines.append(f"Unoptimised baseline: {self.baseline}")
        if self.notes:
            lines.append(f"Notes: {self.notes}")
        return "\n".join(lines)


def _per_arch(**overrides_by_arch) -> dict[str, dict]:
    return {a: dict(_MM, **overrides_by_arch.get(a, {})) for a in NAMES}


MM_SMALL = Workload("matmul", (128, 128, 64), "bfloat16")
MM_BIG = Workload("matmul", (4096, 4096, 4096), "bfloat16")
# Bulk copy and warp specialisation share one knob, the Mosaic GPU backend (JAX's expert
# TMA + warp-specialised matmuls): their examples, baseline and expert kernels are these.
_MOSAIC_PARAMS = _per_arch(
    hopper=dict(block_m=64, block_n=64, block_k=64, num_stages=2, backend="mosaic_hopper",
                fuse_epilogue=False),
    blackwell=dict(block_m=128, block_n=128, block_k=64, num_stages=2,
                   backend="mosaic_blackwell", fuse_epilogue=False))
_MOSAIC_BASELINE = dict(_MM, block_m=128, block_n=128, num_stages=1)
_MOSAIC_EXPERTS = {
    "hopper": "jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu.matmul",
    "blackwell": "jax.experimental.pallas.ops.gpu.blackwell_matmul_mgpu.matmul_kernel"}
_NV_MMA = {"ampere": ("mma.sync.aligned",), "hopper": ("wgmma.mma_async",),
           "blackwell": ("tcgen05.mma",), "mi350": ("v_mfma",)}

STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        "tiling", "data reuse in shared memory / registers: each operand tile loaded once "
        "per output tile instead of once per output element",
        {"ampere": "164 KB shared memory per SM", "hopper": "228 KB shared memory per SM",
         "blackwell": "228 KB shared memory + tensor memory", "mi350": "160 KB LDS per CU"},
        MM_SMALL, MM_BIG,
        _per_arch(ampere=dict(block_m=128, block_n=128, block_k=32),
                  hopper=dict(block_m=128, block_n=128, block_k=64, num_warps=8),
                  blackwell=dict(block_m=128, block_n=128, block_k=64, num_warps=8),
                  mi350=dict(block_m=128, block_n=128, block_k=64, num_warps=8)),
        UNTILED, (DOT,),
        {"ampere": (".shared",), "hopper": (".shared",), "blackwell": (".shared",),
         "mi350": ("ds_",)}),
    Strategy(
        "pipelining", "latency hiding: the loads of K step i+1..i+s-1 overlap the MMA of step i "
        "(multi-buffered shared memory)",
        {"ampere": "cp.async multi-stage buffers", "hopper": "TMA + mbarrier stages",
         "blackwell": "TMA + mbarrier stages", "mi350": "LDS double buffering (stream pipeliner)"},
        MM_SMALL, MM_BIG,
        _per_arch(ampere=dict(block_m=128, block_n=128, num_stages=3),
                  hopper=dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=8),
                  blackwell=dict(block_m=128, block_n=128, block_k=64, num_stages=4,
                                 num_warps=8),
                  mi350=dict(block_m=128, block_n=128, block_k=64, num_stages=2, num_warps=8)),
        dict(_MM, block_m=128, block_n=128, num_stages=1), ("num_stages = {num_stages}",),
        {"ampere": ("cp.async",), "hopper": ("cp.async",), "blackwell": ("cp.async",),
         "mi350": ("s_waitcnt vmcnt",)}),
    Strategy(
        "mma", "tensor-core / matrix-core instructions for 16-bit (and narrower) operands with "
        "float32 accumulation",
        {"ampere": "mma.sync (HMMA)", "hopper": "wgmma (warpgroup MMA)",
         "blackwell": "tcgen05.mma (5th-gen tensor cores)", "mi350": "MFMA"},
        MM_SMALL, MM_BIG,
        _per_arch(ampere=dict(block_m=128, block_n=128), hopper=dict(block_m=128, block_n=128,
                                                                      block_k=64, num_warps=8),
                  blackwell=dict(block_m=128, block_n=128, block_k=64, num_warps=8),
                  mi350=dict(block_m=128, block_n=128, block_k=64, num_warps=8)),
        dict(_MM, block_m=128, block_n=128), (DOT,), _NV_MMA,
        notes="baseline = the same tiles on float32 operands (hardware test runs both dtypes)"),
    Strategy(
        "bulk_copy", "asynchronous bulk tensor copies (TMA): one thread issues a whole tile "
        "copy global->shared, freeing the warps and the register file",
        {"hopper": "TMA (cp.async.bulk.tensor)", "blackwell": "TMA (cp.async.bulk.tensor)"},
        MM_SMALL, MM_BIG,
        _MOSAIC_PARAMS, _MOSAIC_BASELINE, (),
        {"hopper": ("cp.async.bulk.tensor",), "blackwell": ("cp.async.bulk.tensor",)},
        _MOSAIC_EXPERTS,
        "Ampere (cp.async only: that is pipelining) and MI350 have no TMA-like engine: the test "
        "fails there. The knob is MatmulConfig.backend='mosaic_hopper'/'mosaic_blackwell' "
        "(JAX's Mosaic GPU matmuls, whose tiles arrive by TMA); Pallas' Triton path issues none."),
    Strategy(
        "warp_specialization", "producer warps issue copies while consumer warpgroups run MMAs, "
        "each with its own register budget (setmaxnreg)",
        {"hopper": "producer/consumer warpgroups + setmaxnreg",
         "blackwell": "TMA warp / MMA warp / epilogue warpgroup + tensor memory"},
        MM_SMALL, MM_BIG,
        _MOSAIC_PARAMS, _MOSAIC_BASELINE, (),
        {"hopper": ("setmaxnreg",), "blackwell": ("tcgen05.commit",)},
        _MOSAIC_EXPERTS,
        "Ampere and MI350 lack warpgroup register reallocation: the test fails there. The knob "
        "is the Mosaic GPU backend (the same one as bulk_copy: in this package TMA and warp "
        "specialisation come together, JAX's two expert kernels being the only Mosaic GPU "
        "matmuls; a TMA pipeline without specialised warps is not built)."),
    Strategy(
        "split_k", "parallelism over the reduction: small M x N with a long K fills the GPU with "
        "K-slices whose float32 partials are summed",
        {a: "more programs than output tiles" for a in NAMES},
        Workload("matmul", (32, 32, 512), "bfloat16"), Workload("matmul", (256, 256, 65536),
                                                                "bfloat16"),
        _per_arch(ampere=dict(block_m=32, block_n=32, block_k=64, split_k=4),
                  hopper=dict(block_m=32, block_n=32, block_k=64, split_k=4),
                  blackwell=dict(block_m=32, block_n=32, block_k=64, split_k=4),
                  mi350=dict(block_m=32, block_n=32, block_k=64, split_k=4)),
        dict(_MM, block_m=32, block_n=32, block_k=64), ("tensor<{split_k}x",)),
    Strategy(
        "epilogue_fusion", "bias, scaling and activation applied to the accumulator in registers "
        "before the one store (no extra HBM round trip)",
        {a: "register-resident accumulator" for a in NAMES},
        MM_SMALL, MM_BIG, _per_arch(),
        dict(_MM, fuse_epilogue=False), (DOT,),
        notes="lowering check: no separate tanh op outside the kernel"),
    Strategy(
        "block_scaled_lowp", "narrow operands (FP8, MXFP4, NVFP4) with per-row/per-block scales "
        "applied in the kernel: 2-4x less memory traffic and faster MMAs",
        {"hopper": "FP8 wgmma",
         "blackwell": "FP8 and block-scaled FP4 tcgen05.mma (MXFP4, NVFP4)",
         "mi350": "FP8 and MXFP4 MFMA"},
        Workload("scaled_matmul", (64, 64, 128), "mxfp4"),
        Workload("scaled_matmul", (4096, 4096, 4096), "mxfp4"),
        _per_arch(ampere=dict(block_m=64, block_n=64, block_k=64),
                  hopper=dict(block_m=64, block_n=64, block_k=64),
                  blackwell=dict(block_m=64, block_n=64), mi350=dict(block_m=64, block_n=64)),
        dict(_MM, block_m=64, block_n=64), (DOT,),
        {"hopper": ("e4m3",), "blackwell": ("kind::mxf4",), "mi350": ("v_mfma_scale",)},
        notes="Ampere has no FP8/FP4 tensor cores: the test fails there. Format per "
        "architecture: hopper fp8_e4m3 (row scales), blackwell "
        "nvfp4, mi350 mxfp4. The FP4 path decodes E2M1 codes in registers and multiplies in "
        "float32, so the native block-scaled MMA markers are not expected until it calls them; "
        "the hardware test reports that rather than hiding it."),
    Strategy(
        "online_softmax", "softmax fused with both attention matmuls by a running max and sum "
        "(flash attention): the T x S logits never reach HBM",
        {a: "on-chip logits tile + exp units" for a in NAMES},
        Workload("attention", (1, 2, 64, 128, 32), "float32"),
        Workload("attention", (4, 16, 4096, 4096, 128), "bfloat16"),
        {a: dict(block_q=32, block_k=32) for a in NAMES}, dict(block_q=32, block_k=128),
        device_markers={"ampere": ("ex2.approx",), "hopper": ("ex2.approx",),
                        "blackwell": ("ex2.approx",), "mi350": ("v_exp_f32",)},
        notes="example: kernels_pallas.attention.flash_attention; the baseline holds a whole key "
        "row (block_k = S) so nothing is streamed"),
    Strategy(
        "grid_swizzle", "L2 reuse: programs launched together share A/B panels when tiles are "
        "visited in groups of rows (grouped ordering)",
        {a: "shared L2 across SMs/CUs" for a in NAMES},
        Workload("matmul", (256, 256, 64), "bfloat16"), MM_BIG,
        _per_arch(ampere=dict(block_m=64, block_n=64, group_m=2),
                  hopper=dict(block_m=64, block_n=64, group_m=2),
                  blackwell=dict(block_m=64, block_n=64, group_m=2),
                  mi350=dict(block_m=64, block_n=64, group_m=2)),
        dict(_MM, block_m=64, block_n=64), (DOT,)),
)
BY_NAME = {s.name: s for s in STRATEGIES}
FORMAT_BY_ARCH = {"ampere": "bf16", "hopper": "fp8_e4m3", "blackwell": "nvfp4", "mi350": "mxfp4"}


def get(name: str) -> Strategy:
    """The strategy called ``name``; ``ValueError`` listing the ten otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"strategy={name!r} is unknown; expected one of {list(BY_NAME)}")
    return BY_NAME[name]


def workload_for(strategy: Strategy, arch: str, size: str = "interpret") -> Workload:
    """The example's workload for ``arch`` (the format follows the arch for low precision)."""
    w = strategy.interpret_workload if size == "interpret" else strategy.hardware_workload
    if strategy.name == "block_scaled_lowp":
        scaling = "row" if FORMAT_BY_ARCH[arch].startswith("fp8") else "tensor"
        w = dataclasses.replace(w, dtype=FORMAT_BY_ARCH[arch], scaling=scaling)
    return w


def describe() -> str:
    """The whole taxonomy as text: the context a coding-agent proposer is given."""
    return "\n\n".join(s.text() for s in STRATEGIES)
