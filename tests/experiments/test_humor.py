"""The HUMOR experiment end to end at the ``test`` preset; its claim and regime rules on
fabricated results (each seen holding and failing); bad config."""

import json
import os

import pytest

from configs.humor import get_config
from experiments import humor as exp


def test_humor_runs_end_to_end_at_the_test_preset(tmp_path):
    results = exp.run(get_config("test"), str(tmp_path / "out"))
    for name in ("config.json", "results.json", "report.md", "humor.png"):
        assert os.path.exists(tmp_path / "out" / name), name
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert on_disk["claims"] == results["claims"] and len(results["claims"]) == 3
    assert len(results["regime"]) == 5
    assert set(results["arms"]) == {"sft_multi", "sft_single", "rl_multi"}
    assert set(results["baselines"]) == {"random_caption", "blind_caption"}
    assert set(results["rm"]["shortcuts"]) == {"length", "most_frequent", "caption_only"}
    c = get_config("test")
    assert len(results["rm"]["accuracy"]) == len(c.noise_levels) * len(c.seeds) * 2
    assert [r["label noise"] for r in exp.rm_table(results)] == list(c.noise_levels)
    assert len(results["rl_history"]) == c.rl.steps
    sft = results["sft_policies"]                  # the test preset's own bundle, not shipped
    assert sft["source"] in ("trained", "cached") and sft["key"].startswith("humor-sft-")
    assert set(sft["train_seconds"]) == {"multi", "single"}
    assert [r["policy"] for r in exp.main_table(results)] == [   # results.md's table
        "sft_multi", "sft_single", "rl_multi", "random_caption", "blind_caption"]


