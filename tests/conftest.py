"""Test-wide settings: a private zoo cache and a private compilation cache per session,
and compiled programs freed after each test file.

Both are set before anything imports JAX, so pytest-xdist's workers, notebook kernels and
the subprocesses tests start inherit them. Many tests compile the same programs (an
experiment's ``test`` preset from its launcher test, its notebook and the main-job test);
JAX's persistent compilation cache compiles each once per session.
"""

import gc
import os
import tempfile

import pytest

# Zoo models trained by tests go to a throwaway cache unless the caller chose one.
os.environ.setdefault("LAB_CACHE", tempfile.mkdtemp(prefix="lab-test-cache-"))
# XLA executables: a throwaway cache too, every program (a notebook kernel or the other
# xdist worker then loads the small eager-op programs a launcher test compiled as well).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="lab-test-xla-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The suite's programs are tiny and compiled once each: XLA's CPU backend at optimisation
# level 0 compiles them about 40% faster (the same HLO passes; LLVM does less), which is
# most of the suite's time. Numerics are the tests' to check at any level; users' runs
# keep the default. A caller's own XLA_FLAGS choice of the level wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_backend_optimization_level=0").strip()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drops JAX's in-memory caches after each test file. Every live XLA CPU executable
    holds its own memory mappings; a worker that kept every program of the suite would
    pass Linux's ``vm.max_map_count`` (65,530 by default) and segfault in its next
    compile. Cleared per file, a worker holds about 2,000 mappings; a program another
    file needs again comes back from the persistent cache above."""
    yield
    import jax

    jax.clear_caches()
    gc.collect()
