"""The reasoning zoo's regime: pass@k, the per-level numbers, the checks on fabricated numbers,
the training hook on a tiny spec, and (slow) the cot models' regime bounds on the cached models."""

import math

import numpy as np
import pytest
from flax import nnx

from lab import zoo
from lab.data import ByteTokenizer
from lab.data.synthetic.arithmetic import arithmetic
from lab.nn import Transformer
from lab.zoo import reasoning
from lab.zoo.reasoning import RegimeConfig, family_checks, pass_at_k, regime_checks
from lab.zoo.spec import byte_lm, train_recipe

COT = ("cot-xs", "cot-s", "cot-m")  # smallest to largest


def _by_difficulty(accs):
    return {str(d): {"accuracy": a, "n": 100} for d, a in zip((2, 4, 6, 8), accs, strict=True)}


GOOD = _by_difficulty([0.95, 0.8, 0.6, 0.4])
DIVERSE = {"pass@1": 0.6, "pass@8": 0.85}


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)       # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(16, 0, 8) == 0.0 and pass_at_k(16, 9, 8) == 1.0
    for n, c, k in [(16, 3, 8), (16, 5, 1), (10, 2, 4), (8, 1, 8)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError, match=r"pass_at_k\(n=4, c=5, k=1\)"):
        pass_at_k(4, 5, 1)


def test_regime_checks_on_fabricated_numbers():
    assert regime_checks(GOOD, DIVERSE) == {"falls_with_difficulty": True, "easiest": True,
                                            "hardest": True, "diverse": True, "ok": True}
    cases = {
        "easiest": _by_difficulty([0.84, 0.8, 0.6, 0.4]),
        "falls_with_difficulty": _by_difficulty([0.95, 0.6, 0.8, 0.4]),
    }
    for failed, numbers in cases.items():
        checks = regime_checks(numbers, DIVERSE)
        assert not checks[failed] and not checks["ok"]
        assert all(v for k, v in checks.items() if k not in (failed, "ok"))
    for hardest in (0.1, 0.61):   # too hard, too easy
        checks = regime_checks(_by_difficulty([0.95, 0.8, 0.7, hardest]), DIVERSE)
        assert not checks["hardest"] and not checks["ok"]
    for hardest in (0.15, 0.6):   # the bounds are closed
        assert regime_checks(_by_difficulty([0.95, 0.8, 0.7, hardest]), DIVERSE)["ok"]
    assert not regime_checks(GOOD, {"pass@1": 0.6, "pass@8": 0.69})["diverse"]
    flat = _by_difficulty([0.9, 0.9, 0.9, 0.9])  # never rises, but does not fall either
    assert not regime_checks(flat, DIVERSE)["falls_with_difficulty"]
    with pytest.raises(ValueError, match="at least two"):
        regime_checks({"2": {"accuracy": 1.0}}, DIVERSE)


def test_family_checks_need_every_level_to_improve_with_size():
    small, mid, large = (_by_difficulty(a) for a in ([0.9, 0.7, 0.4, 0.2], [0.95, 0.8, 0.6, 0.3],
                                                     [0.99, 0.9, 0.7, 0.5]))
    assert family_checks([("xs", small), ("s", mid), ("m", large)]) == {"ordered": True,
                                                                        "violations": []}
    tie = _by_difficulty([0.95, 0.85, 0.6, 0.35])
    out = family_checks([("s", mid), ("m", tie)])
    assert not out["ordered"] and out["violations"] == ["difficulty 2: s 0.950 >= m 0.950",
                                                        "difficulty 6: s 0.600 >= m 0.600"]
    with pytest.raises(ValueError, match="at least two"):
        family_checks([("s", mid)])


def test_regime_config_validates_and_round_trips():
    config = RegimeConfig.from_mapping({"ks": [8, 1], "samples": 8})
    assert config.ks == (1, 8) and RegimeConfig.from_mapping(config.to_dict()) == config
    for bad, match in [({"ks": (2, 8)}, "including 1"), ({"samples": 4}, "samples >= 8"),
                       ({"n_prompts": 0}, "n_prompts=0"), ({"hard_range": (0.7, 0.2)},
                                                           "hard_range"),
                       ({"temperature": 0}, "temperature=0"), ({"nope": 1}, "'nope'")]:
        with pytest.raises(ValueError, match=match):
            RegimeConfig.from_mapping(bad)


