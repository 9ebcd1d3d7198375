"""The S²-Net experiment end to end at the ``test`` preset, and its claim and regime
rules on fabricated results (each rule seen holding and failing)."""

import json
import os

import pytest

from configs.s2net import get_config
from experiments import s2net


@pytest.mark.slow
def test_s2net_runs_end_to_end_on_the_binding_and_reasoning_tasks(tmp_path):
    config = get_config("test")
    config.tasks = "binding,reasoning"
    config.binding.update(train_steps=1, steps=16, eval_batch=4)
    config.reasoning.update(train_steps=1, steps=8, eval_batch=8)
    results = s2net.run(config, str(tmp_path))
    for name in ("config.json", "results.json", "report.md", "s2net.png"):
        assert os.path.exists(tmp_path / name), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 4
    assert results["claims"] == s2net._claims(results["table"], results["baselines"])
    assert results["regime"] == s2net.regime_checks(results["table"], results["baselines"])
    assert len(results["regime"]) == 6
    assert set(results["table"]) == {"binding", "reasoning"}
    for task in ("binding", "reasoning"):
        for kind in s2net.models_for(task):
            entry = results["table"][task][kind]
            assert -1.0 <= entry["score"] <= 1.0 and entry["pj"] > 0, (task, kind, entry)
            assert (entry["spikes"] > 0) == (kind in ("s2net", "snn")), (task, kind)
            # every model trained from each of the preset's seeds; the score is their mean
            assert len(entry["seed_scores"]) == len(config.seeds) == 2
            assert entry["score"] == pytest.approx(sum(entry["seed_scores"]) / 2)
    assert set(results["baselines"]["binding"]) == {*s2net.SHORTCUTS, "oracle", "oracle_window"}
    assert set(results["baselines"]["reasoning"]) == {"chance", "no_context", "oracle"}
    report = (tmp_path / "report.md").read_text()
    assert "| binding | s2net | ARI |" in report and "| reasoning | no_context |" in report


@pytest.mark.deep
def test_s2net_runs_end_to_end_on_the_sequence_tasks(tmp_path):
    config = get_config("test")
    config.tasks = "decoding,signal"
    results = s2net.run(config, str(tmp_path))
    assert [c["claim"][:40] for c in results["claims"]] == [
        c["claim"][:40] for c in s2net._claims(results["table"], {})]
    assert len(results["claims"]) == 3 and results["regime"] == []
    assert results["table"]["decoding"]["s2net"]["spikes"] > 0


def test_a_models_entry_is_the_mean_over_seeds_with_the_spread_between_them_as_its_se():
    per_seed = [{"score": s, "se": 0.01, "pj": p, "spikes": 2.0, "seconds": 3.0}
                for s, p in ((0.7, 10.0), (0.1, 20.0), (0.7, 30.0))]
    entry = s2net.over_seeds(per_seed)
    assert entry["score"] == pytest.approx(0.5) and entry["pj"] == pytest.approx(20.0)
    # std(ddof=1) of (0.7, 0.1, 0.7) over sqrt(3): 0.2, twenty times the samples' SE
    assert entry["se"] == pytest.approx(0.2) and entry["eval_se"] == pytest.approx(0.01)
    assert entry["seed_scores"] == [0.7, 0.1, 0.7] and entry["seconds"] == 9.0
    # one seed: the evaluation samples' SE is all there is
    assert s2net.over_seeds(per_seed[:1])["se"] == 0.01


def _entry(score, se=0.01, pj=10.0):
    return {"score": score, "se": se, "pj": pj}


def _fabricated(bind_s2net=0.85, bind_snn=0.6, bind_ann=0.5, cnn=0.05, reason_s2net=0.85,
                reason_ann=0.85, reason_snn=0.7, seq_s2net=0.7, seq_pj=5.0, oracle=0.99,
                orientation=0.1, no_context=0.5, reason_oracle=0.95):
    """A full table and baselines; every claim and regime check holds at the defaults."""
    table = {
        "binding": {"s2net": _entry(bind_s2net), "snn": _entry(bind_snn),
                    "oscillators": _entry(0.1), "ann": _entry(bind_ann), "cnn": _entry(cnn)},
        "reasoning": {"s2net": _entry(reason_s2net), "snn": _entry(reason_snn),
                      "oscillators": _entry(0.5), "ann": _entry(reason_ann)},
    }
    for task in ("decoding", "signal"):
        table[task] = {k: _entry(0.7) for k in s2net.MODELS}
        table[task]["s2net"] = _entry(seq_s2net, pj=seq_pj)
    base = {"binding": {k: _entry(0.0) for k in s2net.SHORTCUTS},
            "reasoning": {"chance": _entry(0.5, 0.0), "no_context": _entry(no_context, 0.02),
                          "oracle": _entry(reason_oracle)}}
    base["binding"]["orientation"] = _entry(orientation)
    base["binding"]["oracle"] = _entry(oracle)
    base["binding"]["oracle_window"] = _entry(0.7)
    return table, base


def _holds(entries):
    return [e["holds"] for e in entries]


