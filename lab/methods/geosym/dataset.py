"""GeoSym problems as records, stratified splits, a curated bench split, builders.

:func:`make_problem` turns one integer seed into one problem (sample a
construction, ask a verified question, render it), so generation is
reproducible and parallel: :func:`generate` maps seeds over a process pool.
Problems whose solver timed out or disagreed with the float check are dropped
and counted (:class:`GenStats`), never emitted.

Records (plain dicts) hold ``id, seed, question, question_diagram, answer``
(the exact value as a sympy string), ``value`` (its float), ``question_type,
difficulty`` (derivation depth), ``stratum, cot, rules`` (the grammar rules
used, in order), ``n_points``, ``image`` (PNG bytes), ``points`` and
``labels`` (JSON: the exact coordinates of each point; the pixel position of
each point and of its label's box).

:func:`split` makes difficulty-stratified ``train`` / ``validation`` /
``test`` splits and a curated ``bench`` split (an equal number of problems per
question type and stratum, answers unique within a cell, no question text
shared with another split). :func:`to_hf` gives ``datasets.DatasetDict``;
:func:`build_tfds` prepares the same splits as an ``array_record`` TFDS
dataset (``lab.data.tfds``, no TensorFlow).
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import sympy as sp

from lab.methods.geosym import grammar, questions, render

SPLITS = ("train", "validation", "test", "bench")


@dataclass(frozen=True)
class GenConfig:
    """How problems are drawn: rules per construction, solver limits, image size."""

    min_rules: int = 0
    max_rules: int = 4
    max_points: int = 14
    timeout: float = 2.0  # seconds per problem for the exact solution
    max_ops: int = 40  # exact answers longer than this are not asked
    image_size: int = 1024
    dpi: int = 128
    render: bool = True
    kind: str | None = None  # one question type only

    def __post_init__(self):
        if not 0 <= self.min_rules <= self.max_rules:
            raise ValueError(f"GenConfig: min_rules={self.min_rules}, max_rules={self.max_rules}:"
                             " expected 0 <= min_rules <= max_rules")
        if self.kind is not None and self.kind not in questions.QUESTION_TYPES:
            raise ValueError(f"GenConfig.kind={self.kind!r}: expected one of "
                             f"{questions.QUESTION_TYPES}")
        if self.timeout <= 0:
            raise ValueError(f"GenConfig.timeout={self.timeout}: expected > 0 seconds")


@dataclass
class GenStats:
    problems: int = 0
    no_question: int = 0  # constructions where no candidate question solved
    degenerate: int = 0  # rejected and redrawn constructions or steps
    timeouts: int = 0  # candidate questions dropped for the time limit
    inexact: int = 0  # candidates dropped: not exact or exact != float
    unverified: int = 0  # chains of thought whose answer did not verify
    unsuitable: int = 0  # candidates not asked (zero, not a half-integer angle, too long)
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: GenStats) -> None:
        for k in ("problems", "no_question", "degenerate", "timeouts", "inexact", "unverified",
                  "unsuitable"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k, v in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + v


def _png(image) -> bytes:
    from PIL import Image  # noqa: PLC0415

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False, compress_level=3)
    return buf.getvalue()


def make_problem(seed: int, config: GenConfig = GenConfig()) -> tuple[dict | None, GenStats]:
    """One problem from ``seed`` (or ``None``), and what was rejected on the way."""
    rng = random.Random(seed)
    stats = GenStats()
    sstats = grammar.SampleStats()
    c = grammar.sample(rng, rng.randint(config.min_rules, config.max_rules),
                       max_points=config.max_points, stats=sstats)
    stats.degenerate, stats.reasons = sstats.degenerate, dict(sstats.reasons)
    qstats: dict[str, int] = {}
    q = questions.make_question(c, rng, kind=config.kind, timeout=config.timeout,
                                max_ops=config.max_ops, stats=qstats)
    stats.timeouts = qstats.get("timeouts", 0)
    stats.inexact = qstats.get("inexact", 0)
    stats.unverified = qstats.get("unverified", 0)
    stats.unsuitable = qstats.get("unsuitable", 0)
    if q is None:
        stats.no_question = 1
        return None, stats
    stats.problems = 1
    record = {
        "id": f"geosym-{seed}", "seed": seed, "question": q.question,
        "question_diagram": q.question_diagram, "answer": q.answer, "value": q.value,
        "question_type": q.kind, "difficulty": q.difficulty,
        "stratum": questions.stratum(q.difficulty), "cot": q.cot,
        "rules": [s.rule for s in c.steps], "n_points": len(c.points),
        "rel_error": q.rel_error,
        "points": json.dumps({n: [sp.sstr(p.exact[0]), sp.sstr(p.exact[1])]
                              for n, p in c.points.items()}),
    }
    if config.render:
        shaded = tuple(q.quantity[1:]) if q.quantity[0] == "shaded" else None
        r = render.render(c, shaded=shaded, size=config.image_size, dpi=config.dpi)
        record["image"] = _png(r.image)
        record["labels"] = json.dumps({"points": {n: [round(x, 2), round(y, 2)]
                                                  for n, (x, y) in r.points_px.items()},
                                       "labels": {n: [round(v, 2) for v in b]
                                                  for n, b in r.labels_px.items()}})
    else:
        record["image"] = b""
        record["labels"] = "{}"
    return record, stats


def _work(args):
    seed, config = args
    return make_problem(seed, config)


def generate(n: int, seed: int = 0, config: GenConfig = GenConfig(), *, workers: int = 1,
             chunksize: int = 4) -> tuple[list[dict], GenStats]:
    """``n`` problems from seeds ``seed * 1_000_003 + i`` (a process pool if ``workers > 1``,
    its workers spawned: forking a process that runs JAX's threads can deadlock the child).

    Seeds that yield no question are skipped and the next seeds used, so exactly
    ``n`` records come back (in seed order; the same for any ``workers``).
    """
    if n < 0:
        raise ValueError(f"generate: n={n}, expected >= 0")
    if workers < 1:
        raise ValueError(f"generate: workers={workers}, expected >= 1")
    base = seed * 1_000_003
    records: list[dict] = []
    total = GenStats()
    next_seed = 0
    pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            if workers > 1 else None)
    try:
        while len(records) < n:
            want = n - len(records)
            seeds = list(range(base + next_seed, base + next_seed + want + want // 10 + 1))
            next_seed += len(seeds)
            it = ((s, config) for s in seeds)
            results = (pool.map(_work, it, chunksize=chunksize) if pool
                       else map(_work, it))
            for rec, st in results:
                total.add(st)
                if rec is not None and len(records) < n:
                    records.append(rec)
    finally:
        if pool:
            pool.shutdown()
    total.problems = len(records)
    return records, total


def curate_bench(records: list[dict], per_cell: int, seed: int = 0,
                 max_points: int = 10) -> list[dict]:
    """Up to ``per_cell`` problems per (question type, stratum), answers unique per cell,
    figures of at most ``max_points`` points (readable diagrams)."""
    rng = random.Random(seed)
    order = [r for r in records if r["n_points"] <= max_points]
    rng.shuffle(order)
    cells: dict[tuple[str, str], list[dict]] = {}
    seen: set[tuple[str, str, str]] = set()
    for r in order:
        key = (r["question_type"], r["stratum"])
        if len(cells.setdefault(key, [])) >= per_cell or (*key, r["answer"]) in seen:
            continue
        seen.add((*key, r["answer"]))
        cells[key].append(r)
    return [r for key in sorted(cells) for r in cells[key]]


def split(records: list[dict], *, fractions=(0.8, 0.1, 0.1), bench_per_cell: int = 0,
          seed: int = 0) -> dict[str, list[dict]]:
    """Difficulty-stratified train / validation / test (+ a curated ``bench``).

    Duplicate question texts are kept once. The bench is taken first, then each
    stratum is shuffled and cut by ``fractions``, so every split has the
    strata in the same proportions (up to rounding).
    """
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-9 or min(fractions) < 0:
        raise ValueError(f"split: fractions={fractions}, expected three non-negative numbers "
                         "summing to 1 (train, validation, test)")
    unique = list({r["question"]: r for r in records}.values())
    bench = curate_bench(unique, bench_per_cell, seed) if bench_per_cell else []
    taken = {r["id"] for r in bench}
    rest = [r for r in unique if r["id"] not in taken]
    rng = random.Random(seed + 1)
    out = {"train": [], "validation": [], "test": [], "bench": bench}
    for s in questions.STRATA:
        group = [r for r in rest if r["stratum"] == s]
        rng.shuffle(group)
        n_tr = round(fractions[0] * len(group))
        n_va = round(fractions[1] * len(group))
        out["train"] += group[:n_tr]
        out["validation"] += group[n_tr:n_tr + n_va]
        out["test"] += group[n_tr + n_va:]
    return out


def to_sft(record: dict, *, diagram: bool = True) -> dict:
    """A supervised example: ``prompt`` (the diagram question, or the full text one),
    ``completion`` (the verified chain of thought, ending ``Answer: ...``), ``answer``
    (for the exact-match reward) and ``image`` (PNG bytes)."""
    prompt = record["question_diagram"] if diagram else record["question"]
    return {"prompt": prompt + " End with 'Answer: <exact value>'.",
            "completion": record["cot"], "answer": record["answer"], "image": record["image"]}


def strata_counts(records: Iterable[dict]) -> dict[str, int]:
    c = Counter(r["stratum"] for r in records)
    return {s: c.get(s, 0) for s in questions.STRATA}


# ======================================================================== builders
COLUMNS = ("id", "seed", "question", "question_diagram", "answer", "value", "question_type",
           "difficulty", "stratum", "cot", "rules", "n_points", "rel_error", "points", "labels")


def to_hf(splits: dict[str, list[dict]]):
    """A ``datasets.DatasetDict`` (one ``Dataset`` per split; ``image`` is a ``datasets.Image``)."""
    import datasets  # noqa: PLC0415

    features = datasets.Features({
        "id": datasets.Value("string"), "seed": datasets.Value("int64"),
        "question": datasets.Value("string"), "question_diagram": datasets.Value("string"),
        "answer": datasets.Value("string"), "value": datasets.Value("float64"),
        "question_type": datasets.Value("string"), "difficulty": datasets.Value("int32"),
        "stratum": datasets.Value("string"), "cot": datasets.Value("string"),
        "rules": datasets.Sequence(datasets.Value("string")),
        "n_points": datasets.Value("int32"), "rel_error": datasets.Value("float64"),
        "points": datasets.Value("string"), "labels": datasets.Value("string"),
        "image": datasets.Image(),
    })
    out = {}
    for name, recs in splits.items():
        cols = {k: [r[k] for r in recs] for k in COLUMNS}
        cols["image"] = [{"bytes": r["image"] or None, "path": None} if r["image"] else None
                         for r in recs]
        out[name] = datasets.Dataset.from_dict(cols, features=features)
    return datasets.DatasetDict(out)


def tfds_features():
    import numpy as np  # noqa: PLC0415
    import tensorflow_datasets as tfds  # noqa: PLC0415

    f = tfds.features
    return f.FeaturesDict({
        "id": f.Text(), "seed": f.Scalar(np.int64), "question": f.Text(),
        "question_diagram": f.Text(), "answer": f.Text(), "value": f.Scalar(np.float64),
        "question_type": f.Text(), "difficulty": f.Scalar(np.int32), "stratum": f.Text(),
        "cot": f.Text(), "rules": f.Text(), "n_points": f.Scalar(np.int32),
        "rel_error": f.Scalar(np.float64), "points": f.Text(), "labels": f.Text(),
        "image": f.Image(shape=(None, None, 3), encoding_format="png"),
    })


def build_tfds(splits: dict[str, list[dict]], data_dir: str | os.PathLike, *,
               version: str = "1.0.0"):
    """Prepare ``splits`` as the TFDS dataset ``geosym`` (array_record) under ``data_dir``.

    Returns the builder; read it back with ``lab.data.tfds.load(builder.data_dir)``
    (``rules`` is stored as a JSON list).
    """
    from lab.data import tfds as ltfds  # noqa: PLC0415

    for name, recs in splits.items():
        for r in recs:
            if not r.get("image"):
                raise ValueError(f"build_tfds: split {name!r} record {r.get('id')!r} has no "
                                 "image; generate with GenConfig(render=True)")

    def gen(recs):
        def _gen():
            for r in recs:
                ex = {k: r[k] for k in COLUMNS}
                ex["rules"] = json.dumps(r["rules"])
                ex["image"] = io.BytesIO(r["image"])
                yield r["id"], ex
        return _gen

    return ltfds.build("geosym", tfds_features(), {k: gen(v) for k, v in splits.items() if v},
                       data_dir, version=version, shuffle=False,
                       description="GeoSym: synthetic geometry problems with exact answers.")


def config_dict(config: GenConfig) -> dict:
    return asdict(config)
