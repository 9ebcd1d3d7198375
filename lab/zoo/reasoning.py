"""The reasoning zoo's regime: accuracy by difficulty, pass@k and the checks on them.

A chain-of-thought model is only useful to a method when it solves easy problems, fails
hard ones, and samples different chains: :func:`measure_regime` measures that on held-out
arithmetic (:func:`lab.data.synthetic.arithmetic`), one level per ``(steps, digits)`` of
the training mixture, and :func:`regime_checks` / :func:`family_checks` decide whether a
model, and a family of sizes, are in the regime the reasoning methods need.

Per level it records, on prompts that never occur in training:

- ``accuracy``: greedy decoding's final answer equals the true result;
- ``chain_correct``: greedy decoding's chain is valid step by step
  (:func:`lab.data.synthetic.arithmetic.check_chain`) with the right answer;
- ``exact_match``: teacher-forced whole-completion match (:func:`lab.zoo.evaluate`),
  which equals greedy decoding reproducing the reference token for token;
- ``step_accuracy``: the mean fraction of the problem's steps that greedy decoding
  wrote validly; ``malformed``: the share of greedy completions with a step that does
  not parse or without an integer answer;
- ``pass@k`` for each ``k`` of :class:`RegimeConfig`: the unbiased estimator of Chen et
  al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1),
  ``1 - C(n - c, k) / C(n, k)`` over ``n`` completions sampled at ``temperature``,
  ``c`` of them with the right answer; ``distinct``: distinct completions per prompt.

A spec asks for this with ``ZooSpec.regime`` (the :class:`RegimeConfig` fields to
override, ``{}`` for the defaults); :func:`lab.zoo.train.train_model` then stores the
result in the entry's metrics under ``"regime"`` (``zoo.metrics(name)["regime"]``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from lab.data import ByteTokenizer
from lab.data.synthetic.arithmetic import arithmetic, check_chain, parse_chain
from lab.data.synthetic.base import as_range

ACCURACY = "accuracy"  # the field the bounds and the family ordering are checked on
_REGIME_SEED = 60617   # the regime's held-out prompts: another seed than training's


@dataclasses.dataclass(frozen=True)
class RegimeConfig:
    """How the regime is measured and the bounds it is checked against.

    n_prompts:   held-out prompts per ``(steps, digits)`` level.
    samples:     completions sampled per prompt for pass@k (>= max(ks)).
    ks:          the k of pass@k.
    temperature: sampling temperature of the pass@k completions.
    batch_size:  rows per generation call (one compiled shape).
    seed:        seed of the held-out prompts and of the sampling.
    easy_min:    the easiest level's accuracy must be at least this.
    hard_range:  the hardest level's accuracy must lie in this closed interval.
    pass_margin: pass@max(ks) must exceed pass@1 by at least this, over all prompts.
    """

    n_prompts: int = 200
    samples: int = 8
    ks: tuple[int, ...] = (1, 8)
    temperature: float = 1.0
    batch_size: int = 256
    seed: int = 0
    easy_min: float = 0.85
    hard_range: tuple[float, float] = (0.15, 0.6)
    pass_margin: float = 0.1

    def __post_init__(self):
        for name in ("n_prompts", "samples", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"RegimeConfig.{name}={v!r}; expected an int >= 1")
        ks = tuple(self.ks)
        if not ks or any(not isinstance(k, int) or k < 1 for k in ks) or 1 not in ks:
            raise ValueError(f"RegimeConfig.ks={self.ks!r}; expected ints >= 1 including 1")
        if max(ks) > self.samples:
            raise ValueError(f"RegimeConfig.ks={self.ks!r} needs samples >= {max(ks)}, got "
                             f"samples={self.samples}")
        object.__setattr__(self, "ks", tuple(sorted(set(ks))))
        if not isinstance(self.temperature, (int, float)) or self.temperature <= 0:
            raise ValueError(f"RegimeConfig.temperature={self.temperature!r}; expected > 0")
        lo, hi = self.hard_range
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"RegimeConfig.hard_range={self.hard_range!r}; expected "
                             "0 <= lo <= hi <= 1")
        object.__setattr__(self, "hard_range", (float(lo), float(hi)))

    @classmethod
    def from_mapping(cls, d: Mapping | None) -> RegimeConfig:
        """The config of a spec's ``regime`` field (unknown keys raise ValueError)."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ZooSpec.regime keys {unknown} are unknown; expected any of "
                             f"{sorted(known)}")
        if "ks" in d:
            d["ks"] = tuple(d["ks"])
        if "hard_range" in d:
            d["hard_range"] = tuple(d["hard_range"])
        return cls(**d)

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's unbiased pass@k from ``n`` samples of which ``c`` are correct:
    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}); expected 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def levels(task: Mapping) -> list[tuple[int, int]]:
    """The ``(steps, digits)`` levels of an arithmetic task's keyword arguments (the
    generator's defaults where absent), in order of difficulty ``steps * digits``."""
    steps = as_range("steps", task.get("steps", (1, 4)), 1, 32)
    digits = as_range("digits", task.get("digits", (1, 2)), 1, 9)
    grid = itertools.product(range(steps[0], steps[1] + 1), range(digits[0], digits[1] + 1))
    return sorted(grid, key=lambda sd: (sd[0] * sd[1], sd[1]))


