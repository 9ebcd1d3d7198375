"""Hawkeye's taxonomy: ten optimisation strategies x four GPU architectures, one test each.

- :mod:`.arch`: the targets (Ampere, Hopper, Blackwell, MI350) and :func:`detect`.
- :mod:`.workloads`: ops, shapes, inputs, kernels and XLA references.
- :mod:`.strategies`: the ten :class:`Strategy` records and :func:`describe`.
- :mod:`.checks`: the per-architecture test (interpret-mode correctness,
  :func:`unit_test` of any kernel lowered for the target platform against the target's
  hardware facts, with its negative case :func:`check_without`, JAX's expert Mosaic GPU
  kernels in GPU interpret mode where the interpreter supports them, and on that hardware
  device-code markers and the speedup over the unoptimised kernel).
"""

from kernels_pallas.taxonomy.arch import ARCHITECTURES, NAMES, detect
from kernels_pallas.taxonomy.checks import (
    CheckResult,
    check_expert_interpret,
    check_hardware,
    check_interpret,
    check_lowering,
    check_without,
    run_all,
    unit_test,
)
from kernels_pallas.taxonomy.strategies import STRATEGIES, Strategy, describe, get, workload_for
from kernels_pallas.taxonomy.workloads import Workload

__all__ = ["ARCHITECTURES", "NAMES", "STRATEGIES", "CheckResult", "Strategy", "Workload",
           "check_expert_interpret", "check_hardware", "check_interpret", "check_lowering",
           "check_without", "describe", "detect", "get", "run_all", "unit_test", "workload_for"]
