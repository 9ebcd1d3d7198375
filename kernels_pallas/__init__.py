"""Pallas kernels for Lab.

Each kernel module holds three parts: the Pallas kernel, a pure-jnp reference
with the same signature, and a public function that dispatches between them
through :func:`kernels_pallas.dispatch.select` (compiled on GPU/TPU,
``interpret=True`` on CPU, ``LAB_KERNELS=xla|pallas`` to force).
"""

from kernels_pallas.dispatch import Backend, backend, select

__all__ = ["Backend", "backend", "select"]