def held_out_levels(task: Mapping, n: int, seed: int, exclude: set[str] = frozenset()):
    """``{(steps, digits): Dataset}``: up to ``n`` distinct prompts per level, none in
    ``exclude`` (the training prompts), drawn with their own seed per level. A level whose
    prompts are all in ``exclude`` (one-step one-digit sums, say) raises ValueError."""
    ops = task.get("ops", "+-")
    out = {}
    for steps, digits in levels(task):
        level_seed = int(np.random.default_rng([seed, _REGIME_SEED, steps, digits])
                         .integers(2**31))
        pool = arithmetic(8 * n, level_seed, steps=steps, digits=digits, ops=ops)
        seen, keep = set(exclude), []
        for i, p in enumerate(pool["prompt"]):
            if p not in seen:
                seen.add(p)
                keep.append(i)
            if len(keep) == n:
                break
        if not keep:
            raise ValueError(f"level steps={steps}, digits={digits} has no prompt outside the "
                             "training set; train on fewer examples or drop the level")
        out[(steps, digits)] = pool.select(keep)
    return out


def level_metrics(rows, greedy: Sequence[str], sampled: Sequence[str], config: RegimeConfig,
                  exact_match: float) -> dict:
    """The numbers of one level (see the module docstring) from its rows (``operands``,
    ``ops``), one greedy completion per row, ``config.samples`` sampled completions per row
    (row-major: row 0's first) and the level's teacher-forced ``exact_match``.
    ``sampled_correct`` lists each row's number of sampled completions with the right
    answer."""
    n, s = len(rows), config.samples
    checks = [check_chain(t, o, p) for t, o, p in zip(greedy, rows["operands"], rows["ops"],
                                                      strict=True)]
    correct = np.zeros((n, s), bool)
    distinct = []
    for i, (ops_, operands) in enumerate(zip(rows["ops"], rows["operands"], strict=True)):
        group = sampled[i * s:(i + 1) * s]
        correct[i] = [check_chain(t, operands, ops_).answer_correct for t in group]
        distinct.append(len(set(group)))
    c = correct.sum(1)
    out = {
        "n": n,
        ACCURACY: float(np.mean([ch.answer_correct for ch in checks])),
        "chain_correct": float(np.mean([ch.chain_correct for ch in checks])),
        "exact_match": exact_match,
        "step_accuracy": float(np.mean([sum(ch.steps_gold) / ch.n_expected for ch in checks])),
        "malformed": float(np.mean([_malformed(t) for t in greedy])),
        "distinct": float(np.mean(distinct)),
        "sampled_correct": c.tolist(),
    }
    for k in config.ks:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(s, int(ci), k) for ci in c]))
    return out


def _malformed(text: str) -> bool:
    """A step that does not parse, or no integer answer."""
    steps, answer = parse_chain(text)
    return answer is None or any(not st.well_formed for st in steps)


def measure_regime(model, task: Mapping, exclude: set[str], seq_len: int,
                   config: RegimeConfig | None = None, data_seed: int = 0,
                   tokenizer=None) -> dict:
    """The regime block of a model trained on the arithmetic ``task`` (its generator
    keyword arguments): per level, by difficulty, overall pass@k, and :func:`regime_checks`.

    ``exclude``: the training prompts (held-out prompts avoid them); ``seq_len``: the
    teacher-forced evaluation's row length; ``data_seed``: the spec's data seed, mixed
    into the held-out prompts' seed.
    """
    from lab import infer
    from lab.zoo.evaluate import evaluate

    config = config or RegimeConfig()
    tok = tokenizer or ByteTokenizer()
    sets = held_out_levels(task, config.n_prompts, config.seed + 1009 * data_seed, exclude)
    prompt_ids = [len(tok.encode(p, add_bos=True)) for ds in sets.values() for p in ds["prompt"]]
    completion_ids = [len(tok.encode(c)) for ds in sets.values() for c in ds["completion"]]
    width = max(prompt_ids)
    max_new = min(max(completion_ids) + 9, model.config.max_len - width)  # EOS + slack
    per_level = []
    for li, ((steps, digits), ds) in enumerate(sets.items()):
        tf = evaluate(model, ds.map(lambda r: {"task": "level"}), tok, seq_len)
        greedy = infer.complete(model, tok, ds["prompt"], max_new_tokens=max_new, width=width,
                                batch=config.batch_size)
        repeated = [p for p in ds["prompt"] for _ in range(config.samples)]
        sampled = infer.complete(model, tok, repeated, max_new_tokens=max_new, width=width,
                                 batch=config.batch_size, temperature=config.temperature,
                                 seed=config.seed * 100003 + li * 10007)
        m = level_metrics(ds, greedy, sampled, config, tf["level"]["exact_match"])
        per_level.append({"steps": steps, "digits": digits, "difficulty": steps * digits, **m})
    by_difficulty = group_by_difficulty(per_level, config.ks)
    overall = {f"pass@{k}": _weighted(per_level, f"pass@{k}") for k in config.ks}
    overall[ACCURACY] = _weighted(per_level, ACCURACY)
    return {"config": config.to_dict(), "levels": per_level, "by_difficulty": by_difficulty,
            "overall": overall, "checks": regime_checks(by_difficulty, overall, config)}


