"""Blind baselines for multiple-choice sets: how well can one answer without the pixels?

Each baseline is fitted on one half of a dataset and scored on the other half
(rows split at random by ``seed``); a sound generator keeps all of them within
a few points of chance, ``1 / n_options`` (Goyal et al. 2017's "blind" VQA
baselines; the question-only and answer-prior checks of Video-MME's and
LongVideoBench's papers). The rows need ``prompt``, ``question``, ``options``,
``answer_index`` and ``question_type``.

- ``most_frequent_letter``: the training set's most common answer letter;
- ``template_letter``: the most common letter per ``(question_type, template)``;
- ``question_prior``: per exact question text, the option text most often
  correct in training (answer-content prior; a random option for unseen text);
- ``option_prior``: per question type, the option whose text is most often
  correct when offered (the ratio correct / offered);
- ``bag_of_words``: a naive-Bayes word vote: every word of the prompt
  (question and options) adds ``log P(letter | word)`` (add-one smoothed
  counts of the answer letters of the training prompts that contain it).
"""

from __future__ import annotations

import collections
import re

import numpy as np

BASELINES = ("most_frequent_letter", "template_letter", "question_prior", "option_prior",
             "bag_of_words")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def text_baselines(ds, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy of each of :data:`BASELINES` on ``ds`` (a Dataset or list of rows),
    plus ``"chance"`` (the mean of ``1 / len(options)``)."""
    rows = ds.to_list() if hasattr(ds, "to_list") else list(ds)
    for field in ("prompt", "question", "options", "answer_index", "question_type"):
        if rows and field not in rows[0]:
            raise ValueError(f"rows lack field {field!r}; expected multiple-choice rows")
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} rows; expected at least 4 to fit and score baselines")
    rng = np.random.default_rng([seed, 31])
    order = rng.permutation(len(rows))
    train = [rows[int(i)] for i in order[: len(rows) // 2]]
    test = [rows[int(i)] for i in order[len(rows) // 2:]]

    letters = collections.Counter(r["answer_index"] for r in train)
    by_template = collections.defaultdict(collections.Counter)
    by_question = collections.defaultdict(collections.Counter)
    offered = collections.defaultdict(collections.Counter)
    correct = collections.defaultdict(collections.Counter)
    word_votes = collections.defaultdict(collections.Counter)
    for r in train:
        a = r["answer_index"]
        by_template[(r["question_type"], r.get("template", 0))][a] += 1
        by_question[r["question"]][r["options"][a]] += 1
        for opt in r["options"]:
            offered[r["question_type"]][opt] += 1
        correct[r["question_type"]][r["options"][a]] += 1
        for w in set(_words(r["prompt"])):
            word_votes[w][a] += 1
    top_letter = letters.most_common(1)[0][0]

    hits = {name: [] for name in BASELINES}
    for r in test:
        a, opts, qt = r["answer_index"], r["options"], r["question_type"]
        k = len(opts)
        hits["most_frequent_letter"].append(top_letter == a)
        tmpl = by_template.get((qt, r.get("template", 0)))
        hits["template_letter"].append(
            (tmpl.most_common(1)[0][0] if tmpl else int(rng.integers(k))) == a)
        seen = by_question.get(r["question"], collections.Counter())
        score = np.array([seen[o] for o in opts], float) + rng.uniform(0, 1e-3, k)
        hits["question_prior"].append(int(np.argmax(score)) == a)
        ratio = np.array([correct[qt][o] / max(1, offered[qt][o]) for o in opts])
        hits["option_prior"].append(int(np.argmax(ratio + rng.uniform(0, 1e-9, k))) == a)
        vote = np.zeros(k)
        for w in set(_words(r["prompt"])):
            c = word_votes.get(w)
            if c:                                     # add-one smoothed log P(letter | word)
                total = sum(c.values())
                vote += np.log(np.array([(c[j] + 1) / (total + k) for j in range(k)]))
        hits["bag_of_words"].append(int(np.argmax(vote + rng.uniform(0, 1e-9, k))) == a)
    out = {name: float(np.mean(v)) for name, v in hits.items()}
    out["chance"] = float(np.mean([1 / len(r["options"]) for r in test]))
    return out
