"""The TCR experiment end to end at the ``test`` preset, and its claim and regime rules on
fabricated results (each rule seen holding and failing)."""

import copy
import json
import os

import pytest

from configs.tcr import get_config
from experiments import tcr

TYPES = ("cause", "effect", "order", "intervention", "counterfactual")


def test_tcr_runs_end_to_end_at_the_test_preset(tmp_path):
    config = get_config("test")
    results = tcr.run(config, str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "tcr.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 4
    assert results["regime"] == tcr.regime_checks(results) and len(results["regime"]) == 3
    assert set(results["table"]) == set(tcr.MODELS)
    for name, per in results["table"].items():
        assert {*TYPES, "all", "deep"} <= set(per), name
        assert all(0.0 <= per[q]["score"] <= 1.0 for q in per), name
    # the agent is exact where it parses, and "unparsed" only on paraphrased stories
    assert results["agent_parsed"]["all"]["score"] == 1.0
    assert 0.5 <= results["agent_parsed"]["coverage"] < 1.0
    report = (tmp_path / "report.md").read_text()
    assert "| former |" in report and "| best shortcut |" in report
    assert [r["entry"] for r in tcr.main_table(results)][-2:] == ["best shortcut", "chance"]


def _s(score, se=0.01):
    return {"score": score, "se": se, "n": 100}


def _fabricated(former=0.8, plain=0.5, cot=0.55, former_deep=0.8, cot_deep=0.5,
                agent=0.8, agent_deep_parsed=1.0, coverage=0.8, plain_order=0.6,
                shortcut=0.27):
    """Results where every claim and regime check holds at the defaults."""
    def per(all_, deep, order=None):
        out = {q: _s(all_) for q in TYPES}
        if order is not None:
            out["order"] = _s(order)
        out.update(all=_s(all_), deep=_s(deep))
        return out

    table = {"agent": per(agent, agent), "former": per(former, former_deep),
             "plain": per(plain, plain, order=plain_order), "cot": per(cot, cot_deep)}
    table["plain"].update({q: _s(0.25) for q in ("cause", "effect", "counterfactual")})
    table["plain"]["intervention"] = _s(0.5)
    parsed = {q: _s(agent_deep_parsed if q in tcr.DEEP else 1.0) for q in TYPES}
    chance = {q: (0.5 if q == "intervention" else 0.25) for q in TYPES}
    shortcuts = {q: {**{s: chance[q] for s in tcr.SHORTCUTS}, "chance": chance[q]}
                 for q in TYPES}
    shortcuts["all"] = {**{s: 0.3 for s in tcr.SHORTCUTS}, "chance": 0.3}
    shortcuts["cause"]["most_linked"] = shortcut
    return {"table": table, "agent_parsed": {"coverage": coverage, **parsed},
            "shortcuts": shortcuts}


def _holds(entries):
    return [e["holds"] for e in entries]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    assert _holds(tcr.claims(_fabricated())) == [True, True, True, True]
    assert _holds(tcr.claims(_fabricated(former=0.51))) == [False, True, True, True]
    noisy = _fabricated(former=0.56)
    noisy["table"]["former"]["all"]["se"] = 0.05          # a gain within 2 SE is no gain
    assert _holds(tcr.claims(noisy))[0] is False
    assert _holds(tcr.claims(_fabricated(agent_deep_parsed=0.97)))[1] is False
    assert _holds(tcr.claims(_fabricated(coverage=0.3)))[1] is False
    assert _holds(tcr.claims(_fabricated(cot_deep=0.79))) == [True, True, False, True]
    assert _holds(tcr.claims(_fabricated(agent=0.4))) == [True, True, True, False]


def test_regime_rules_hold_and_fail_on_fabricated_results():
    assert _holds(tcr.regime_checks(_fabricated())) == [True, True, True]
    flat = _fabricated(plain_order=0.26)                  # plain at chance on every type
    assert _holds(tcr.regime_checks(flat)) == [False, True, True]
    solved = copy.deepcopy(_fabricated(plain_order=0.99))
    assert _holds(tcr.regime_checks(solved))[0] is False  # at ceiling: no room
    assert _holds(tcr.regime_checks(_fabricated(coverage=0.4))) == [True, False, True]
    assert _holds(tcr.regime_checks(_fabricated(shortcut=0.45))) == [True, True, False]


def test_bad_config_names_the_key():
    c = get_config("test")
    c.first.question_types = ("why",)
    with pytest.raises(ValueError, match="first.question_types"):
        tcr.check_config(c)
    c = get_config("test")
    c.model.length = 4
    with pytest.raises(ValueError, match="model.length"):
        tcr.check_config(c)
    c = get_config("test")
    c.first.steps = -1
    with pytest.raises(ValueError, match="first.steps"):
        tcr.check_config(c)


def test_the_default_models_ship_with_lab():
    """The main job loads the three trained Transformers from lab/zoo/assets instead of
    training them (about 33 minutes on two cores); a recipe change without re-shipping
    fails here."""
    from lab import zoo

    got = tcr.load_models(get_config("default"), source="shipped")
    assert got.source == "shipped" and zoo.loads()[-1]["source"] == "shipped"
    assert set(got.modules) == set(tcr.NEURAL) and got.modules["former"].former


def test_the_models_key_follows_the_story_generator(monkeypatch):
    """A generator that tells other stories under the same settings changes the bundle key,
    so models trained on the old stories are not loaded for the new ones."""
    from lab.zoo import bundle

    c = get_config("test")
    before = bundle.key("tcr-models", tcr._recipe(c))
    real = tcr.generate

    def changed(*args, **kwargs):
        ds = real(*args, **kwargs)
        return ds.map(lambda r: {"prompt": r["prompt"].replace(" .", " . ", 1)})

    monkeypatch.setattr(tcr, "generate", changed)
    assert bundle.key("tcr-models", tcr._recipe(c)) != before
