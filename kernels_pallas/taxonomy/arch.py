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
