"""GUI-Libra's data pipeline on the synthetic GUI environment: expert demonstrations with
reasoning, the consistency and redundancy filters, the curated set as a
``datasets.Dataset``.

A demonstrator plays each episode along an optimal plan (:func:`lab.methods.gui_libra.
env.expert_plan`: at each step one of the state's valid actions at random, so a state with
several valid actions is labelled with one of them). Like collected GUI data it is noisy:
with probability ``p_wrong`` it records a random non-valid action instead (with reasoning
that argues for it), with ``p_mismatch`` its reasoning names another element than the one
its action uses. Each step carries two reasonings: a short one (the subgoal and the
element it is grounded in) and a long chain-of-thought (the goal restated, every element of
the screen judged, then the decision), the kind of trace long-CoT SFT trains on.

Filters (the paper's construction-and-filtering pipeline, in miniature):

* **consistency**: keep a step when its action, replayed in the environment from the
  recorded state, is one of the state's valid actions and the element its reasoning names
  is the element its action uses;
* **redundancy**: at most ``max_per_key`` steps per key, the screen without its ids and
  layout (goal, page, each element's kind/name/value, sorted) plus the acted element's
  name, so the set does not repeat one situation under many layouts.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from lab.methods.gui_libra.env import GuiEnv, expert_plan, parse_action


def _why(env: GuiEnv, action: str) -> tuple[str, str]:
    """(subgoal text, acted element's name) of an action on the current screen."""
    verb, eid, word = parse_action(action)
    el = {e.id: e for e in env.elements()}.get(eid)
    if el is None:
        return "try", "none"
    if verb == "type":
        return f"type {word} in {el.name}", el.name
    kind = el.kind
    if kind == "link":
        return f"open {el.name}", el.name
    if kind == "toggle":
        return f"flip {el.name}", el.name
    if kind == "back":
        return "go back", "back"
    if kind == "item":
        return f"open {el.name}", el.name
    return f"press {el.name}", el.name


def short_reasoning(env: GuiEnv, action: str, eid: int | None = None) -> str:
    """``"<subgoal>; <name>#<id>"``: the subgoal and the element it is grounded in
    (``eid`` overrides the stated id, for an inconsistent demonstration)."""
    why, name = _why(env, action)
    _, aid, _ = parse_action(action)
    return f"{why}; {name}#{aid if eid is None else eid}"


def long_reasoning(env: GuiEnv, action: str, eid: int | None = None) -> str:
    """A long chain-of-thought: the goal restated, each element of the screen judged
    (``yes`` for the acted one, ``no`` otherwise), then the short reasoning."""
    _, aid, _ = parse_action(action)
    parts = [env.goal_text().replace("goal: ", "want ") + ".", f"on {env.s['page']}."]
    for e in env.elements():
        name = "back" if e.kind == "back" else e.name
        parts.append(f"{name}#{e.id} {'yes' if e.id == aid else 'no'}.")
    parts.append("so " + short_reasoning(env, action, eid))
    return " ".join(parts)


def demonstrations(n_episodes: int, seed: int, *, p_wrong: float = 0.15,
                   p_mismatch: float = 0.1) -> list[dict]:
    """Steps of ``n_episodes`` noisy expert episodes (episode seeds ``seed * 100003 + i``).

    Each row: ``prompt`` (the screen's text), ``action`` (demonstrated), ``reasoning``,
    ``long_reasoning``, ``reason_id`` (the element id the reasoning names), ``valid`` (JSON
    list of the state's valid actions), ``task``, ``page``, ``episode``, ``step``,
    ``state`` (JSON), ``noise`` (``""``, ``"wrong"`` or ``"mismatch"``).
    """
    for name, p in (("p_wrong", p_wrong), ("p_mismatch", p_mismatch)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name}={p!r}; expected a probability in [0, 1]")
    rows = []
    rng = np.random.default_rng([seed, 3])
    for i in range(n_episodes):
        env = GuiEnv()
        env.reset(seed * 100003 + i)
        for t, good in enumerate(expert_plan(env, rng)):
            valid = env.valid_actions()
            action, noise, eid = good, "", None
            u = rng.random()
            if u < p_wrong:
                wrong = [a for a in env.candidate_actions() if a not in valid]
                if wrong:
                    action, noise = wrong[int(rng.integers(len(wrong)))], "wrong"
            elif u < p_wrong + p_mismatch:
                others = [e.id for e in env.elements() if e.id != parse_action(action)[1]]
                eid, noise = int(others[int(rng.integers(len(others)))]), "mismatch"
            _, aid, _ = parse_action(action)
            rows.append({
                "prompt": env.render(), "action": action,
                "reasoning": short_reasoning(env, action, eid),
                "long_reasoning": long_reasoning(env, action, eid),
                "reason_id": aid if eid is None else eid, "valid": json.dumps(valid),
                "task": env.s["task"], "page": env.s["page"], "episode": i, "step": t,
                "state": json.dumps(env.state()), "noise": noise})
            env._apply(parse_action(good))  # the episode follows the optimal plan
    return rows


def consistent(row: dict) -> bool:
    """The consistency filter: the action replays as valid and the reasoning names the
    element the action uses."""
    env = GuiEnv.from_state(row["state"])
    act = parse_action(row["action"])
    return (act is not None and row["action"] in env.valid_actions()
            and int(row["reason_id"]) == act[1])


def redundancy_key(row: dict) -> str:
    """The screen without ids and layout, plus the acted element's name."""
    env = GuiEnv.from_state(row["state"])
    screen = sorted(f"{e.kind} {e.name} {e.value}" for e in env.elements())
    return json.dumps([env.goal_text(), env.s["page"], screen, _why(env, row["action"])[1]])


def curate(rows: list[dict], *, max_per_key: int = 2) -> tuple[list[dict], dict]:
    """Applies the consistency then the redundancy filter; returns ``(kept, counts)``
    with counts ``raw``, ``after_consistency``, ``after_redundancy`` and the noisy rows
    left (``noisy_kept``)."""
    if max_per_key < 1:
        raise ValueError(f"max_per_key={max_per_key!r}; expected an int >= 1")
    ok = [r for r in rows if consistent(r)]
    seen: Counter = Counter()
    kept = []
    for r in ok:
        k = redundancy_key(r)
        if seen[k] < max_per_key:
            seen[k] += 1
            kept.append(r)
    return kept, {"raw": len(rows), "after_consistency": len(ok),
                  "after_redundancy": len(kept),
                  "noisy_kept": sum(bool(r["noise"]) for r in kept)}


def to_dataset(rows: list[dict]):
    """The rows as a ``datasets.Dataset`` (one column per key)."""
    import datasets

    if not rows:
        raise ValueError("to_dataset: no rows; expected at least one demonstration step")
    return datasets.Dataset.from_list(rows)