def test_levels_and_held_out_prompts_avoid_training():
    assert reasoning.levels({"steps": (1, 3), "digits": (1, 2)}) == [
        (1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (3, 2)]
    train = set(arithmetic(3000, 0, steps=(1, 2), digits=2)["prompt"])
    sets = reasoning.held_out_levels({"steps": (1, 2), "digits": 2}, 50, seed=0, exclude=train)
    assert list(sets) == [(1, 2), (2, 2)]
    for (steps, digits), ds in sets.items():
        assert len(ds) == 50 and len(set(ds["prompt"])) == 50
        assert not set(ds["prompt"]) & train
        assert set(ds["steps"]) == {steps} and set(ds["digits"]) == {digits}
    every = set(arithmetic(4000, 1, steps=1, digits=1)["prompt"])  # all 162 one-digit sums
    with pytest.raises(ValueError, match="steps=1, digits=1 has no prompt outside"):
        reasoning.held_out_levels({"steps": 1, "digits": 1}, 10, seed=0, exclude=every)


def test_level_metrics_count_answers_chains_and_samples():
    rows = arithmetic(4, 5, steps=2, digits=2)
    gold = rows["completion"]
    wrong = [c.rsplit("A: ", 1)[0] + "A: 99999" for c in gold]       # right chain, wrong answer
    greedy = [gold[0], gold[1], wrong[2], "12+3x=4\nA: 7"]
    config = RegimeConfig(samples=4, ks=(1, 2))
    # row i has i right samples of 4; row 0's four samples are all the same text
    sampled = [g for i in range(4) for g in [gold[i]] * i + [wrong[i]] * (4 - i)]
    m = reasoning.level_metrics(rows, greedy, sampled, config, exact_match=0.5)
    assert m["n"] == 4 and m["accuracy"] == 0.5 and m["chain_correct"] == 0.5
    assert m["malformed"] == 0.25 and m["exact_match"] == 0.5
    assert m["step_accuracy"] == pytest.approx((1 + 1 + 1 + 0) / 4)
    assert m["sampled_correct"] == [0, 1, 2, 3]
    assert m["pass@1"] == pytest.approx(np.mean([0, 1, 2, 3]) / 4)
    assert m["pass@2"] == pytest.approx(np.mean([pass_at_k(4, c, 2) for c in range(4)]))
    assert m["distinct"] == pytest.approx((1 + 2 + 2 + 2) / 4)


def test_measure_regime_on_a_tiny_model(monkeypatch):
    """The whole measurement on a random tiny model, with greedy decoding replaced by an
    oracle that solves the prompts whose first operand is even: the accuracies are exactly
    those shares; teacher-forced exact match is the random model's (0)."""
    model = Transformer(byte_lm(32, 1, 2, 1, 64, 128), rngs=nnx.Rngs(0))
    task = {"steps": (1, 2), "digits": 2}
    config = RegimeConfig(n_prompts=6, samples=2, ks=(1, 2), batch_size=8)
    sets = reasoning.held_out_levels(task, 6, seed=0, exclude=set())
    answers = {p: c for ds in sets.values() for p, c in zip(ds["prompt"], ds["completion"],
                                                            strict=True)}

    def oracle(model, tok, prompts, *, max_new_tokens, width, batch, temperature=0.0, seed=0):
        assert width + max_new_tokens <= model.config.max_len
        return [answers[p] if int(p.split("+")[0].split("-")[0]) % 2 == 0 else "1+1=3\nA: 3"
                for p in prompts]

    monkeypatch.setattr("lab.infer.complete", oracle)
    block = reasoning.measure_regime(model, task, set(), 128, config, tokenizer=ByteTokenizer())
    assert [(r["steps"], r["digits"]) for r in block["levels"]] == [(1, 2), (2, 2)]
    for r, ds in zip(block["levels"], sets.values(), strict=True):
        even = np.mean([o[0] % 2 == 0 for o in ds["operands"]])
        assert r["accuracy"] == r["chain_correct"] == r["pass@1"] == pytest.approx(even)
        assert r["exact_match"] == 0.0 and r["n"] == 6
    assert list(block["by_difficulty"]) == ["2", "4"]
    assert block["config"] == config.to_dict()
    assert set(block["checks"]) == {"falls_with_difficulty", "easiest", "hardest", "diverse",
                                    "ok"}


@pytest.mark.deep
def test_a_spec_with_a_regime_stores_it_after_training(tmp_path):
    spec = zoo.ZooSpec(
        name="cot-test", model=byte_lm(32, 1, 2, 1, 64, 128),
        train=train_recipe(4, 3e-3, checkpoint_every=0, eval_every=0),
        data={"tasks": {"arithmetic": {"steps": (1, 2), "digits": 2}}, "n_train": 200,
              "n_eval": 8, "seed": 0}, seq_len=128, batch_size=4,
        regime={"n_prompts": 4, "samples": 2, "ks": [1, 2], "batch_size": 8})
    assert spec.digest() == spec.replace(regime=None).digest()   # it changes no weight
    assert "regime" not in spec.replace(regime=None).to_dict()   # other specs' spec.json stay
    again = zoo.ZooSpec.from_dict(spec.to_dict())  # spec.json's round trip keeps the regime
    assert again.regime == spec.regime and again.to_dict() == spec.to_dict()
    from lab.zoo.train import train_model

    _, m = train_model(spec, None, progress=False)
    block = m["regime"]
    assert [(r["steps"], r["digits"], r["n"]) for r in block["levels"]] == [(1, 2, 4), (2, 2, 4)]
    for r in block["levels"]:  # greedy reproducing the chain == teacher-forced exact match
        assert r["chain_correct"] <= r["accuracy"] and len(r["sampled_correct"]) == 4
    assert m["seconds"]["regime"] > 0.0 and block["config"]["samples"] == 2
    with pytest.raises(ValueError, match="'nope'"):
        spec.replace(regime={"nope": 1})
    with pytest.raises(ValueError, match="has no 'arithmetic'"):
        spec.replace(data={**spec.data, "tasks": {"copy": {}}})


def test_the_cot_family_is_named_with_growing_sizes_and_a_regime():
    specs = [zoo.get_spec(n) for n in COT]
    params = [s.model.num_params() for s in specs]
    assert params == sorted(params) and len(set(params)) == 3
    for s in specs:
        assert s.regime == {} and list(s.data["tasks"]) == ["arithmetic"]
        assert s.seq_len <= 128 and s.model.max_len <= 128
        # The curriculum: a first stage with one- and two-digit operands, then two digits.
        base = s.base()
        assert base.name == f"{s.name}-digits" and base.regime is None
        assert base.model == s.model and base.init == ""
        assert base.data["tasks"]["arithmetic"]["digits"] == (1, 2)
        assert s.data["tasks"]["arithmetic"]["digits"] == 2


# The measured misses (docs/zoo.md): cot-m's hardest level is 0.61, over the 0.6 bound. The
# regime record must report exactly these; a retrained model that meets its regime, or one
# that breaks another check, fails here until this table says so.
KNOWN_MISSES = {"cot-m": {"hardest"}}


@pytest.mark.slow
@pytest.mark.parametrize("name", COT)
def test_cot_models_are_in_the_regime_but_for_the_recorded_misses(name):
    """Each cot model (shipped, else cached, else trained: minutes on two cores) meets every
    regime bound held out, except the misses recorded above, which its regime reports."""
    block = zoo.regime(name)
    summary = {d: round(v["accuracy"], 3) for d, v in block["by_difficulty"].items()}
    failed = {k for k, v in block["checks"].items() if k != "ok" and not v}
    assert failed == KNOWN_MISSES.get(name, set()), f"{name}: {block['checks']} {summary}"
    assert block["checks"]["ok"] == (not failed)


@pytest.mark.slow
def test_larger_cot_models_are_more_accurate_at_every_level():
    out = family_checks([(name, zoo.regime(name)["by_difficulty"]) for name in COT])
    assert out["ordered"], out["violations"]


def test_shipped_cot_entries_hold_the_regime_of_the_shipped_weights():
    """lab.zoo.ship re-measures a reasoning model's regime on the rounded weights it ships
    and keeps the float32 model's beside it; the two agree within a few prompts a level."""
    for name in COT:
        m = zoo.metrics(zoo.get_spec(name))
        shipped, f32 = m["regime"], m["shipped"]["regime_float32"]
        assert shipped["config"] == f32["config"]
        for d, v in shipped["by_difficulty"].items():
            assert abs(v["accuracy"] - f32["by_difficulty"][d]["accuracy"]) <= 0.03, (name, d)
