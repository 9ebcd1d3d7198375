"""The host: a short description of it (:func:`describe`), the process's memory
allocator, set for XLA's CPU runtime, and the cache of compiled programs
(:func:`use_compile_cache`).

XLA's CPU runtime allocates an executable's large buffers (activations, logits,
attention matrices) anew on every call. glibc's ``malloc`` serves a request above
its mmap threshold (which adapts up to 32 MiB), and one over 64 MiB from a worker
thread's own arena, with a fresh ``mmap``, and unmaps it on ``free``. So every
call page-faults those buffers back in, each page zero-filled by the kernel.

``LAB_MALLOC=tuned`` makes glibc serve every thread from the one main heap, never
by ``mmap``, and keep freed memory instead of returning it to the system: a
buffer freed by one call is reused, already mapped, by the next. It is opt-in:
one arena for all threads serialises their allocations, which slows
compile-heavy work, and the process keeps its peak memory. Measurements per
host are in ``docs/benchmarks.md``.

``import lab`` calls :func:`tune_malloc`, before XLA's threads first allocate
(after, they keep their own arenas). Off glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

ENV = "LAB_MALLOC"
MODES = ("system", "tuned")
# mallopt(3) parameters (malloc.h) and the values set: one arena, no mmap, no trimming
# (M_TRIM_THRESHOLD is a C int: 2 GiB - 1 is its largest value).
_SETTINGS = ((-8, 1), (-4, 0), (-1, 2**31 - 1))  # M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD


def mode() -> str:
    """``$LAB_MALLOC`` (default ``"system"``); raises ValueError for another value."""
    value = os.environ.get(ENV, "system")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}; expected one of {MODES}")
    return value


def tune_malloc() -> bool:
    """With ``LAB_MALLOC=tuned``, applies the settings above to this process's glibc
    ``malloc``; returns whether it did (False by default or without glibc)."""
    if mode() == "system" or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    # glibc only: musl also has mallopt but ignores it; glibc alone has gnu_get_libc_version.
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in _SETTINGS)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``, else
    :func:`platform.processor`, else ``"unknown"``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict:
    """What a trained model or a timing depends on: ``{"cpu", "cores", "system", "machine",
    "python", "jax", "backend", "devices"}`` (the JAX backend and its device kinds)."""
    import jax  # only when asked: importing lab must stay cheap

    devices = jax.devices()
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "system": platform.system(),
            "machine": platform.machine(), "python": platform.python_version(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "devices": sorted({d.device_kind for d in devices}), "n_devices": len(devices)}


COMPILE_CACHE_ENV = "LAB_COMPILE_CACHE"


def use_compile_cache() -> str | None:
    """Turns on JAX's persistent compilation cache for this process and the processes it
    starts: every program XLA compiles, however quickly, is written to ``$LAB_CACHE/xla``,
    and a later run of the same program on this host loads it instead of compiling. A
    directory chosen through ``JAX_COMPILATION_CACHE_DIR`` wins; ``LAB_COMPILE_CACHE=off``
    leaves the cache off. Launchers and ``experiments.reproduce`` call it; returns the
    directory, or None when off.

    No size limit is set: with one, JAX takes a file lock around every read and write of
    the cache, and a worker that :func:`lab.timing.alone` stops while it holds the lock
    would stall the others' compiles. Delete the directory to reclaim its space."""
    import jax

    from lab.zoo.store import cache_root

    value = os.environ.get(COMPILE_CACHE_ENV, "on")
    if value not in ("on", "off"):
        raise ValueError(f"{COMPILE_CACHE_ENV}={value!r}; expected 'on' or 'off'")
    if value == "off":
        return None
    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(cache_root(), "xla")
    settings = {"JAX_COMPILATION_CACHE_DIR": (directory, str),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("0", float)}
    for name, (default, kind) in settings.items():
        os.environ.setdefault(name, default)   # the processes this one starts
        jax.config.update(name.lower(), kind(os.environ[name]))
    return directory