def test_claim_rules_on_fabricated_results():
    held = s2net._claims(*_fabricated())
    assert _holds(held) == [True] * 6
    assert held[1]["measured"]["gain"] == pytest.approx(0.25)
    assert held[0]["measured"]["best_shortcut"] == "orientation"
    assert held[3]["measured"] == pytest.approx({"energy_ratio": 0.5, "acc_s2net": 0.7,
                                                 "acc_ann": 0.7})
    # binding: S²-Net under 0.8 (claim 1 fails; claim 2 still holds, 0.25 over the SNN)
    assert _holds(s2net._claims(*_fabricated(bind_s2net=0.79, bind_snn=0.54)))[:2] == [
        False, True]
    # ... 0.85 but within 0.1 of the ANN: claim 1 fails; claim 2 holds (not below the ANN)
    assert _holds(s2net._claims(*_fabricated(bind_ann=0.78)))[:2] == [False, True]
    # ... 0.85 but the best shortcut (here the trained CNN) within 0.1: claim 1 fails
    fails = s2net._claims(*_fabricated(cnn=0.8))
    assert _holds(fails)[:2] == [False, True] and fails[0]["measured"]["best_shortcut"] == "cnn"
    # ... a gap of 0.1 over the ANN that is inside 2 SE fails too
    table, base = _fabricated(bind_ann=0.74)
    table["binding"]["s2net"]["se"] = table["binding"]["ann"]["se"] = 0.05
    assert _holds(s2net._claims(table, base))[0] is False
    # synchronisation gain under 0.1: claim 2 fails (claim 1 holds)
    assert _holds(s2net._claims(*_fabricated(bind_snn=0.78)))[:2] == [True, False]
    # S²-Net more than 2 SE below the ANN: claim 2 fails (and claim 1)
    assert _holds(s2net._claims(*_fabricated(bind_ann=0.9, bind_snn=0.5)))[:2] == [False, False]
    # reasoning: S²-Net within 0.2 of the no-context readout, or 6 points under the ANN
    assert _holds(s2net._claims(*_fabricated(no_context=0.66)))[2] is False
    assert _holds(s2net._claims(*_fabricated(reason_ann=0.91)))[2] is False
    assert _holds(s2net._claims(*_fabricated(reason_ann=0.89)))[2] is True
    # energy: costly S²-Net fails both energy claims; 6 points under the ANN fails them too
    assert _holds(s2net._claims(*_fabricated(seq_pj=20.0)))[3:5] == [False, False]
    low = s2net._claims(*_fabricated(seq_s2net=0.64))
    assert _holds(low)[3:] == [False, False, False]
    assert low[5]["measured"] == pytest.approx(-0.06)
    # parts: 1.5 points under the better part still holds, 3 points does not
    assert _holds(s2net._claims(*_fabricated(reason_s2net=0.685, reason_ann=0.7)))[5] is True
    assert _holds(s2net._claims(*_fabricated(bind_s2net=0.57)))[5] is False


def test_claims_of_left_out_tasks_are_left_out():
    table, base = _fabricated()
    only = {"decoding": table["decoding"], "signal": table["signal"]}
    assert len(s2net._claims(only, {})) == 3 and s2net.regime_checks(only, {}) == []


def test_regime_rules_on_fabricated_results():
    assert _holds(s2net.regime_checks(*_fabricated())) == [True] * 6
    # oracle too weak; a shortcut (fixed rule or trained CNN) at 0.2; SNN or ANN at ceiling
    assert _holds(s2net.regime_checks(*_fabricated(oracle=0.85)))[0] is False
    assert _holds(s2net.regime_checks(*_fabricated(orientation=0.2)))[1] is False
    assert _holds(s2net.regime_checks(*_fabricated(cnn=0.25)))[1] is False
    assert _holds(s2net.regime_checks(*_fabricated(bind_snn=0.9)))[2] is False
    assert _holds(s2net.regime_checks(*_fabricated(bind_ann=0.95)))[2] is False
    # reasoning: oracle too weak; rates answer the query; the ANN or the SNN at ceiling
    assert _holds(s2net.regime_checks(*_fabricated(reason_oracle=0.85)))[3] is False
    assert _holds(s2net.regime_checks(*_fabricated(no_context=0.62)))[4] is False
    assert _holds(s2net.regime_checks(*_fabricated(no_context=0.59)))[4] is True
    assert _holds(s2net.regime_checks(*_fabricated(reason_ann=0.98)))[5] is False
    assert _holds(s2net.regime_checks(*_fabricated(reason_snn=0.97)))[5] is False
    # each failure leaves the other checks holding
    assert _holds(s2net.regime_checks(*_fabricated(cnn=0.25))) == [True, False] + [True] * 4


def test_bad_config_fails_before_any_work(tmp_path):
    config = get_config("test")
    config.unlock()
    config.model.n_neuron = 3
    with pytest.raises(ValueError, match="unknown config keys.*model.n_neuron"):
        s2net.run(config, str(tmp_path))
    config = get_config("test")
    config.impl = "cuda"
    with pytest.raises(ValueError, match="config.impl='cuda' is invalid"):
        s2net.run(config, str(tmp_path))
    config = get_config("test")
    config.tasks = "binding,vision"
    with pytest.raises(ValueError, match="config.tasks='binding,vision' is invalid"):
        s2net.run(config, str(tmp_path))
    config = get_config("test")
    config.seeds = ()
    with pytest.raises(ValueError,
                       match=r"config.seeds=\(\) is invalid.*non-empty tuple of int seeds"):
        s2net.run(config, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_main_table_lists_every_model_and_baseline_per_task():
    table, base = _fabricated()
    rows = s2net.main_table({"table": table, "baselines": base})
    want = sum(len(m) for m in table.values()) + sum(len(b) for b in base.values())
    assert len(rows) == want
    row = next(r for r in rows if r["task"] == "binding" and r["entry"] == "orientation")
    assert row["kind"] == "baseline" and row["score"] == base["binding"]["orientation"]["score"]
