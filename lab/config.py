"""Config checking shared by every launcher: fail before any work, naming the key.

A config is an ``ml_collections.ConfigDict`` from ``configs/<name>.py:get_config(preset)``.
:func:`validate` compares a config with the reference preset of the same
experiment: unknown keys, wrong types, and values outside stated bounds raise
``ValueError`` with the key, the value and what was expected.

The convention every launcher follows: ``experiments/<name>.py`` defines
``check_config(config)``, called first in ``run``, which calls
:func:`check` with its ``get_config`` and its per-key checks, then
:func:`require` for any rule that spans several keys. All three raise the same
message, ``config.<key>=<value> is invalid; expected <what>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

PRESETS = ("test", "default", "paper")
# The per-key check of a ``seeds`` field (the training seeds an experiment averages over).
SEEDS = (lambda v: len(v) >= 1 and all(isinstance(s, int) and not isinstance(s, bool)
                                       for s in v), "a non-empty tuple of int seeds")


def check_preset(preset: str | None) -> str:
    """``preset`` (``None`` or ``""``: ``"default"``); ValueError for an unknown one."""
    preset = preset or "default"
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is unknown; expected one of {PRESETS}")
    return preset


def _flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, (Mapping, ml_collections.ConfigDict)):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _type_ok(value, ref) -> bool:
    if ref is None or value is None:
        return True
    if isinstance(ref, bool):
        return isinstance(value, bool)
    if isinstance(ref, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(ref, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(ref, (tuple, list)):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(ref))


def validate(config, reference, checks: Mapping[str, Callable[[Any], bool] | tuple] | None = None):
    """Raises ``ValueError`` for unknown keys, wrong types and failed checks.

    Args:
      config: the config to run.
      reference: a preset of the same experiment (its keys and types are the schema).
      checks: ``{"dotted.key": predicate}`` or ``{"dotted.key": (predicate, "what is expected")}``.

    Returns:
      ``config`` unchanged.
    """
    got, ref = _flatten(config), _flatten(reference)
    unknown = sorted(set(got) - set(ref))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known keys: {sorted(ref)}")
    missing = sorted(set(ref) - set(got))
    if missing:
        raise ValueError(f"config is missing keys {missing}")
    for key, value in got.items():
        if not _type_ok(value, ref[key]):
            raise ValueError(f"config.{key}={value!r} has type {type(value).__name__}; "
                             f"expected {type(ref[key]).__name__}")
    for key, rule in (checks or {}).items():
        pred, expected = rule if isinstance(rule, tuple) else (rule, "a valid value")
        if key not in got:
            raise ValueError(f"config has no key {key!r} to check")
        require(pred(got[key]), key, got[key], expected)
    return config


def check(config, get_config: Callable[[str], Any], checks: Mapping | None = None):
    """:func:`validate` against ``get_config(<config's own preset>)``; returns ``config``.

    The preset is ``config.preset`` (``"default"`` when the config has none) and must be
    one of :data:`PRESETS`; ``checks`` are :func:`validate`'s.
    """
    return validate(config, get_config(check_preset(config.get("preset"))), checks)


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Raises ``ValueError("config.<key>=<value> is invalid; expected <expected>")`` unless
    ``ok``: the form of :func:`validate`'s errors, for rules that span several keys."""
    if not ok:
        raise ValueError(f"config.{key}={value!r} is invalid; expected {expected}")
