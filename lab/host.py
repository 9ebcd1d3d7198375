"""The host process's memory allocator, set for XLA's CPU runtime.

XLA's CPU runtime allocates an executable's large buffers (activations, logits,
attention matrices) anew on every call. glibc's ``malloc`` serves a request above
its mmap threshold (which adapts up to 32 MiB), and one over 64 MiB from a worker
thread's own arena, with a fresh ``mmap``, and unmaps it on ``free``. So every
call page-faults those buffers back in, each page zero-filled by the kernel.
Measured on a 2-core host: a jitted ``x * 2`` over 134 MB took 54 ms a call (33k
page faults a call); tuned, 14 ms (0 faults). ``benchmarks/train.py``'s step
(d=256, batch 8 x 256) ran 1.16-1.19x faster (interleaved runs); lm-xs's zoo step
(d=128, batch 8 x 1024) did not change (626 vs 632 ms).

:func:`tune_malloc` makes glibc serve every thread from the one main heap, never
by ``mmap``, and keep freed memory instead of returning it to the system. A
buffer freed by one step is then reused, already mapped, by the next. The cost:
the process's resident memory does not shrink after a peak.

It must run before XLA's threads first allocate, or they keep their own arenas;
``import lab`` calls it. ``LAB_MALLOC=system`` keeps glibc's defaults. Off glibc
it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "LAB_MALLOC"
MODES = ("tuned", "system")
# mallopt(3) parameters (malloc.h) and the values set: one arena, no mmap, no trimming
# (M_TRIM_THRESHOLD is a C int: 2 GiB - 1 is its largest value).
_SETTINGS = ((-8, 1), (-4, 0), (-1, 2**31 - 1))  # M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD


def mode() -> str:
    """``$LAB_MALLOC`` (default ``"tuned"``); raises ValueError for another value."""
    value = os.environ.get(ENV, "tuned")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}; expected one of {MODES}")
    return value


def tune_malloc() -> bool:
    """Applies the settings above to this process's glibc ``malloc``; returns whether it did
    (False with ``LAB_MALLOC=system`` or without glibc)."""
    if mode() == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        # glibc only (musl's mallopt accepts and ignores): it alone has gnu_get_libc_version.
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in _SETTINGS)
