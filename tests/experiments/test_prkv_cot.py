"""experiments.prkv_cot: the run at the test preset, and its claim and regime rules on
fabricated results where each should hold and where it should not."""

import json
import os

import pytest

from configs.prkv_cot import get_config
from experiments import prkv_cot


def grid(**policies):
    """``{policy: {budget: {"accuracy": a}}}`` from ``policy=[a at 48, a at 32]``."""
    return {name: {"48": {"accuracy": a[0]}, "32": {"accuracy": a[1]}}
            for name, a in policies.items()}


def results(full=0.6, generated=60.0, **policies):
    return {"full": {"accuracy": full, "generated": generated}, "prompt_tokens": 21,
            "grid": grid(**policies)}


def verdicts(res):
    return [c["holds"] for c in prkv_cot.claim_rules(res, get_config("test"))]


def test_claims_hold_and_fail_on_fabricated_results():
    base = dict(prompt_recent=(0.6, 0.4), streaming_llm=(0.0, 0.0), snapkv=(0.3, 0.05))
    # PRKV ahead where the baselines lost a third (both budgets: best 0.3 and 0.05 < 0.4,
    # the oracle >= 0.3 at 48 and 0.4 >= 0.3 at 32).
    assert verdicts(results(**base, prkv=(0.5, 0.2))) == [True, True]
    # On par (within 0.05) but not ahead.
    assert verdicts(results(**base, prkv=(0.27, 0.05))) == [True, False]
    # Behind the best baseline by more than the tolerance.
    assert verdicts(results(**base, prkv=(0.2, 0.1))) == [False, False]
    # No budget where the choice decides (baselines near full): the second claim cannot hold.
    easy = dict(prompt_recent=(0.6, 0.6), streaming_llm=(0.5, 0.5), snapkv=(0.6, 0.55))
    assert verdicts(results(**easy, prkv=(0.6, 0.6))) == [True, False]
    # PRKV not evaluated: a claim that does not hold, saying so.
    (c,) = prkv_cot.claim_rules(results(**base), get_config("test"))
    assert not c["holds"] and c["measured"] == "prkv not evaluated"


def test_regime_rules_on_fabricated_results():
    cfg = get_config("test")                      # budgets 48, 32; compress_every 8
    ok = dict(prompt_recent=(0.6, 0.4), streaming_llm=(0.0, 0.0))

    def holds(res):
        return [c["holds"] for c in prkv_cot.regime_checks(res, cfg)]

    assert holds(results(**ok)) == [True, True, True]
    assert holds(results(full=0.95, **ok)) == [False, True, True]     # at ceiling
    assert holds(results(full=0.1, **ok)) == [False, True, True]      # cannot do the task
    assert holds(results(generated=30.0, **ok)) == [True, False, True]  # 51 <= 48 + 8
    same = dict(prompt_recent=(0.3, 0.1), streaming_llm=(0.2, 0.0))
    assert holds(results(**same)) == [True, True, False]              # the prompt never matters


def test_bad_config_names_the_key(tmp_path):
    cfg = get_config("test")
    cfg.policies = ("snapkv",)
    with pytest.raises(ValueError, match="config.policies"):
        prkv_cot.run(cfg, str(tmp_path))
    cfg = get_config("test")
    cfg.task.n_problems = 12
    with pytest.raises(ValueError, match=r"config.task.n_problems=12 .*batch_size=8"):
        prkv_cot.run(cfg, str(tmp_path))


def test_run_at_test_preset(tmp_path):
    cfg = get_config("test")
    out = prkv_cot.run(cfg, str(tmp_path))
    saved = json.load(open(os.path.join(tmp_path, "results.json")))
    assert saved["claims"] == out["claims"]
    grid = saved["grid"]
    assert set(grid) == {"prompt_recent", *cfg.policies}
    for row in grid.values():
        assert set(row) == {"48", "32"}
        for cell in row.values():
            assert 0.0 <= cell["chain_accuracy"] <= cell["accuracy"] <= 1.0
    # A budget that evicts nothing useful to the chain's end cannot beat the full cache by
    # much, and keeping 4 sinks + the most recent tokens loses the operands: near zero.
    assert grid["streaming_llm"]["32"]["accuracy"] <= 0.25
    assert os.path.exists(os.path.join(tmp_path, "prkv_cot_accuracy.png"))
