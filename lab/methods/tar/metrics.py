"""One evaluator per TAR task type.

* ``bcq``: accuracy of a yes/no answer (:func:`normalise_yes_no`);
* ``mcq``: accuracy of an option letter (:func:`normalise_choice`);
* ``temporal_localization``: mean temporal IoU of a ``{"start", "end"}`` JSON interval
  (:func:`parse_interval`); a prediction that does not parse scores 0 and is counted as
  malformed;
* the open-ended tasks: BERTScore F1 (Zhang et al., "BERTScore: Evaluating Text
  Generation with BERT", ICLR 2020) when a scorer model directory is given
  (:mod:`lab.methods.tar.bertscore`), else the offline fallback, ROUGE-L F1 (Lin,
  "ROUGE: A Package for Automatic Evaluation of Summaries", 2004) over the tokens of
  :func:`tokens`; token-level F1 (SQuAD, Rajpurkar et al. 2016) is reported beside it.

This follows the metrics the TAR release's evaluator names (bcq/mcq accuracy,
temporal-localization mean IoU, BERTScore F1 for open-ended tasks); the normalisation
rules are ours and are written out in each function.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

_MARKUP = re.compile(r"</?\s*answer\s*>|\*\*|__|`", re.I)
TRACE = ("<think>", "</think>")   # a reasoning trace's span, which the evaluator drops
_THINK = re.compile(f"{re.escape(TRACE[0])}.*?{re.escape(TRACE[1])}", re.I | re.S)
_PREFIX = re.compile(r"^\s*(final\s+)?answer\s*[:\-]\s*", re.I)


def _strip(text: str) -> str:
    text = _THINK.sub(" ", text)
    text = _MARKUP.sub(" ", text)
    text = text.strip().strip("\"'“”‘’([{ \t\n")
    return _PREFIX.sub("", text).strip()


def normalise_yes_no(text: str | None) -> str | None:
    """``"yes"``, ``"no"`` or None (malformed). Rule: drop ``<think>...</think>``, answer
    tags, markdown emphasis, leading quotes/brackets and an ``answer:`` prefix; the first
    word (case-insensitive, trailing punctuation ignored) must be ``yes`` or ``no``."""
    if not isinstance(text, str):
        return None
    m = re.match(r"([A-Za-z]+)", _strip(text))
    word = m.group(1).lower() if m else ""
    return word if word in ("yes", "no") else None


_OPTION_LINE = re.compile(r"^\s*\(?([A-Ha-h])[\.\):]\s+(.+?)\s*$", re.M)


def parse_options(question: str) -> dict[str, str]:
    """``{"A": text, ...}`` from option lines ``A. text`` / ``(A) text`` / ``A) text``."""
    return {m.group(1).upper(): m.group(2) for m in _OPTION_LINE.finditer(question)}


def normalise_choice(text: str | None, options: dict[str, str] | None = None) -> str | None:
    """An option letter ``"A"``..``"H"`` or None (malformed). Rule: after
    :func:`normalise_yes_no`'s stripping, when ``options`` are given and the text equals
    one option's text (case-, article- and punctuation-insensitive), that option (checked
    first: "A collision ..." is an option's text, not option A); else the answer starts
    with a letter standing alone (``B``, ``B.``, ``(B)``, ``B)``, ``B:``, ``option B``)
    that is one of the options."""
    if not isinstance(text, str):
        return None
    s = re.sub(r"^\s*option\s+", "", _strip(text), flags=re.I)
    if options:
        want = " ".join(tokens(s))
        for letter, option in options.items():
            if want and want == " ".join(tokens(option)):
                return letter
    m = re.match(r"\(?([A-Ha-h])(?:[\.\):,]|\s|$)", s)
    if m and (len(s) == 1 or not s[1].isalpha()):
        letter = m.group(1).upper()
        if options is None or letter in options:
            return letter
    return None


def accuracy(predictions: Sequence[str | None], answers: Sequence[str | None], kind: str,
             questions: Sequence[str] | None = None) -> dict:
    """``{"score", "n", "malformed"}``: the fraction of predictions whose normalised form
    (``kind`` ``"yes_no"`` or ``"choice"``) equals the normalised answer; a prediction
    that does not normalise is wrong and counted as malformed."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    correct, malformed = [], 0
    for i, (pred, ans) in enumerate(zip(predictions, answers, strict=True)):
        if kind == "yes_no":
            p, a = normalise_yes_no(pred), normalise_yes_no(ans)
        elif kind == "choice":
            opts = parse_options(questions[i]) if questions is not None else None
            p, a = normalise_choice(pred, opts), normalise_choice(ans, opts)
        else:
            raise ValueError(f"kind={kind!r}; expected 'yes_no' or 'choice'")
        if a is None:
            raise ValueError(f"answer {i} ({ans!r:.60}) does not normalise as {kind}")
        malformed += p is None
        correct.append(p == a)
    return {"score": float(np.mean(correct)) if correct else float("nan"),
            "n": len(correct), "malformed": malformed}


