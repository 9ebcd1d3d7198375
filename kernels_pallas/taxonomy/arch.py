"""Target architectures of Hawkeye's taxonomy and detection of the one we run on.

Four targets (the paper's): NVIDIA Ampere (sm_80), Hopper (sm_90), Blackwell
(sm_100) and AMD MI350 (gfx950). :func:`detect` reads
``jax.devices()[0].device_kind`` (and ``compute_capability`` on CUDA) and
returns the target's name, or ``None`` on a CPU, a TPU or a GPU that is none
of the four; hardware tests are skipped with that reason.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A GPU generation: vendor, lowering platform and the features the taxonomy uses."""

    name: str
    vendor: str
    platform: str        # jax lowering platform: "cuda" | "rocm"
    isa: str             # sm_80 / sm_90 / sm_100 / gfx950
    kinds: tuple[str, ...]  # substrings of device_kind that identify it
    features: tuple[str, ...]


ARCHITECTURES: dict[str, Architecture] = {
    "ampere": Architecture("ampere", "nvidia", "cuda", "sm_80", ("A100", "A30", "A10", "A40",
                                                                  "A6000", "RTX 30"),
                           ("mma.sync", "cp.async", "bf16")),
    "hopper": Architecture("hopper", "nvidia", "cuda", "sm_90", ("H100", "H200", "H800", "GH200"),
                           ("wgmma", "tma", "warp_specialization", "fp8", "bf16")),
    "blackwell": Architecture("blackwell", "nvidia", "cuda", "sm_100", ("B100", "B200", "B300",
                                                                         "GB200", "GB300"),
                              ("tcgen05", "tma", "warp_specialization", "fp8", "mxfp4", "nvfp4",
                               "bf16")),
    "mi350": Architecture("mi350", "amd", "rocm", "gfx950", ("MI350", "MI355"),
                          ("mfma", "fp8", "mxfp4", "bf16")),
}
NAMES = tuple(ARCHITECTURES)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """The facts of a target that the taxonomy's unit tests decide on (vendor ISA guides:
    PTX ISA 8.x for mma.sync / wgmma / tcgen05 shapes, CDNA4 ISA for MFMA, the vendors'
    tuning guides for shared memory, SM/CU counts and pipelining depths)."""

    mma_tile: tuple[int, int, int]  # M, N, K multiples one tensor/matrix-core MMA needs
    mma_dtypes: tuple[str, ...]     # operand dtypes / formats the MMA takes natively
    warpgroup_mma: bool             # the MMA is issued by a 4-warp warpgroup (num_warps % 4)
    smem_kb: int                    # shared memory (LDS) per SM/CU a kernel may use
    units: int                      # SMs / CUs
    stages: tuple[int, int]         # software-pipelining depths the compiler pipelines
    backends: tuple[str, ...]       # kernels_pallas.matmul backends that compile for it
    l2_mb: float                    # last-level cache shared by the SMs/CUs
    tma: bool                       # bulk tensor copies (TMA) and warp specialisation


_BF16 = ("bfloat16", "bf16", "float16")
_FP8 = ("float8_e4m3fn", "fp8_e4m3", "fp8_e5m2")
HARDWARE: dict[str, Hardware] = {
    # mma.sync.m16n8k16; Triton pipelines cp.async stages while shared memory lasts
    "ampere": Hardware((16, 8, 16), _BF16, False, 164, 108, (2, 6), ("triton",), 40, False),
    # wgmma.m64nNk16 from one warpgroup; TMA + setmaxnreg through Mosaic GPU
    "hopper": Hardware((64, 8, 16), _BF16 + _FP8, True, 228, 132, (2, 6),
                       ("triton", "mosaic_hopper"), 50, True),
    # tcgen05.mma cta_group::1 at full rate with M = 128; FP4 block-scaled kinds
    "blackwell": Hardware((128, 16, 16), _BF16 + _FP8 + ("mxfp4", "nvfp4"), True, 228, 148,
                          (2, 6), ("triton", "mosaic_blackwell"), 126, True),
    # v_mfma_f32_32x32x16 (bf16/fp8) and the MXFP4 scaled MFMA; AMD's Triton guide pipelines
    # GEMMs with num_stages=2 (LDS double buffering)
    "mi350": Hardware((32, 32, 16), _BF16 + _FP8 + ("mxfp4",), False, 160, 256, (2, 2),
                      ("triton",), 256, False),
}


def hardware(name: str) -> Hardware:
    """The :class:`Hardware` facts of target ``name`` (``ValueError`` if unknown)."""
    get(name)
    return HARDWARE[name]


def get(name: str) -> Architecture:
    """The :class:`Architecture` called ``name``; ``ValueError`` listing the targets otherwise."""
    if name not in ARCHITECTURES:
        raise ValueError(f"target={name!r} is not a supported architecture; expected one of "
                         f"{list(NAMES)}")
    return ARCHITECTURES[name]


def classify(device_kind: str, compute_capability: str | None = None) -> str | None:
    """Maps a device description to a target name (``None`` if it is none of the four)."""
    if compute_capability:
        major = str(compute_capability).split(".")[0]
        by_cc = {"8": "ampere", "9": "hopper", "10": "blackwell"}
        if major in by_cc:
            return by_cc[major]
    kind = device_kind.upper()
    for arch in ARCHITECTURES.values():
        if any(k.upper() in kind for k in arch.kinds):
            return arch.name
    return None


def detect() -> str | None:
    """The target this process runs on, from ``jax.devices()[0]``; ``None`` without one."""
    dev = jax.devices()[0]
    if dev.platform not in ("gpu", "cuda", "rocm"):
        return None
    return classify(dev.device_kind, getattr(dev, "compute_capability", None))


def skip_reason(name: str) -> str | None:
    """Why a hardware test for ``name`` cannot run here (``None`` if it can)."""
    here = detect()
    if here == name:
        return None
    dev = jax.devices()[0]
    return (f"needs {name} ({get(name).isa}) hardware; this process runs on "
            f"{dev.platform}:{dev.device_kind}")
