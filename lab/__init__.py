"""Lab: a JAX/Flax research framework; nineteen NeurIPS 2026 methods on one core."""

from lab import host

__version__ = "0.1.0"

# Before XLA's CPU threads first allocate; a no-op unless LAB_MALLOC=tuned (see lab.host).
MALLOC_TUNED = host.tune_malloc()
