"""experiments/prkv.py at the test preset: the zoo path end to end, the Hugging Face path on a
tiny random Qwen3 checkpoint written here, and config validation."""

import json

import numpy as np
import pytest

from configs.prkv import get_config
from experiments import prkv as exp
from lab.data.synthetic import generate as generate_task
from tests.checkpoints import tiny_qwen3


def check_outputs(out, workdir, config, memory_falls: bool = True):
    files = {p.name for p in workdir.iterdir()}
    assert {"config.json", "results.json", "report.md", "accuracy_vs_ratio.png"} <= files
    saved = json.loads((workdir / "results.json").read_text())
    for task in config.tasks.names:
        for p in config.eval.policies:
            for r in config.eval.ratios:
                a = saved["accuracy"][task][p][str(float(r))]
                assert 0.0 <= a <= 1.0
    # Costs on the first task's first batch: KV bytes measured from the compressed caches
    # (0.75 keeps int(T / 4) tokens of ~100, just under a quarter), scoring time, end to end.
    first = config.tasks.names[0]
    assert set(saved["costs"]) == {first}
    row = saved["costs"][first]["policies"]["prkv"]
    assert 0.23 <= row["kept_bytes"]["0.75"] / row["kept_bytes"]["0.0"] <= 0.25
    assert row["score_fraction"] == pytest.approx(
        row["score_seconds"] / saved["costs"][first]["prefill_seconds"])
    ee = saved["costs"][first]["end_to_end"]
    assert ee["ratio"] == 0.75
    assert ee["overhead"] == pytest.approx(ee["prkv_seconds"] / ee["full_seconds"])
    # Compiled generate memory at the run's widest prompt: StreamingLLM (no statistics) at 0.75
    # needs less than the full cache (not on a 1-layer d=32 model with one KV head, whose whole
    # decode cache is smaller than the prefill's own peak); PRKV and its materialised variant
    # at every evicting ratio, the latter capturing L B H T^2 float32 attention probabilities.
    memory = saved["memory"]
    mem = memory["policies"]
    assert set(mem) == set(config.eval.policies) | {"prkv_dense"}
    if memory_falls:
        assert mem["streaming_llm"]["0.75"]["peak"] < mem["full"]["0.0"]["peak"]
    assert set(mem["prkv"]) == set(mem["prkv_dense"]) == {"0.75"}
    b, t = memory["batch"], memory["context"]
    assert b == config.eval.cost_batch_size and t == saved["width"]
    lbh = memory["n_layers"] * b * memory["n_heads"]
    assert mem["prkv_dense"]["0.75"]["statistics"] - mem["prkv"]["0.75"]["statistics"] == (
        4 * lbh * t * (t - memory["head_dim"]))          # float32 attention vs queries
    peak = next(c for c in out["claims"] if c["claim"].startswith("PRKV's peak memory"))
    rel = {r: m["peak"] / mem["full"]["0.0"]["peak"] for r, m in mem["prkv"].items()}
    assert peak["measured"] == pytest.approx(rel) and peak["holds"] == (max(rel.values()) <= 1)
    over = next(c for c in out["claims"] if c["claim"].startswith("PRKV's end-to-end"))
    assert over["measured"] == pytest.approx(ee["overhead"])
    assert over["holds"] == (ee["overhead"] <= config.claims.max_overhead)
    # the claims' and the regime's verdicts are their rules applied to the stored numbers
    assert len(out["claims"]) >= (5 if config.ablation.task else 4)
    assert not any(c["claim"].startswith("kept KV bytes") for c in out["claims"])
    assert saved["regime"] == exp.regime_checks(saved["accuracy"])
    assert [r["measured"] for r in saved["regime"]] == [
        saved["accuracy"][t]["full"]["0.0"] for t in config.tasks.names]
    assert "### variable_tracking" in (workdir / "report.md").read_text()
    # The ablation: every (alpha, kernel) pair at the non-zero ratios; the main configuration's
    # row is the main table's.
    if not config.ablation.task:
        return
    ab = saved["ablation"]
    a = config.ablation
    assert ab["task"] == a.task and ab["full"] == saved["accuracy"][a.task]["full"]["0.0"]
    question = exp.ablation_name(config.prkv.alpha, config.prkv.kernel_size, "question")
    assert a.question_restart and set(ab["variants"]) == {
        exp.ablation_name(al, k) for al in a.alphas for k in a.kernel_sizes} | {question}
    assert all(0 <= v <= 1 for v in ab["variants"][question].values())
    assert ab["variants"][ab["main"]] == {k: v for k, v in
                                          saved["accuracy"][a.task]["prkv"].items() if k != "0.0"}
    assert any("multi-hop PageRank" in c["claim"] for c in out["claims"])
    assert "PRKV ablation" in (workdir / "report.md").read_text()