def _fab(pw=(0.95, 0.9, 0.8), pt=(0.93, 0.85, 0.7), seeds_spread=0.01, rl=0.7, sft=0.55,
         div_multi=0.6, div_single=0.2, perception=0.85, blind=0.25, shortcut=0.52, n=200,
         malformed=(0.1, 0.05)):
    noise = [0.0, 0.2, 0.35]
    acc = {}
    for k, (a, b) in enumerate(zip(pw, pt, strict=True)):
        for j, s in enumerate((0, 1)):
            d = seeds_spread * (1 if j else -1)
            acc[f"{noise[k]:g}/{s}/pairwise"] = a + d
            acc[f"{noise[k]:g}/{s}/pointwise"] = b + d
    temps = [f"t{i}" for i in range(16)]

    def arm(v, k):  # per-group values +-0.3 around the mean, in an arm-specific pattern
        return {"agreement": v,
                "per_group": [v + (0.3 if (i // k) % 2 else -0.3) for i in range(n)]}

    def div(v, k, bad):
        return {"anchored_fraction": v, "malformed": bad,
                "per_template_anchored": {t: v + (0.05 if (i // k) % 2 else -0.05)
                                          for i, t in enumerate(temps)}}
    return {"rm": {"accuracy": acc, "shortcuts": {"length": 0.5, "most_frequent": shortcut,
                                                  "caption_only": 0.49}},
            "noise_levels": noise, "seeds": [0, 1],
            "arms": {"sft_multi": arm(sft, 1), "rl_multi": arm(rl, 2),
                     "sft_single": arm(0.5, 1)},
            "diversity": {"multi": div(div_multi, 1, malformed[0]),
                          "single": div(div_single, 2, malformed[1]), "temperature": 1.0},
            "perception": {"mean": perception}, "blind_perception": {"mean": blind}}


def _holds(rules):
    return [r["holds"] for r in rules]


def test_claims_hold_on_a_case_built_for_them_and_fail_one_by_one():
    assert _holds(exp.claim_rules(_fab())) == [True] * 3
    assert not exp.claim_rules(_fab(pt=(0.93, 0.9, 0.7)))[0]["holds"]     # tie at 0.2
    assert not exp.claim_rules(_fab(seeds_spread=0.08))[0]["holds"]      # within spread
    assert not exp.claim_rules(_fab(rl=0.55))[1]["holds"]
    assert not exp.claim_rules(_fab(rl=0.57, n=20))[1]["holds"]           # too few groups
    assert not exp.claim_rules(_fab(div_multi=0.2))[2]["holds"]
    assert not exp.claim_rules(_fab(div_multi=0.1))[2]["holds"]


def test_regime_holds_in_range_and_fails_outside():
    assert _holds(exp.regime_rules(_fab())) == [True] * 5
    assert not exp.regime_rules(_fab(perception=0.3))[0]["holds"]          # blind VLM
    assert not exp.regime_rules(_fab(pw=(0.6, 0.9, 0.8)))[1]["holds"]       # not learnable
    assert not exp.regime_rules(_fab(pw=(0.999, 0.9, 0.8),
                                     pt=(0.998, 0.85, 0.7)))[1]["holds"]    # both perfect
    assert exp.regime_rules(_fab(pw=(0.999, 0.9, 0.8)))[1]["holds"]         # one imperfect
    assert not exp.regime_rules(_fab(shortcut=0.7))[2]["holds"]
    assert not exp.regime_rules(_fab(sft=0.97))[3]["holds"]                 # at the ceiling
    assert not exp.regime_rules(_fab(malformed=(0.5, 0.05)))[4]["holds"]    # format, not caption
    assert not exp.regime_rules(_fab(malformed=(0.1, 0.25)))[4]["holds"]


def test_claims_and_checks_name_their_part():
    """A failing generation check leaves the reward-model claim informative, and back."""
    from lab.outputs import claim_informative
    m = _fab(malformed=(0.5, 0.05))
    r = {"claims": exp.claim_rules(m), "regime": exp.regime_rules(m)}
    assert [claim_informative(r, c) for c in r["claims"]] == [True, False, False]
    m = _fab(shortcut=0.7)
    r = {"claims": exp.claim_rules(m), "regime": exp.regime_rules(m)}
    assert [claim_informative(r, c) for c in r["claims"]] == [False, True, True]


def test_bad_config_is_refused_naming_the_key():
    c = get_config("test")
    c.rl.group_size = 1
    with pytest.raises(ValueError, match="rl.group_size"):
        exp.check_config(c)
    c = get_config("test")
    c.noise_levels = (0.0,)
    with pytest.raises(ValueError, match="noise_levels"):
        exp.check_config(c)


def test_the_default_perception_vlm_ships_with_lab():
    """The main job loads HUMOR's perception VLM from lab/zoo/assets instead of training it
    (about 75 s on two cores); a recipe change without re-shipping fails here."""
    from lab import zoo
    from lab.methods import humor as H

    c = get_config("default")
    pc = c.perception
    model, _ = H.load_perception(pc.steps, colour_steps=pc.colour_steps, d_model=pc.d_model,
                                 seed=c.seed, n_eval=pc.n_eval, source="shipped")
    assert zoo.loads()[-1]["source"] == "shipped"
    assert model.config.text.d_model == pc.d_model


def test_the_default_sft_policies_ship_with_lab_and_caption_in_the_grammar():
    """The main job loads HUMOR's two SFT policies from lab/zoo/assets instead of training
    them (about 230 s on two cores); a recipe change without re-shipping fails here. The
    shipped policies' greedy completions parse for four scene / intent prompts (the
    default run's greedy malformed fraction was 0 for both)."""
    from lab.methods import humor as H

    c = get_config("default")
    models, got = exp.load_sft(c, None, None, exp.sft_noise(c), source="shipped")
    assert got.source == "shipped" and got.key.startswith("humor-sft-")
    assert set(models) == set(H.MODES) and set(got.metrics["seconds"]) == set(H.MODES)
    words = [(s, i) for s, i in zip(H.SCENES[:4], H.INTENTS[:4], strict=True)]
    for mode, model in models.items():
        _, caps = exp._captions(model, exp.ByteTokenizer(), words, c)
        assert all(H.parse_caption(cap) is not None for cap in caps), (mode, caps)


def test_the_sft_recipe_follows_every_setting_that_changes_the_policies():
    c = get_config("default")
    base = exp._sft_recipe(c, exp.sft_noise(c))
    for change in (lambda c: c.sft.update(steps=999), lambda c: c.policy.update(d_ff=128),
                   lambda c: c.update(seeds=(3, 1)), lambda c: c.perception.update(steps=5),
                   lambda c: c.update(seed=7), lambda c: c.data.update(n_train=301)):
        other = get_config("default")
        change(other)
        assert exp._sft_recipe(other, exp.sft_noise(other)) != base
    assert exp.sft_noise(c) == 0.2
