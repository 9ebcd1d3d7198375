"""Lab: a JAX/Flax research framework; nineteen NeurIPS 2026 methods on one core."""

__version__ = "0.1.0"
