"""The GLR experiment: claim and regime rules on fabricated results (each seen holding and
failing), the regime of the shipped model pinned, and the launcher end to end at
``test``."""

import json
import os

import numpy as np
import pytest

from configs.glr import get_config
from experiments import glr as exp


def _row(acc, latent, total, excess=0.0, se=0.02, excess_se=0.3, out=None):
    return {"accuracy": acc, "se": se, "latent": latent, "total_steps": total,
            "output_len": total - latent - 1 if out is None else out, "excess": excess,
            "excess_se": excess_se}


def _table(glr_acc=0.6, coconut_acc=0.4, no_cot=0.05, cot=0.62, glr_total=10.0,
           excess=-3.0):
    """A fabricated table over budgets 0..3 where every claim holds at the defaults."""
    return {
        "cot": [_row(cot, 0, 30.0)],
        "no_cot": [_row(no_cot, 0, 7.0)],
        "glr": [_row(cot, 0, 30.0, 0.0)] + [_row(glr_acc, k, glr_total + 5 * (3 - k), excess)
                                             for k in (1, 2, 3)],
        "coconut": [_row(cot, 0, 30.0, 0.0)] + [_row(coconut_acc, k, 12.0 + 5 * (3 - k))
                                                 for k in (1, 2, 3)],
    }


def _holds(table):
    return [c["holds"] for c in exp.claims(table)]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    assert _holds(_table()) == [True, True, True, True]
    # 1: fewer total steps but a large accuracy drop; or no fewer steps
    assert _holds(_table(glr_acc=0.5))[0] is False
    assert _holds(_table(glr_total=25.0))[0] is False
    # 2: all-latent GLR no better than answering directly
    assert _holds(_table(no_cot=0.58))[1] is False
    # 3: GLR level with Coconut, or within noise
    assert _holds(_table(coconut_acc=0.6))[2] is False
    assert _holds(_table(coconut_acc=0.56))[2] is False
    # 4: outputs as long as the continuation the budget leaves (no emergent shortening)
    assert _holds(_table(excess=0.0))[3] is False
    assert _holds(_table(excess=-0.5))[3] is False


def test_regime_rules_hold_and_fail_on_fabricated_results():
    short = {name: {"accuracy": 0.01, "se": 0.01} for name in exp.SHORTCUTS}
    assert [r["holds"] for r in exp.regime_checks(_table(), short)] == [True, True, True]
    assert exp.regime_checks(_table(no_cot=0.5), short)[0]["holds"] is False
    assert exp.regime_checks(_table(cot=0.99, no_cot=0.1), short)[1]["holds"] is False
    assert exp.regime_checks(_table(cot=0.1, no_cot=0.0), short)[1]["holds"] is False
    short["unsigned_sum"] = {"accuracy": 0.3, "se": 0.02}
    assert exp.regime_checks(_table(), short)[2]["holds"] is False


def test_the_shipped_model_is_in_the_regime_at_the_default_level():
    """cot-xs's explicit chains solve three-step two-digit problems often but not always,
    and the same model asked to answer right after the prompt (no chain) almost never."""
    from lab import zoo
    from lab.methods import glr

    config = get_config("default")
    config.n_eval = 64
    model, tok = zoo.load(config.model, progress=False)
    _, ev = exp.problems(config)
    head = glr.TransitionHead(model.config.d_model, rngs=__import__("flax").nnx.Rngs(0))
    row = exp.evaluate(model, head, tok, ev, budget=0, max_budget=0, mode="coconut",
                       batch=64, max_new=48)
    assert 0.3 <= row["accuracy"] <= 0.9, row
    # answering without a chain: force the empty chain line and read the answer
    forced = ev.map(lambda r: {"prompt": r["prompt"] + "\nA: "})
    ids = np.array([tok.encode(p, add_bos=True) for p in forced["prompt"]], np.int32)
    out = glr.latent_generate(model, head, ids, np.full(len(ids), ids.shape[1]),
                              latent_steps=0, mode="coconut", max_new_tokens=6,
                              eos_id=tok.eos_id, pad_id=tok.pad_id)
    answers = [tok.decode(r).split("\n")[0].strip() for r in np.asarray(out.tokens)]
    direct = np.mean([a == t for a, t in zip(answers, ev["answer"], strict=True)])
    assert direct < 0.1 and row["accuracy"] - direct >= exp.COT_GAP, (direct, row)


@pytest.mark.slow
def test_glr_runs_end_to_end_at_the_test_preset(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "glr.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 4
    assert results["claims"] == exp.claims(results["table"])
    assert results["regime"] == exp.regime_checks(results["table"], results["shortcuts"])
    n = get_config("test").steps
    for method in ("glr", "coconut"):
        assert [r["latent"] for r in results["table"][method]] == list(range(n + 1))
        for r in results["table"][method]:
            assert 0 <= r["accuracy"] <= 1
            assert r["total_steps"] >= r["latent"] + 1
    assert set(results["shortcuts"]) == set(exp.SHORTCUTS)
    report = (tmp_path / "report.md").read_text()
    assert "| glr | 1 |" in report and "| no_cot | 0 |" in report
