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
            "simulated annealing", "gradient editing", "RL fine-tuned AR",
            "tree search (diffusion)"} <= names
    gpa_calls = results["samplers"][0]["oracle_calls"]
    c = get_config("test")
    for row in results["samplers"][1:]:
        if row["sampler"] != "prior (AR, no search)":  # equal budgets, within one population
            assert abs(row["oracle_calls"] - gpa_calls) <= 2 * c.gpa.num_particles
    assert len(results["regime"]) == 3 and len(results["scaling"]) == 2
    on_disk = json.loads((tmp_path / "results.json").read_text())
    # each claim's verdict is its rule on the samplers' stored numbers
    by = {r["sampler"]: r for r in on_disk["samplers"]}
    g, prior, bon = by["GPA (AR, MH)"], by["prior (AR, no search)"], by["best-of-N (AR)"]
    activity, best_of_n, natural, audit = on_disk["claims"][:4]
    assert activity["measured"] == {"gpa": g["true_activity_a"],
                                    "prior": prior["true_activity_a"]}
    assert activity["holds"] == (g["true_activity_a"] > prior["true_activity_a"] + 0.5)
    assert best_of_n["holds"] == (g["objective_mean"] > bon["objective_mean"])
    others = min(by["gradient editing"]["heldout_kmer_js"],
                 by["simulated annealing"]["heldout_kmer_js"])
    assert natural["holds"] == (g["heldout_kmer_js"] < others)
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


SAMPLERS = ["prior (AR, no search)", "best-of-N (AR)", "gradient editing", "simulated annealing",
            "RL fine-tuned AR", "tree search (diffusion)"]


def _rows(gpa=None, **others):
    """Per-sampler rows where GPA wins every claim, with ``gpa`` / ``others[name]`` fields
    overridden."""
    base = {"true_activity_a": 0.2, "objective_mean": 1.0, "kmer_js": 0.05,
            "heldout_kmer_js": 0.05, "audit_activity_a": 0.2, "true_specificity": 1.0,
            "max_homopolymer": 6.0, "max_homopolymer_se": 0.1, "diversity": 0.7,
            "oracle_calls": 1000}
    rl = {"RL fine-tuned AR": {"objective_mean": 1.2}}  # a non-trivial RL baseline
    rows = [{"sampler": n, **base, **rl.get(n, {}), **others.get(n, {})} for n in SAMPLERS]
    win = {"true_activity_a": 3.0, "objective_mean": 2.0, "kmer_js": 0.01,
           "heldout_kmer_js": 0.01, "audit_activity_a": 3.0, "true_specificity": 2.0,
           "max_homopolymer": 4.0, "max_homopolymer_se": 0.1, "diversity": 0.6,
           "oracle_calls": 1000}
    return [{"sampler": "GPA (AR, MH)", **win, **(gpa or {})}, *rows]


def _scaling(t_big=1.0, obj_big=2.0, act_big=3.0):
    small = {"particles": 256, "seconds_per_particle_step": 1.0, "objective_mean": 2.0,
             "true_activity_a": 3.0}
    return [small, {"particles": 4096, "seconds_per_particle_step": t_big,
                    "objective_mean": obj_big, "true_activity_a": act_big}]


def test_claim_rules_hold_and_fail_on_fabricated_results():
    from experiments.gpa import claim_rules

    spec = [{"sampler": "GPA (AR, MH)", "true_specificity": 5.0}]
    n = len(claim_rules(_rows(), _scaling(), spec))
    assert n == 10 and len(claim_rules(_rows(), _scaling())) == 9
    assert [c["holds"] for c in claim_rules(_rows(), _scaling(), spec)] == [True] * n
    rl, tree = "RL fine-tuned AR", "tree search (diffusion)"
    # each rule fails on its own counter-example, and only that rule
    fails = [
        (_rows({"true_activity_a": 0.6, "audit_activity_a": 3.0}), _scaling()),  # +0.4 < +0.5
        (_rows({"objective_mean": 0.9}), _scaling()),                 # below best-of-N
        (_rows(None, **{"gradient editing": {"heldout_kmer_js": 0.005}}), _scaling()),
        (_rows({"audit_activity_a": 0.6}, **{rl: {"audit_activity_a": 0.1}}), _scaling()),
        (_rows(None, **{rl: {"audit_activity_a": 3.5}}), _scaling()),  # RL's audit gain larger
        (_rows({"max_homopolymer": 5.8}), _scaling()),                # 0.2 < 2 SE (0.28)
        (_rows(None, **{tree: {"true_activity_a": 3.1}}), _scaling()),  # tree search wins
        (_rows({"diversity": 0.5}), _scaling()),                      # 0.5 < 0.8 x 0.7
        (_rows(), _scaling(t_big=2.5)),                               # time grows 2.5x
        (_rows(), _scaling(obj_big=1.9)),                             # quality falls 0.1
    ]
    expected_failing = [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]
    for (rows, scaling), bad in zip(fails, expected_failing, strict=True):
        holds = [c["holds"] for c in claim_rules(rows, scaling, spec)]
        assert holds == [j != bad for j in range(n)], (bad, holds)
    assert claim_rules(_rows(), _scaling(act_big=2.9), spec)[8]["holds"] is False
    low = [{"sampler": "GPA (AR, MH)", "true_specificity": 1.5}]   # below the activity run's 2.0
    assert claim_rules(_rows(), _scaling(), low)[9]["holds"] is False


def test_regime_rules_hold_and_fail_on_fabricated_results():
    from experiments.gpa import regime_checks

    good = {"natural": 0.8, "enriched": 0.7}
    assert [c["holds"] for c in regime_checks(_rows(), good)] == [True] * 3
    prior = "prior (AR, no search)"
    near_top = _rows(None, **{prior: {"true_activity_a": 2.3}})     # prior above 0.5 x 4.5
    assert [c["holds"] for c in regime_checks(near_top, good)] == [False, True, True]
    weak = {"natural": 0.8, "enriched": 0.4}                         # oracle off on designs
    assert [c["holds"] for c in regime_checks(_rows(), weak)] == [True, False, True]
    flat_rl = _rows(None, **{"RL fine-tuned AR": {"objective_mean": 1.05}})  # +0.05 < +0.1
    assert [c["holds"] for c in regime_checks(flat_rl, good)] == [True, True, False]


@pytest.mark.deep
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
