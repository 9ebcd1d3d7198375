"""A synthetic GUI environment for GUI-Libra ("GUI-Libra: reliable reasoning-and-acting in
native GUI agents"): screens as element trees, long-horizon tasks with several valid
actions per step, an online ``reset`` / ``step`` API and a strict action grammar.

An app has six pages: ``home`` (links to ``settings``, ``profile``, ``shop``),
``settings`` (3 of 6 toggles), ``profile`` (fields ``name`` and ``city``, a ``save``
button), ``shop`` (a ``search`` field and a ``go`` button), ``results`` (three items, one
per search) and ``item``. Every non-home page has a ``back`` element. Each screen is an
element tree (the page root and its children), rendered to text as the goal, ``@<page>``
and one line per element, ``<name>#<id> <kind> [<value>]``, in an order and with ids
(distinct digits 1-9) drawn per episode, so neither the position nor the id of an element
says what it is.

Tasks (the goal is the first line of every screen):

* ``toggle``: ``goal: wifi on dark off`` - set two toggles (either first);
* ``fill``: ``goal: name ann city rio`` - type both fields (either first), then save;
* ``search``: ``goal: find lamp`` - type the query, press go, open the item;
* ``navigate``: ``goal: visit shop then profile`` - open one page, then another.

Actions are ``click(<id>)`` and ``type(<id>,<word>)`` (:data:`ACTION_RE`; a word is 1-8
lowercase letters). A string outside the grammar is *malformed*, one naming an element
not on the screen or the wrong verb for it (typing into a button, clicking a field) is
*invalid*: both are failed steps (reward 0, the state unchanged, ``info["error"]`` says
which), never an exception. An episode ends with success when the goal holds (reward 1)
or with failure after ``max_steps = optimal + slack`` steps.

The *valid actions* of a state (:meth:`GuiEnv.valid_actions`) are those that lower the
optimal remaining cost (:meth:`GuiEnv.cost`) by one, so every step of an optimal plan is
one of them, and a state can have several (the two toggles, the two fields): the partial
verifiability the paper is about, where a demonstration marks one of them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import numpy as np

TASKS = ("toggle", "fill", "search", "navigate")
PAGES = ("home", "settings", "profile", "shop", "results", "item")
TOP = ("settings", "profile", "shop")
TOGGLES = ("wifi", "blue", "dark", "gps", "sync", "mute")
NAMES = ("ann", "bob", "eve", "kim", "max", "zoe")
CITIES = ("rio", "oslo", "lima", "rome", "kiev", "bern")
ITEMS = ("lamp", "desk", "sofa", "mug", "rug", "vase", "bed", "fan")
ACTION_RE = re.compile(r"^(?:click\(([1-9])\)|type\(([1-9]),([a-z]{1,8})\))$")
SLACK = 2


def parse_action(text: str) -> tuple[str, int, str | None] | None:
    """``"click(3)" -> ("click", 3, None)``, ``"type(2,ann)" -> ("type", 2, "ann")``;
    None for a string outside the grammar (surrounding whitespace is stripped)."""
    if not isinstance(text, str):
        return None
    m = ACTION_RE.match(text.strip())
    if m is None:
        return None
    if m.group(1) is not None:
        return ("click", int(m.group(1)), None)
    return ("type", int(m.group(2)), m.group(3))


def completion_action(completion: str) -> str:
    """The action of a policy completion: its last non-empty line (a reasoning-then-action
    completion ends with the action line; a direct-action one is only that line)."""
    lines = [x.strip() for x in str(completion).split("\n") if x.strip()]
    return lines[-1] if lines else ""


@dataclasses.dataclass
class Element:
    """One node of a screen's element tree: ``kind`` in link/toggle/field/button/item/back."""

    id: int
    kind: str
    name: str
    value: str | None = None

    def text(self) -> str:
        """``<name>#<id> <kind>[ <value>]`` (``back#<id>`` for the back element; an empty
        field's value is ``_``)."""
        if self.kind == "back":
            return f"back#{self.id}"
        v = "" if self.value is None else f" {self.value or '_'}"
        return f"{self.name}#{self.id} {self.kind}{v}"