def _fabricated(prkv_needle=0.6, prkv_bytes=25.0, score_fraction=0.5, prkv_peak=(0.9, 0.95),
                overhead=1.05):
    """Results of two solved tasks at ratios 0, 0.5 and 0.75: SnapKV keeps 0.5 of variable
    tracking and 0.7 of needles; PRKV 0.6 and ``prkv_needle``; PRKV's compiled peak memory
    ``prkv_peak`` times the full cache's at 0.5 and 0.75; its generate time ``overhead`` times
    the full cache's."""
    config = get_config("test")
    config.eval.policies = ["full", "snapkv", "prkv"]
    config.eval.ratios = [0.0, 0.5, 0.75]
    keep = {"variable_tracking": {"snapkv": 0.5, "prkv": 0.6},
            "needle": {"snapkv": 0.7, "prkv": prkv_needle}}
    acc = {t: {"full": {"0.0": 0.9, "0.5": 0.9, "0.75": 0.9},
               **{p: {"0.0": 0.9, "0.5": 0.8, "0.75": a} for p, a in k.items()}}
           for t, k in keep.items()}
    agreement = {t: {p: {"0.0": 1.0, "0.5": 0.9, "0.75": a / 0.9} for p, a in k.items()}
                 for t, k in keep.items()}
    costs = {"variable_tracking": {"policies": {
        "full": {"kept_bytes": {"0.0": 100.0, "0.5": 100.0, "0.75": 100.0}},
        "snapkv": {"kept_bytes": {"0.0": 100.0, "0.5": 50.0, "0.75": 25.0},
                   "score_fraction": 0.1},
        "prkv": {"kept_bytes": {"0.0": 100.0, "0.5": 50.0, "0.75": prkv_bytes},
                 "score_fraction": score_fraction}},
        "end_to_end": {"ratio": 0.75, "full_seconds": 2.0, "prkv_seconds": 2.0 * overhead,
                       "overhead": overhead}}}
    memory = {"batch": 16, "context": 992, "policies": {
        "full": {"0.0": {"peak": 200.0}},
        "prkv": {"0.5": {"peak": 200.0 * prkv_peak[0]}, "0.75": {"peak": 200.0 * prkv_peak[1]}}}}
    solved = {t: True for t in keep}
    return {c["claim"].split(" ")[0] + " " + c["metric"]: c
            for c in exp._claims(acc, agreement, costs, memory, solved, config)}


PEAK = "PRKV's PRKV peak / full-cache peak, per ratio"
OVERHEAD = "PRKV's PRKV generate time / full-cache generate time"


