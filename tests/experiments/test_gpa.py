"""GPA launcher end to end at the test preset, and config errors before any work."""

import json
import os

import pytest

from configs.gpa import get_config
from experiments import gpa


def test_gpa_test_preset_writes_every_sampler(tmp_path):
    results = gpa.run(get_config("test"), str(tmp_path))
    names = {r["sampler"] for r in results["samplers"]}
    assert {"GPA (AR, MH)", "GPA (diffusion, MH)", "best-of-N (AR)", "reward-weighted resampling",
            "simulated annealing", "gradient editing", "RL fine-tuned AR"} <= names
    gpa_calls = results["samplers"][0]["oracle_calls"]
    for row in results["samplers"][1:]:
        if row["sampler"] != "prior (AR, no search)":  # equal budgets, within one population
            assert abs(row["oracle_calls"] - gpa_calls) <= 2 * get_config("test").gpa.num_particles
    on_disk = json.loads((tmp_path / "results.json").read_text())
    # each claim's verdict is its rule on the samplers' stored numbers
    by = {r["sampler"]: r for r in on_disk["samplers"]}
    g, prior, bon = by["GPA (AR, MH)"], by["prior (AR, no search)"], by["best-of-N (AR)"]
    activity, best_of_n, natural, audit = on_disk["claims"][:4]
    assert activity["measured"] == {"gpa": g["true_activity_a"],
                                    "prior": prior["true_activity_a"]}
    assert activity["holds"] == (g["true_activity_a"] > prior["true_activity_a"] + 0.5)
    assert best_of_n["holds"] == (g["objective_mean"] > bon["objective_mean"])
    others = min(by["gradient editing"]["kmer_js"], by["simulated annealing"]["kmer_js"])
    assert natural["holds"] == (g["kmer_js"] < others)
    assert audit["holds"] == (g["audit_activity_a"] > prior["audit_activity_a"] + 0.5)
    assert os.path.exists(tmp_path / "gpa.png") and (tmp_path / "report.md").exists()


def test_bad_config_fails_before_work(tmp_path):
    c = get_config("test")
    c.gpa.scheme = "roulette"
    with pytest.raises(ValueError, match="gpa.scheme='roulette'"):
        gpa.run(c, str(tmp_path))
    c = get_config("test")
    c.seq_len = 8
    with pytest.raises(ValueError, match="seq_len=8"):
        gpa.run(c, str(tmp_path))
    assert not (tmp_path / "results.json").exists()


def _rows(gpa=None, **others):
    """Per-sampler rows where GPA wins every claim, with ``gpa`` fields overridden."""
    base = {"true_activity_a": 0.2, "objective_mean": 1.0, "kmer_js": 0.05,
            "audit_activity_a": 0.2, "true_specificity": 1.0}
    names = ["prior (AR, no search)", "best-of-N (AR)", "gradient editing",
             "simulated annealing"]
    rows = [{"sampler": n, **base, **others.get(n, {})} for n in names]
    win = {"true_activity_a": 3.0, "objective_mean": 2.0, "kmer_js": 0.01,
           "audit_activity_a": 3.0, "true_specificity": 2.0}
    return [{"sampler": "GPA (AR, MH)", **win, **(gpa or {})}, *rows]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    from experiments.gpa import claim_rules

    big = [{"particles": 4096, "seconds": 10.0}]
    spec = [{"sampler": "GPA (AR, MH)", "true_specificity": 5.0}]
    assert [c["holds"] for c in claim_rules(_rows(), big, spec)] == [True] * 6
    # each rule fails on its own counter-example
    fails = [
        _rows({"true_activity_a": 0.6}),                    # +0.4 over the prior, not +0.5
        _rows({"objective_mean": 0.9}),                     # below best-of-N
        _rows(None, **{"gradient editing": {"kmer_js": 0.005}}),  # less natural than an edit
        _rows({"audit_activity_a": 0.6}),                   # the audit oracle disagrees
    ]
    for i, rows in enumerate(fails):
        holds = [c["holds"] for c in claim_rules(rows, big, spec)]
        assert holds == [j != i for j in range(6)], (i, holds)
    assert not claim_rules(_rows(), [{"particles": 1024, "seconds": 1.0}], spec)[4]["holds"]
    low = [{"sampler": "GPA (AR, MH)", "true_specificity": 1.5}]   # below the activity run's 2.0
    assert not claim_rules(_rows(), big, low)[5]["holds"]
    assert len(claim_rules(_rows(), big)) == 5


def test_default_preset_generators_and_oracles_ship_trained():
    """The default run loads its generators and oracles shipped with Lab (no training), and
    they are the trained models: the AR prior models the world's sequences better than
    uniform bases, and the oracle tracks the hidden activity."""
    import jax.numpy as jnp
    import numpy as np

    from lab.data import dna
    from lab.methods.gpa import design, generators

    c = get_config("default")
    a = design.build_assets(seed=c.seed, seq_len=c.seq_len, n_train=c.n_train,
                            generator_steps=c.generator_steps, oracle_steps=c.oracle_steps,
                            d_model=c.d_model, n_layers=c.n_layers, source="shipped")
    assert a.source == "shipped" and set(a.seconds) == {"ar_generator", "diffusion_generator",
                                                        "oracles"}
    seqs = jnp.asarray(a.train_seqs[:512])
    per_base = float(jnp.mean(generators.ar_loglik(a.ar, seqs))) / c.seq_len
    assert per_base > np.log(0.25) + 0.15, per_base
    truth = np.asarray(dna.activity(a.world, seqs))[:, 0]
    assert np.corrcoef(np.asarray(a.oracle_a.predict(seqs)), truth)[0, 1] > 0.5
