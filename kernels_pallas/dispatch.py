"""Backend dispatch for Lab's Pallas kernels.

An ordered fallback that ends in XLA, in the manner of tokamax's
``ops/attention/api.py``: a caller asks for an implementation (``"pallas"``,
``"xla"`` or ``None`` for automatic) and gets back which one to run and whether
the Pallas kernel must be interpreted. The environment variable
``LAB_KERNELS=xla|pallas`` overrides the automatic choice everywhere.

Automatic choice: compiled Pallas on GPU and TPU, the jnp reference (XLA) on
CPU, where interpreted Pallas is correct but slow. Asking for ``"pallas"`` on
CPU gives the kernel in interpret mode: that is what the tests compare.
"""

from __future__ import annotations

import dataclasses
import os

import jax

KNOWN = ("xla", "pallas")


@dataclasses.dataclass(frozen=True)
class Backend:
    """Which implementation to run: ``impl`` in KNOWN; ``interpret`` for Pallas on CPU."""

    impl: str
    interpret: bool = False

    @property
    def is_pallas(self) -> bool:
        return self.impl == "pallas"


def platform() -> str:
    """The default JAX backend: ``cpu``, ``gpu`` (cuda/rocm) or ``tpu``."""
    name = jax.default_backend()
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def backend(impl: str | None = None) -> Backend:
    """Resolves an implementation request to a :class:`Backend`.

    Args:
      impl: ``"pallas"``, ``"xla"`` or ``None`` (automatic). ``LAB_KERNELS``
        overrides an automatic request; an explicit request wins over it.

    Returns:
      The backend to run. Raises ``ValueError`` naming the known values for an
      unknown request.
    """
    env = os.environ.get("LAB_KERNELS", "").strip().lower() or None
    if env is not None and env not in KNOWN:
        raise ValueError(f"LAB_KERNELS={env!r} is not a known backend; expected one of {KNOWN}")
    choice = impl if impl is not None else env
    if choice is not None and choice not in KNOWN:
        raise ValueError(f"impl={choice!r} is not a known kernel backend; expected one of {KNOWN}")
    where = platform()
    if choice is None:
        choice = "pallas" if where in ("gpu", "tpu") else "xla"
    return Backend(choice, interpret=(choice == "pallas" and where == "cpu"))


def select(kernel, reference, impl: str | None = None):
    """Returns ``(fn, backend)``: the kernel (with ``interpret`` bound) or the reference.

    ``kernel`` must accept an ``interpret`` keyword; ``reference`` has the same
    signature without it.
    """
    chosen = backend(impl)
    if chosen.is_pallas:
        return (lambda *a, **k: kernel(*a, interpret=chosen.interpret, **k)), chosen
    return reference, chosen