def test_claim_rules_on_fabricated_results():
    held = _fabricated()
    on_par = held["PRKV mean exact match"]
    # mean over both tasks at 0.75: PRKV (0.6 + 0.6) / 2 = 0.6 = SnapKV's (0.5 + 0.7) / 2
    assert on_par["holds"] and on_par["measured"] == pytest.approx({"prkv": 0.6, "snapkv": 0.6})
    assert held["PRKV mean exact match on variable_tracking"]["holds"]  # 0.6 > 0.5
    assert held["PRKV mean agreement with the full-cache generation"]["holds"]
    assert held["PRKV's PRKV scoring time / prefill forward time"]["holds"]
    # the kept-bytes tautology is no claim any more: kept bytes equal at every ratio say nothing
    assert not any(c["claim"].startswith("kept KV bytes") for c in held.values())
    assert {c["claim"] for c in _fabricated(prkv_bytes=100.0).values()} == {
        c["claim"] for c in held.values()}
    # PRKV 0.55 on needles: mean 0.575 < 0.6 - margin 0.02; scoring 1.3x the prefill forward
    failed = _fabricated(prkv_needle=0.55, score_fraction=1.3)
    assert not failed["PRKV mean exact match"]["holds"]
    assert failed["PRKV mean exact match"]["measured"]["prkv"] == pytest.approx(0.575)
    assert not failed["PRKV's PRKV scoring time / prefill forward time"]["holds"]
    assert failed["PRKV mean exact match on variable_tracking"]["holds"]  # unchanged: 0.6 > 0.5
    # agreement: PRKV (0.6 + 0.55) / 0.9 / 2 = 0.639 vs SnapKV's 0.667, more than the margin
    agree = failed["PRKV mean agreement with the full-cache generation"]
    assert not agree["holds"] and agree["measured"]["prkv"] == pytest.approx(1.15 / 1.8)


def test_peak_memory_and_overhead_claims_on_fabricated_results():
    """Peak memory: PRKV's compiled peak at most the full cache's at every evicting ratio.
    Overhead: PRKV's end-to-end generate time at most claims.max_overhead (1.1) times the
    full cache's."""
    held = _fabricated(prkv_peak=(0.9, 1.0), overhead=1.1)  # equal is "at most"
    assert held[PEAK]["holds"] and held[PEAK]["measured"] == pytest.approx(
        {"0.5": 0.9, "0.75": 1.0})
    assert "16 prompts of 992 tokens" in held[PEAK]["claim"]
    assert held[OVERHEAD]["holds"] and held[OVERHEAD]["measured"] == pytest.approx(1.1)
    assert "at ratio 0.75" in held[OVERHEAD]["claim"] and "1.1x" in held[OVERHEAD]["claim"]
    # one ratio above the full cache's peak fails the claim (materialised attention does this:
    # its L B H T^2 probabilities outgrow what eviction saves); so does 1.3x the time
    failed = _fabricated(prkv_peak=(0.9, 1.07), overhead=1.3)
    assert not failed[PEAK]["holds"]
    assert failed[PEAK]["measured"] == pytest.approx({"0.5": 0.9, "0.75": 1.07})
    assert not failed[OVERHEAD]["holds"]
    assert failed[OVERHEAD]["measured"] == pytest.approx(1.3)
    assert not _fabricated(prkv_peak=(1.01, 0.5))[PEAK]["holds"]  # every ratio, not the mean
    # the other claims' verdicts do not depend on memory or time
    assert {k: c["holds"] for k, c in failed.items() if k not in (PEAK, OVERHEAD)} == {
        k: c["holds"] for k, c in held.items() if k not in (PEAK, OVERHEAD)}


def test_one_prefill_for_every_baseline_generates_what_each_policy_generates():
    """baseline_accuracy (one prompt forward per batch, each policy applied to its cache and
    statistics) gives the texts generate(policy=p) gives, for every registered baseline."""
    config = get_config("test")
    config.eval.policies = list(exp.POLICIES)
    model, tok, _ = exp.load_model(config)
    kwargs = exp.task_kwargs(config)["variable_tracking"]
    d = generate_task("variable_tracking", 2, seed=config.tasks.eval_seed, **kwargs)
    x, lengths = exp.encode(tok, d["prompt"], int(tok.pad_id or 0), 128)
    capacity = 128 + config.eval.max_new_tokens
    fns = exp.scorers(config.eval.policies, config)
    pre = exp.prefill_once(model, tok, x, lengths, needs=exp.policy_needs(config.eval.policies),
                           window=config.eval.window)
    cells = exp.baseline_accuracy(model, tok, pre, lengths, d["answer"], fns=fns,
                                  ratios=[0.5, 0.75], config=config, capacity=capacity)
    assert set(cells) == {(p, r) for p in exp.POLICIES if p not in ("full", "prkv")
                          for r in (0.5, 0.75)}
    for (p, r), got in cells.items():
        ref = exp.accuracy(model, tok, x, lengths, d["answer"], policy=p, ratio=r,
                           config=config, capacity=capacity)
        assert got == ref, (p, r)