def parse_time(value) -> float | None:
    """Seconds from a number, ``"12.5"``, ``"12.5s"``, ``"MM:SS(.s)"`` or
    ``"HH:MM:SS(.s)"``; None when it does not parse or is negative / not finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        s = value.strip().lower().removesuffix("seconds").removesuffix("s").strip()
        parts = s.split(":")
        try:
            if len(parts) == 1:
                v = float(parts[0])
            elif len(parts) in (2, 3):
                nums = [float(p) for p in parts]
                v = sum(n * 60 ** (len(nums) - 1 - k) for k, n in enumerate(nums))
            else:
                return None
        except ValueError:
            return None
    else:
        return None
    return v if np.isfinite(v) and v >= 0 else None


_OBJECT = re.compile(r"\{[^{}]*\}", re.S)


def parse_interval(text: str | None) -> tuple[float, float] | None:
    """``(start, end)`` in seconds from the first JSON object in ``text`` that has
    ``start`` and ``end`` keys (values as :func:`parse_time` reads them); None
    (malformed) when there is none, a value does not parse, or ``end < start``."""
    if not isinstance(text, str):
        return None
    for m in _OBJECT.finditer(text):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "start" in obj and "end" in obj:
            start, end = parse_time(obj["start"]), parse_time(obj["end"])
            if start is None or end is None or end < start:
                return None
            return start, end
    return None


def temporal_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Intersection over union of two closed intervals; two equal points score 1."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    if union <= 0:
        return 1.0 if a == b else 0.0
    return inter / union


def mean_iou(predictions: Sequence[str | None], answers: Sequence[str]) -> dict:
    """``{"score", "n", "malformed"}``: mean :func:`temporal_iou`; a malformed prediction
    scores 0 and is counted."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    ious, malformed = [], 0
    for i, (pred, ans) in enumerate(zip(predictions, answers, strict=True)):
        gt = parse_interval(ans)
        if gt is None:
            raise ValueError(f"answer {i} ({ans!r:.60}) is not a {{start, end}} interval")
        p = parse_interval(pred)
        malformed += p is None
        ious.append(0.0 if p is None else temporal_iou(p, gt))
    return {"score": float(np.mean(ious)) if ious else float("nan"), "n": len(ious),
            "malformed": malformed}


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits runs; ``12.5`` stays one token), with
    the articles a / an / the dropped (SQuAD's normalisation)."""
    words = re.findall(r"[a-z]+|\d+(?:\.\d+)?", text.lower())
    return [w for w in words if w not in ("a", "an", "the")]


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 of the bags of :func:`tokens`; 1 when both are empty."""
    p, r = tokens(prediction), tokens(reference)
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def _lcs(a: list[str], b: list[str]) -> int:
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (beta = 1) of the longest common subsequence of :func:`tokens`."""
    p, r = tokens(prediction), tokens(reference)
    if not p or not r:
        return float(p == r)
    lcs = _lcs(p, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def text_similarity(predictions: Sequence[str | None], answers: Sequence[str],
                    scorer=None) -> dict:
    """``{"score", "metric", "n", "malformed", "token_f1"}`` for open-ended answers.

    ``scorer``: a :class:`lab.methods.tar.bertscore.BERTScorer` (``score`` is its mean F1,
    ``metric`` ``"bertscore_f1"``) or None (``score`` is the mean :func:`rouge_l`,
    ``metric`` ``"rouge_l"``). A ``<think>...</think>`` span is dropped first, as for the
    choice tasks; a missing or empty prediction scores 0 and is counted as malformed."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    preds = [_THINK.sub(" ", p).strip() if isinstance(p, str) else "" for p in predictions]
    malformed = sum(not p.strip() for p in preds)
    f1 = [token_f1(p, a) if p.strip() else 0.0 for p, a in zip(preds, answers, strict=True)]
    if scorer is None:
        scores = [rouge_l(p, a) if p.strip() else 0.0
                  for p, a in zip(preds, answers, strict=True)]
        metric = "rouge_l"
    else:
        scores = [float(s) if p.strip() else 0.0
                  for s, p in zip(scorer.f1(preds, list(answers)), preds, strict=True)]
        metric = "bertscore_f1"
    mean = lambda v: float(np.mean(v)) if len(v) else float("nan")
    return {"score": mean(scores), "metric": metric, "n": len(scores),
            "malformed": malformed, "token_f1": mean(f1)}


def choice_chance(items) -> dict[str, float]:
    """Chance accuracy of bcq and mcq on ``items`` (those with answers): the larger of the
    majority answer's rate and 1 / the number of options (2 for bcq, 5 for mcq)."""
    out = {}
    for task, floor in (("bcq", 0.5), ("mcq", 0.2)):
        answers = [it.answer for it in items if it.task == task]
        if answers:
            top = max(answers.count(a) for a in set(answers)) / len(answers)
            out[task] = max(top, floor)
    return out
