"""Auto-labelling: every TAR task type, with a reasoning trace, from an event log.

:func:`question` draws a task's question for a video (bcq asks about one event type,
half the time the one that happened when there is one; mcq shuffles the five event
types into options A-E); :func:`answer` writes the answer and a step-by-step reasoning
trace for a question from an event log (the generator's ground truth, or the log
:func:`lab.methods.tar.synthetic.track_events` reads from frames). Times are seconds at
``fps``: an event over frames ``s..e`` (inclusive) spans ``s / fps`` to
``(e + 1) / fps``. :func:`label_video` writes all of a video's items in the public
schema, so :mod:`lab.methods.tar.schema` reads them back.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from lab.methods.tar.metrics import parse_options
from lab.methods.tar.schema import TASKS, Item
from lab.methods.tar.synthetic import ANOMALIES, EVENT_TYPES

TYPE_TEXT = {"normal": "no anomaly, normal traffic", "collision": "a collision between cars",
             "wrong_way": "a car driving the wrong way", "stalled": "a stalled car",
             "jaywalking": "a pedestrian jaywalking"}
QUESTIONS = {
    "bcq_openended": "Is anything anomalous happening on the road? Answer yes or no and explain.",
    "mcq_openended": "What kind of traffic event does this video show? Explain.",
    "open_qa": "Which road users are involved in the anomalous event, and what do they do?",
    "causal_linkage": "What led to the event in this video, and what followed from it?",
    "scene_description": "Describe the scene.",
    "temporal_description": "Describe what happens in the video in temporal order, with times.",
    "temporal_localization": ('When does the anomalous event happen? Answer with JSON '
                              '{"start": <seconds>, "end": <seconds>}.'),
}


def _seconds(frame: int, fps: float) -> str:
    return f"{frame / fps:.3f}".rstrip("0").rstrip(".")


def _who(actor: dict) -> str:
    return f"the {actor['colour']} {actor['kind']}"


def question(task: str, log: dict, rng: np.random.Generator) -> str:
    """A question of ``task`` for the video of ``log``."""
    if task == "bcq":
        # P(yes) = 0.8 * 0.625 = 0.5 over a uniform event type, for every asked type
        if log["type"] != "normal" and rng.random() < 0.625:
            asked = log["type"]
        else:
            asked = rng.choice([t for t in ANOMALIES if t != log["type"]])
        return f"Does this video show {TYPE_TEXT[asked]}? Answer Yes or No."
    if task == "mcq":
        order = rng.permutation(EVENT_TYPES)
        opts = "\n".join(f"{'ABCDE'[i]}. {TYPE_TEXT[t]}" for i, t in enumerate(order))
        return f"Which event does this video show?\n{opts}\nAnswer with the option letter."
    if task not in QUESTIONS:
        raise ValueError(f"task={task!r}; expected one of {TASKS}")
    return QUESTIONS[task]


def _summary(log: dict, fps: float) -> str:
    t, a = log["type"], log["actors"]
    if t == "normal":
        return ("every car keeps to its lane at a steady speed and pedestrians stay on the "
                "sidewalks or use the crosswalk.")
    s, e = _seconds(log["start"], fps), _seconds(log["end"] + 1, fps)
    if t == "collision":
        return (f"{_who(a[0])} runs into {_who(a[1])} ahead of it in the {log['lane']} lane at "
                f"{s} s; both stand still until {e} s.")
    if t == "wrong_way":
        return (f"{_who(a[0])} leaves the {log['lane']} lane and drives against the traffic "
                f"in the oncoming lane from {s} s to {e} s.")
    if t == "stalled":
        return f"{_who(a[0])} stops in the {log['lane']} lane from {s} s to {e} s."
    return f"{_who(a[0])} crosses the road away from the crosswalk from {s} s to {e} s."


def _cause_effect(log: dict, fps: float) -> str:
    t, a = log["type"], log["actors"]
    if t == "normal":
        return ("Nothing anomalous happens: no car changes speed or lane and no pedestrian "
                "enters the road off the crosswalk, so traffic keeps flowing.")
    s = _seconds(log["start"], fps)
    if t == "collision":
        return (f"{_who(a[0]).capitalize()} drove faster than {_who(a[1])} in the same lane and "
                f"closed the gap; at {s} s it struck it, and both cars stopped, blocking "
                f"the {log['lane']} lane.")
    if t == "wrong_way":
        return (f"{_who(a[0]).capitalize()} swerved out of its lane at {s} s; driving against "
                "the oncoming traffic it risked a head-on crash until it returned to its lane.")
    if t == "stalled":
        return (f"{_who(a[0]).capitalize()} stopped at {s} s with no car ahead of it, so it "
                f"stalled; it blocked the {log['lane']} lane until it drove on.")
    return (f"{_who(a[0]).capitalize()} stepped onto the road at {s} s away from the "
            "crosswalk, putting itself in the path of the cars in both lanes.")


def answer(task: str, question_text: str, log: dict, fps: float = 8.0) -> tuple[str, str]:
    """``(answer, reasoning)`` for ``question_text`` of ``task`` given ``log``."""
    t = log["type"]
    seen = (f"Step 1: watch each car and pedestrian over the {log['n_frames'] / fps:g} s "
            "video. ")
    if task == "bcq":
        asked = next((k for k, v in TYPE_TEXT.items() if v in question_text), None)
        if asked is None:
            raise ValueError(f"bcq question {question_text!r} names no event type")
        yes = t == asked
        return ("Yes" if yes else "No"), (
            seen + f"Step 2: {_summary(log, fps)[0].upper()}{_summary(log, fps)[1:]} "
            f"Step 3: that {'is' if yes else 'is not'} {TYPE_TEXT[asked]}.")
    if task == "mcq":
        options = parse_options(question_text)
        letter = next((k for k, v in options.items() if v == TYPE_TEXT[t]), None)
        if letter is None:
            raise ValueError(f"mcq question {question_text!r} has no option for {t!r}")
        return letter, seen + f"Step 2: {_summary(log, fps)} Step 3: option {letter}, " \
                              f"{TYPE_TEXT[t]}."
    if task == "bcq_openended":
        return (("No. " if t == "normal" else "Yes. ") + _summary(log, fps).capitalize(),
                seen + "Step 2: check for stops, wrong-way motion, contact and crossings.")
    if task == "mcq_openended":
        return (f"{TYPE_TEXT[t].capitalize()}: {_summary(log, fps)}",
                seen + f"Step 2: the pattern matches {TYPE_TEXT[t]}.")
    if task == "open_qa":
        if t == "normal":
            return "No road user behaves anomalously; " + _summary(log, fps), seen
        roles = "; ".join(f"{_who(a)} ({a['role']})" for a in log["actors"])
        return f"{roles.capitalize()}: {_summary(log, fps)}", seen + "Step 2: name the actors."
    if task == "causal_linkage":
        return _cause_effect(log, fps), seen + "Step 2: relate what came before to what after."
    if task == "scene_description":
        sc = log["scene"]
        pace = lambda v: "slowly" if v <= 1 else "fast"
        third = ("left", "middle", "right")[min(2, int(3 * sc["crosswalk"] / sc.get("width", 64)))]
        return (f"A top-down view of a two-lane road, westbound lane on top and eastbound "
                f"below, with sidewalks on both sides and a zebra crosswalk in the {third} "
                f"part. Westbound cars drive {pace(sc['speeds'][0])}, eastbound cars "
                f"{pace(sc['speeds'][1])}. {sc['cars']} cars and {sc['pedestrians']} "
                "pedestrians appear.",
                seen + "Step 2: count the cars and pedestrians.")
    if task == "temporal_description":
        if t == "normal":
            return (f"From 0 s to {_seconds(log['n_frames'], fps)} s traffic flows normally: "
                    + _summary(log, fps), seen)
        s, e = _seconds(log["start"], fps), _seconds(log["end"] + 1, fps)
        return (f"Traffic flows normally until {s} s. Then {_summary(log, fps)} After {e} s "
                "traffic flows normally again.", seen + "Step 2: order the events in time.")
    if task == "temporal_localization":
        if t == "normal":
            raise ValueError("temporal_localization needs an anomalous event")
        interval = {"start": _seconds(log["start"], fps), "end": _seconds(log["end"] + 1, fps)}
        return json.dumps(interval), seen + (
            f"Step 2: the {TYPE_TEXT[t]} is visible from frame {log['start']} to frame "
            f"{log['end']}.")
    raise ValueError(f"task={task!r}; expected one of {TASKS}")


def item_index(video_id: str, task: str) -> str:
    """A 16-hex item id (like the release's) from the video and task."""
    return hashlib.sha256(f"{video_id}/{task}".encode()).hexdigest()[:16]


def label_video(video_id: str, log: dict, rng: np.random.Generator, *, fps: float = 8.0,
                tasks=TASKS, with_index: bool = False) -> list[Item]:
    """One item per task in ``tasks`` (temporal_localization only for anomalous videos)."""
    items = []
    for task in tasks:
        if task == "temporal_localization" and log["type"] == "normal":
            continue
        q = question(task, log, rng)
        a, r = answer(task, q, log, fps)
        items.append(Item(task=task, video_id=video_id, question=q, answer=a, reasoning=r,
                          item_index=item_index(video_id, task) if with_index else None))
    return items


def asked_type(question_text: str) -> str | None:
    """The event type a bcq question asks about."""
    return next((k for k, v in TYPE_TEXT.items() if v in question_text), None)


def option_of(question_text: str, event: str) -> str | None:
    """The letter of ``event``'s option in an mcq question."""
    return next((k for k, v in parse_options(question_text).items()
                 if v == TYPE_TEXT[event]), None)


def answer_option(item: Item) -> str | None:
    """The text of the option an mcq item's answer letter picks (None: no such option)."""
    return parse_options(item.question).get((item.answer or "").strip()[:1])


def type_of_answer(item: Item) -> str | None:
    """The event type an mcq item's answer names."""
    text = answer_option(item)
    return next((k for k, v in TYPE_TEXT.items() if v == text), None)