@pytest.mark.deep
def test_shared_scoring_generates_what_the_policy_generates():
    """prkv_accuracy (one PageRank solve per batch for every ratio and pooling) gives the
    texts generate(policy="prkv") gives, for each variant and for the question restart."""
    config = get_config("test")
    model, tok, _ = exp.load_model(config)
    kwargs = exp.task_kwargs(config)["variable_tracking"]
    d = generate_task("variable_tracking", 2, seed=config.tasks.eval_seed, **kwargs)
    x, lengths = exp.encode(tok, d["prompt"], int(tok.pad_id or 0), 128)
    qlens = exp.question_lengths(tok, d["prompt"])
    capacity = 128 + config.eval.max_new_tokens
    for question, variants in ((False, [(0.5, 1)]), (True, [(0.85, 3)])):
        window = int(qlens.max()) if question else None
        shared = exp.prkv_accuracy(model, tok, x, lengths, d["answer"], ratios=[0.75],
                                   config=config, capacity=capacity, variants=variants,
                                   question_lengths=qlens if question else None,
                                   window=window)
        assert set(shared) == {(al, k, 0.75) for al, k in variants}
        for (al, k, r), got in shared.items():
            over = {"alpha": al, "kernel_size": k, **({"window": window} if question else {})}
            ref = exp.accuracy(model, tok, x, lengths, d["answer"], policy="prkv", ratio=r,
                               config=config, capacity=capacity, overrides=over,
                               question_lengths=qlens if question else None)
            assert got == ref, (al, k, r, question)


def test_ablation_claim_on_fabricated_results():
    """Multi-hop (the largest alpha) must keep more than near one-hop (the smallest), at the
    claim ratios, for the configured kernel."""
    config = get_config("test")                      # alphas 0.5, 0.85; kernel 3; ratio 0.75

    def ablation(hi, lo):
        return {"task": "variable_tracking", "full": 0.9, "variants": {
            exp.ablation_name(0.85, 3): {"0.75": hi}, exp.ablation_name(0.5, 3): {"0.75": lo},
            exp.ablation_name(0.85, 1): {"0.75": 0.0}, exp.ablation_name(0.5, 1): {"0.75": 1.0}}}

    (held,) = exp._ablation_claims(ablation(0.6, 0.4), config)
    assert held["holds"] and held["measured"] == {"alpha=0.85": 0.6, "alpha=0.5": 0.4,
                                                  "full cache": 0.9}
    (failed,) = exp._ablation_claims(ablation(0.4, 0.4), config)   # equal is not "more"
    assert not failed["holds"]
    assert exp._ablation_claims(None, config) == []


def test_regime_is_a_band_of_full_cache_exact_match():
    def acc(**full):
        return {t: {"full": {"0.0": a}} for t, a in full.items()}

    # lm-xs-long at the default preset: 0.92 / 0.81 / 0.45, each inside [0.3, 0.95]
    inside = exp.regime_checks(acc(variable_tracking=0.92, needle=0.81, arithmetic=0.45))
    assert [r["holds"] for r in inside] == [True, True, True]
    assert [r["measured"] for r in inside] == [0.92, 0.81, 0.45]
    assert "variable_tracking at full cache" in inside[0]["check"]
    assert "[0.3, 0.95]" in inside[0]["check"]
    # an untrained model (0.0), one at the ceiling (1.0), and the inclusive edges
    outside = exp.regime_checks(acc(variable_tracking=0.0, needle=1.0, arithmetic=0.3))
    assert [r["holds"] for r in outside] == [False, False, True]
    assert [r["holds"] for r in exp.regime_checks(acc(needle=0.95, arithmetic=0.29))] == [
        True, False]
    assert [r["holds"] for r in exp.regime_checks(acc(needle=0.5), band=(0.6, 0.9))] == [False]