def _weighted(rows: Sequence[Mapping], field: str) -> float:
    n = sum(r["n"] for r in rows)
    return float(sum(r[field] * r["n"] for r in rows) / n)


def group_by_difficulty(per_level: Sequence[Mapping], ks: Sequence[int] = (1, 8)) -> dict:
    """``{str(difficulty): {"n", accuracy, chain_correct, exact_match, pass@k...}}``, the
    levels of each difficulty pooled (weighted by their prompt counts), in increasing
    difficulty."""
    fields = [ACCURACY, "chain_correct", "exact_match", "step_accuracy"] + [
        f"pass@{k}" for k in ks]
    out = {}
    for d in sorted({r["difficulty"] for r in per_level}):
        rows = [r for r in per_level if r["difficulty"] == d]
        out[str(d)] = {"n": sum(r["n"] for r in rows),
                       **{f: _weighted(rows, f) for f in fields}}
    return out


def regime_checks(by_difficulty: Mapping[str, Mapping], overall: Mapping,
                  config: RegimeConfig | None = None) -> dict:
    """Whether one model is in the regime, from its numbers alone.

    ``falls_with_difficulty``: accuracy never rises from one difficulty to the next and the
    hardest is below the easiest; ``easiest``: accuracy >= ``easy_min`` at the lowest
    difficulty; ``hardest``: accuracy within ``hard_range`` at the highest; ``diverse``:
    overall pass@max(k) >= pass@1 + ``pass_margin``; ``ok``: all four.
    """
    config = config or RegimeConfig()
    order = sorted(by_difficulty, key=int)
    if len(order) < 2:
        raise ValueError(f"by_difficulty has levels {order}; the regime needs at least two")
    acc = [float(by_difficulty[d][ACCURACY]) for d in order]
    lo, hi = config.hard_range
    kmax = max(config.ks)
    checks = {
        "falls_with_difficulty": all(b <= a for a, b in itertools.pairwise(acc))
        and acc[-1] < acc[0],
        "easiest": acc[0] >= config.easy_min,
        "hardest": lo <= acc[-1] <= hi,
        "diverse": overall[f"pass@{kmax}"] >= overall["pass@1"] + config.pass_margin,
    }
    checks["ok"] = all(checks.values())
    return checks


def family_checks(family: Sequence[tuple[str, Mapping[str, Mapping]]]) -> dict:
    """Whether each model of ``family`` (``(name, by_difficulty)`` from smallest to largest)
    is more accurate than the one before it at every difficulty they share:
    ``{"ordered": bool, "violations": ["<difficulty>: <small> acc >= <large> acc", ...]}``."""
    if len(family) < 2:
        raise ValueError(f"family has {len(family)} models; expected at least two to compare")
    violations = []
    for (a, ra), (b, rb) in itertools.pairwise(family):
        for d in sorted(set(ra) & set(rb), key=int):
            x, y = float(ra[d][ACCURACY]), float(rb[d][ACCURACY])
            if not y > x:
                violations.append(f"difficulty {d}: {a} {x:.3f} >= {b} {y:.3f}")
    return {"ordered": not violations, "violations": violations}


def spec_regime(spec, model, train_prompts: set[str], tokenizer=None) -> dict:
    """:func:`measure_regime` for a spec with ``regime`` set, on its arithmetic task (the
    one task of its mixture named ``arithmetic``); ValueError when it has none."""
    tasks = spec.data["tasks"]
    if "arithmetic" not in tasks:
        raise ValueError(f"ZooSpec.regime is set on {spec.name!r}, whose tasks {sorted(tasks)} "
                         "have no 'arithmetic'; the regime is measured on arithmetic")
    task = {k: v for k, v in tasks["arithmetic"].items() if k != "weight"}
    return measure_regime(model, task, train_prompts, spec.seq_len,
                          RegimeConfig.from_mapping(spec.regime), spec.data["seed"], tokenizer)


__all__ = ["ACCURACY", "RegimeConfig", "family_checks", "group_by_difficulty",
           "held_out_levels", "level_metrics", "levels", "measure_regime", "pass_at_k",
           "regime_checks", "spec_regime"]