class GuiEnv:
    """The online environment: ``obs = env.reset(seed)``, ``obs, reward, done, info =
    env.step(action)``; ``obs`` is the screen's text (:meth:`render`).

    ``info`` holds ``valid`` (the action was one of the state's valid actions), ``error``
    (None, ``"malformed"`` or ``"invalid"``), ``success`` and ``steps``. The full state is
    a JSON-able dict (:meth:`state` / :meth:`from_state`) so a reward function can replay
    an action from a stored state.
    """

    def __init__(self, task: str | None = None):
        if task is not None and task not in TASKS:
            raise ValueError(f"task={task!r}; expected None (drawn per episode) or one of "
                             f"{TASKS}")
        self.task_filter = task
        self.s: dict | None = None

    # ------------------------------------------------------------------ state
    def reset(self, seed: int) -> str:
        rng = np.random.default_rng([int(seed), 11])
        task = self.task_filter or TASKS[int(rng.integers(len(TASKS)))]
        toggles = [str(t) for t in rng.choice(TOGGLES, 3, replace=False)]
        tvals = {t: bool(rng.integers(2)) for t in toggles}
        items = [str(x) for x in rng.choice(ITEMS, 3, replace=False)]
        s = {"task": task, "page": "home", "toggles": tvals, "draft": {"name": "", "city": ""},
             "saved": {"name": "", "city": ""}, "search": "", "query": "", "opened": "",
             "visited": [], "items": items, "steps": 0, "done": False, "success": False}
        if task == "toggle":
            pick = [str(t) for t in rng.choice(toggles, 2, replace=False)]
            s["goal"] = {t: not tvals[t] for t in pick}
        elif task == "fill":
            s["goal"] = {"name": str(rng.choice(NAMES)), "city": str(rng.choice(CITIES))}
        elif task == "search":
            s["goal"] = {"item": items[int(rng.integers(3))]}
        else:
            a, b = (str(x) for x in rng.choice(TOP, 2, replace=False))
            s["goal"] = {"first": a, "then": b}
        # ids and order of every page's elements, fixed for the episode
        layout = {}
        for page in PAGES:
            n = len(self._names(page, s))
            layout[page] = {"ids": [int(i) for i in rng.choice(np.arange(1, 10), n,
                                                                 replace=False)],
                            "order": [int(i) for i in rng.permutation(n)]}
        s["layout"] = layout
        self.s = s
        s["max_steps"] = self.cost() + SLACK
        return self.render()

    def state(self) -> dict:
        self._need()
        return copy.deepcopy(self.s)

    @classmethod
    def from_state(cls, state: dict | str) -> GuiEnv:
        env = cls()
        env.s = copy.deepcopy(json.loads(state) if isinstance(state, str) else state)
        return env

    def _need(self):
        if self.s is None:
            raise ValueError("GuiEnv: call reset(seed) before using the environment")

    # ------------------------------------------------------------------ screens
    @staticmethod
    def _names(page: str, s: dict) -> list[tuple[str, str]]:
        """(kind, name) of a page's elements in canonical order."""
        if page == "home":
            return [("link", p) for p in TOP]
        back = [("back", "back")]
        if page == "settings":
            return [("toggle", t) for t in s["toggles"]] + back
        if page == "profile":
            return [("field", "name"), ("field", "city"), ("button", "save")] + back
        if page == "shop":
            return [("field", "search"), ("button", "go")] + back
        if page == "results":
            return [("item", x) for x in s["items"]] + back
        return [("button", "buy")] + back  # item page

    def elements(self) -> list[Element]:
        """The current screen's elements in display order."""
        self._need()
        s = self.s
        page = s["page"]
        names = self._names(page, s)
        lay = s["layout"][page]
        out = []
        for j in lay["order"]:
            kind, name = names[j]
            value = None
            if kind == "toggle":
                value = "on" if s["toggles"][name] else "off"
            elif kind == "field":
                value = s["search"] if name == "search" else s["draft"][name]
            elif kind == "button" and name == "buy":
                name = "buy"
                value = s["opened"]
            out.append(Element(lay["ids"][j], kind, name, value))
        return out

    def goal_text(self) -> str:
        s = self.s
        g = s["goal"]
        if s["task"] == "toggle":
            return "goal: " + " ".join(f"{t} {'on' if v else 'off'}" for t, v in g.items())
        if s["task"] == "fill":
            return f"goal: name {g['name']} city {g['city']}"
        if s["task"] == "search":
            return f"goal: find {g['item']}"
        return f"goal: visit {g['first']} then {g['then']}"

    def render(self) -> str:
        """The screen as text: the goal, the page (in a navigate task followed by the top
        pages visited so far: the screen alone then tells what remains, as a real agent's
        history would), one line per element."""
        self._need()
        page = f"@{self.s['page']}"
        if self.s["task"] == "navigate" and self.s["visited"]:
            page += " visited " + " ".join(self.s["visited"])
        lines = [self.goal_text(), page]
        lines += [e.text() for e in self.elements()]
        return "\n".join(lines)

    def render_image(self, width: int = 96) -> np.ndarray:
        """The screen as a uint8 image ``[H, width, 3]`` for a VLM path: one band of 10
        rows per text line, each character a column whose 8 pixels are its byte's bits
        (so the image carries the text losslessly), tinted by the element's kind."""
        self._need()
        tint = {"link": (80, 160, 255), "toggle": (255, 180, 60), "field": (120, 220, 120),
                "button": (230, 90, 90), "item": (200, 120, 255), "back": (160, 160, 160)}
        lines = [(self.goal_text(), (255, 255, 255)), (f"@{self.s['page']}", (255, 255, 255))]
        lines += [(e.text(), tint[e.kind]) for e in self.elements()]
        img = np.zeros((10 * len(lines), width, 3), np.uint8)
        for r, (text, color) in enumerate(lines):
            data = text.encode()[:width]
            bits = np.unpackbits(np.frombuffer(data, np.uint8)[None, :], axis=0)  # [8, L]
            band = bits[:, :, None] * np.array(color, np.uint8)[None, None, :]
            img[10 * r + 1:10 * r + 9, :len(data)] = band
        return img

    # ------------------------------------------------------------------ dynamics
    @staticmethod
    def _dist(page: str, target: str) -> int:
        """Optimal clicks from ``page`` to the top-level ``target`` page."""
        if page == target:
            return 0
        return {"home": 1, "settings": 2, "profile": 2, "shop": 2, "results": 3,
                "item": 4}[page]

    def cost(self) -> int:
        """The number of steps of an optimal plan from the current state (0 = solved)."""
        self._need()
        s = self.s
        g, page = s["goal"], s["page"]
        task = s["task"]
        if task == "toggle":
            pending = sum(s["toggles"][t] != v for t, v in g.items())
            return 0 if pending == 0 else self._dist(page, "settings") + pending
        if task == "fill":
            if all(s["saved"][k] == g[k] for k in ("name", "city")):
                return 0
            pending = sum(s["draft"][k] != g[k] for k in ("name", "city"))
            return self._dist(page, "profile") + pending + 1
        if task == "search":
            if page == "item" and s["opened"] == g["item"]:
                return 0
            if page == "results" and s["query"] == g["item"]:
                return 1
            if page == "shop":
                return 2 if s["search"] == g["item"] else 3
            if page == "item":  # a wrong item: back to results, then on from there
                return 2 if s["query"] == g["item"] else 5
            return {"results": 1}.get(page, self._dist(page, "shop")) + 3
        first, then = g["first"], g["then"]
        if first in s["visited"]:
            return self._dist(page, then)
        return self._dist(page, first) + 2

    def candidate_actions(self) -> list[str]:
        """Every well-formed action that names an element of the screen with its verb:
        a click on each clickable element, a type of each goal word into each field."""
        words = sorted({w for v in self.s["goal"].values() for w in
                        ([v] if isinstance(v, str) else [])})
        out = []
        for e in self.elements():
            if e.kind == "field":
                out += [f"type({e.id},{w})" for w in words] or [f"type({e.id},a)"]
            else:
                out.append(f"click({e.id})")
        return out

    def valid_actions(self) -> list[str]:
        """The candidate actions that lower :meth:`cost` by one (empty when solved)."""
        self._need()
        c = self.cost()
        if c == 0 or self.s["done"]:
            return []
        out = []
        for a in self.candidate_actions():
            nxt = GuiEnv.from_state(self.s)
            nxt._apply(parse_action(a))
            if nxt.cost() == c - 1:
                out.append(a)
        return out

    def _apply(self, act) -> str | None:
        """Applies a parsed action; returns None or ``"invalid"`` (state unchanged)."""
        s = self.s
        verb, eid, word = act
        el = {e.id: e for e in self.elements()}.get(eid)
        if el is None:
            return "invalid"
        if verb == "type":
            if el.kind != "field":
                return "invalid"
            if el.name == "search":
                s["search"] = word
            else:
                s["draft"][el.name] = word
            return None
        if el.kind == "field":
            return "invalid"
        page = s["page"]
        if el.kind == "back":
            s["page"] = {"results": "shop", "item": "results"}.get(page, "home")
        elif el.kind == "link":
            s["page"] = el.name
        elif el.kind == "toggle":
            s["toggles"][el.name] = not s["toggles"][el.name]
        elif el.kind == "item":
            s["page"], s["opened"] = "item", el.name
        elif el.name == "save":
            s["saved"] = dict(s["draft"])
        elif el.name == "go":
            s["page"], s["query"] = "results", s["search"]
        # "buy" does nothing a task needs
        if s["page"] in TOP and s["page"] not in s["visited"]:
            s["visited"].append(s["page"])
        return None

    def step(self, action: str):
        """One step: returns ``(obs, reward, done, info)``; never raises for a bad action."""
        self._need()
        s = self.s
        if s["done"]:
            raise ValueError("GuiEnv.step after the episode ended; call reset(seed)")
        valid = action in self.valid_actions() if isinstance(action, str) else False
        act = parse_action(action)
        error = "malformed" if act is None else self._apply(act)
        s["steps"] += 1
        success = self.cost() == 0
        s["success"] = success
        s["done"] = success or s["steps"] >= s["max_steps"]
        info = {"valid": valid, "error": error, "success": success, "steps": s["steps"]}
        return self.render(), float(success), s["done"], info


def expert_plan(env: GuiEnv, rng: np.random.Generator) -> list[str]:
    """An optimal action sequence from ``env``'s state, each step a random valid action
    (the demonstrator picks one of several)."""
    e = GuiEnv.from_state(env.s)
    out = []
    while e.cost() > 0:
        acts = e.valid_actions()
        a = acts[int(rng.integers(len(acts)))]
        out.append(a)
        e._apply(parse_action(a))
    return out