def test_main_table_is_the_mean_over_tasks():
    acc = {t: {"question_only": {"0.0": 0.1}, "full": {"0.0": 0.8, "0.5": 0.8},
               "prkv": {"0.0": 0.8, "0.5": a}} for t, a in (("needle", 0.5), ("arithmetic", 0.2))}
    assert exp.main_table({"accuracy": acc}) == [
        {"policy": "full", "r=0": 0.8, "r=0.5": 0.8},
        {"policy": "prkv", "r=0": 0.8, "r=0.5": pytest.approx(0.35)}]


def test_zoo_path_end_to_end(tmp_path):
    config = get_config("test")
    out = exp.run(config, str(tmp_path))
    check_outputs(out, tmp_path, config)
    assert out["model"]["source"].startswith("prkv-test-")


@pytest.mark.deep
def test_hf_path_on_a_tiny_random_qwen3(tmp_path):
    tiny_qwen3(tmp_path, "The grass is green. abc=417. Number of kqzt? A: 12")
    config = get_config("test")
    config.model = str(tmp_path)
    # The checkpoint path, not the tasks: one task and no ablation (the zoo path runs them).
    config.tasks.names = ["variable_tracking"]
    config.ablation.task = ""
    work = tmp_path / "out"
    out = exp.run(config, str(work))
    check_outputs(out, work, config, memory_falls=False)
    assert out["model"]["source"] == str(tmp_path)


def test_config_validation_names_the_key():
    config = get_config("test")
    config.eval.ratios = [0.0, 1.0]
    with pytest.raises(ValueError, match=r"eval.ratios=\[0.0, 1.0\].*\[0, 1\)"):
        exp.check_config(config)
    config = get_config("test")
    config.eval.policies = ["full", "snap"]
    with pytest.raises(ValueError, match="eval.policies"):
        exp.check_config(config)
    config = get_config("test")
    config.prkv.graph = "layer"
    with pytest.raises(ValueError, match="prkv.graph='layer'"):
        exp.check_config(config)
    config = get_config("test")
    config.eval.cost_batch_size = config.eval.batch_size + 1
    with pytest.raises(ValueError, match=r"eval.cost_batch_size=3.*\[1, eval.batch_size\]"):
        exp.check_config(config)
    assert np.isclose(get_config("default").prkv.alpha, 0.85)


def test_named_zoo_model_is_loaded_by_name(tmp_path):
    """``--config.model=<zoo name>`` loads that named LM; one whose max_len cannot hold the
    prompts is refused before any evaluation, with the sizes in the message."""
    config = get_config("test")
    config.model = "lm-test"  # max_len 64 < the test preset's ~100-token prompts
    with pytest.raises(ValueError, match=r"prompts of \d+ tokens .* exceed the model's "
                                         r"max_len 64"):
        exp.run(config, str(tmp_path))
    model, _, info = exp.load_model(config)
    assert info["source"].startswith("lm-test-") and model.config.max_len == 64


def test_default_model_was_fine_tuned_on_the_default_tasks():
    """The default preset evaluates lm-xs-long on the tasks, lengths and difficulties it was
    fine-tuned on: a change to one side without the other would test it off-distribution."""
    from lab.zoo.spec import NAMED
    config = get_config("default")
    trained = NAMED[config.model].data["tasks"]
    for task, kwargs in exp.task_kwargs(config).items():
        assert {k: v for k, v in trained[task].items() if k != "weight"} == kwargs, task
