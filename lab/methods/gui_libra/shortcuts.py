"""Shortcut policies for the GUI environment, scored beside the trained ones: they read
the screen but not the goal's meaning, so on a well-posed environment they stay near
chance.

* ``first``: act on the first listed element (click it, or type the goal's first word
  into it when it is a field);
* ``majority``: the most frequent demonstrated action type (``click``) on a random
  element of the screen;
* ``random``: a random well-formed action on the screen (a random candidate action: a
  click on a clickable element or a goal word typed into a field).

:func:`random_step_chance` is the expected offline step accuracy of ``random``: the mean
over states of the fraction of candidate actions that are valid.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from lab.methods.gui_libra.env import GuiEnv, parse_action

SHORTCUTS = ("first", "majority", "random")


def _screen_env(screen: str) -> tuple[list[tuple[int, str]], list[str]]:
    """(id, kind) of each element line and the goal words, parsed from the screen text."""
    lines = screen.split("\n")
    words = [w for w in lines[0].replace("goal: ", "").split()
             if w not in ("on", "off", "name", "city", "find", "visit", "then")]
    els = []
    for x in lines[2:]:
        parts = x.split()
        name, eid = parts[0].split("#")
        els.append((int(eid), parts[1] if len(parts) > 1 else name))
    return els, words


def shortcut_policy(name: str, seed: int = 0):
    """``policy(screens) -> actions`` for the shortcut ``name`` (see the module)."""
    if name not in SHORTCUTS:
        raise ValueError(f"shortcut={name!r}; expected one of {SHORTCUTS}")
    rng = np.random.default_rng([seed, 17])

    def one(screen):
        els, words = _screen_env(screen)
        if name == "first":
            eid, kind = els[0]
        else:
            eid, kind = els[int(rng.integers(len(els)))]
        if name == "majority":
            return f"click({eid})"
        if kind == "field":
            w = words[0] if name == "first" else words[int(rng.integers(len(words)))]
            return f"type({eid},{w})"
        return f"click({eid})"

    return lambda screens: [one(s) for s in screens]


def random_step_chance(rows: Sequence[dict]) -> float:
    """Expected step accuracy of the ``random`` shortcut on demonstration rows."""
    fr = []
    for r in rows:
        env = GuiEnv.from_state(r["state"])
        cand = env.candidate_actions()
        valid = set(json.loads(r["valid"]))
        fr.append(sum(a in valid for a in cand) / len(cand))
    return float(np.mean(fr))


def is_well_formed(action: str) -> bool:
    return parse_action(action) is not None
