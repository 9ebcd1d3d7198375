"""Lab: a JAX/Flax research framework; nineteen NeurIPS 2026 methods on one core.

``import lab`` does no work beyond the allocator setting below: its submodules
(``lab.nn``, ``lab.infer``, ``lab.train``, ``lab.data``, ``lab.hf``, ``lab.zoo``,
``lab.parallel``, ``lab.methods``, ...) load on first attribute access
(PEP 562), so ``import lab; lab.infer.generate(...)`` works.
"""

from __future__ import annotations

import importlib

from lab import host

__version__ = "0.1.0"

# Before XLA's CPU threads first allocate; a no-op unless LAB_MALLOC=tuned (see lab.host).
MALLOC_TUNED = host.tune_malloc()

_SUBMODULES = ("atomic", "config", "console", "data", "hf", "infer", "launch", "methods", "nn",
               "outputs", "parallel", "timing", "train", "zoo")
_ATTRS = {"load_model": "lab.zoo"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"lab.{name}")
    if name in _ATTRS:
        return getattr(importlib.import_module(_ATTRS[name]), name)
    raise AttributeError(f"module 'lab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES) | set(_ATTRS))
