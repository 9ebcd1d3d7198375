"""Hawkeye search: finds the known best on a synthetic cost, honours tests, budget is the knob."""

import json
import math

import pytest

from lab.methods import hawkeye as hk
from lab.methods.hawkeye.proposers import SPACE, START

W = hk.Workload("matmul", (1024, 1024, 1024), "bfloat16")
BEST = dict(block_m=64, block_n=128, block_k=32, num_warps=8, num_stages=3, split_k=2,
            group_m=8, grid_order="nm", backend="triton", fuse_epilogue=True)
PASS = lambda *a: (True, "")            # noqa: E731  (stand-ins for the interpret checks)
NUMERICS_OK = lambda *a: (True, 0.0)    # noqa: E731


class Synthetic:
    """A separable cost with a unique minimum at BEST (distance in value indices)."""

    kind = "synthetic"

    def __call__(self, w, params):
        return 1.0 + sum(abs(SPACE["matmul"][k].index(v) - SPACE["matmul"][k].index(BEST[k]))
                         * (1 + i) for i, (k, v) in enumerate(sorted(params.items())))

    def baseline(self, w):
        return 5.0


def _search(budget, **kw):
    kw.setdefault("unit_test", PASS)
    kw.setdefault("check", NUMERICS_OK)
    return hk.search(W, "hopper", budget=budget, cost=Synthetic(), **kw)


def test_search_finds_the_known_best_configuration():
    r = _search(60)
    assert r.best.params == BEST and r.best.cost == 1.0
    legal = [e for e in r.evaluations if not e.status.startswith("invalid")]
    assert r.tried == 60 and r.passed == len(legal) > 40   # the rest: Mosaic GPU combinations
    assert all("backend=" in e.status for e in r.evaluations if e not in legal)
    row = r.row()
    assert row["speedup_vs_xla"] == 5.0 and row["cost"] == "synthetic"


def test_budget_is_the_test_time_compute_knob():
    costs = [_search(b).best.cost for b in (3, 10, 25, 60)]
    assert all(a >= b for a, b in zip(costs, costs[1:], strict=False))
    assert costs[0] > costs[-1] == 1.0


def test_evolutionary_search_alone_improves_on_the_start():
    r = _search(40, proposer=hk.EvolutionaryProposer(seed=1))
    start = Synthetic()(W, START["matmul"])
    assert r.best.cost < start / 2


def test_failed_unit_tests_and_numerics_exclude_candidates():
    no_split = lambda s, t, w, p: (s != "split_k", "split-K test failed")   # noqa: E731
    r = _search(60, unit_test=no_split)
    assert r.best.params["split_k"] == 1
    assert any(e.status == "failed_test:split_k" for e in r.evaluations)
    picky = lambda w, p, on: (p["block_k"] != 32, 1.0)                   # noqa: E731
    r = _search(60, check=picky)
    assert r.best.params["block_k"] != 32 and r.passed < r.tried
    assert any(e.status == "failed_numerics" for e in r.evaluations)


def test_each_candidate_is_tested_itself_and_ungrounded_search_skips_the_tests():
    calls = []

    def record(s, t, w, p):
        calls.append((s, tuple(sorted(p.items()))))
        return True, ""

    r = _search(12, unit_test=record)
    kept = [e for e in r.evaluations if e.status == "passed"]
    # every (candidate, used strategy) pair was tested on that candidate: no per-strategy cache
    assert sorted(calls) == sorted((s, tuple(sorted(e.params.items())))
                                   for e in kept for s in e.strategies)
    legal = [e for e in r.evaluations if not e.status.startswith("invalid")]
    assert len({c[1] for c in calls}) == len(kept) == len(legal) >= 10
    calls.clear()
    r = _search(12, unit_test=record, grounded=False)
    assert calls == [] and r.passed == len(legal) and r.grounded is False


def test_real_unit_tests_reject_what_the_target_lacks():
    """On MI350 the grounded search refuses the Mosaic GPU (TMA) kernels and 4 stages; the
    ungrounded one keeps whatever its numerical check passes."""
    w = hk.Workload("matmul", (1024, 1024, 1024), "bfloat16")
    grounded = hk.search(w, "mi350", budget=40, cost=hk.RooflineCost("mi350"), check=NUMERICS_OK)
    for e in grounded.evaluations:
        if e.status == "passed":
            assert e.params["backend"] == "triton" and e.params["num_stages"] <= 2
            assert all(v == "pass" for v in hk.target_tests(w, "mi350", e.params).values())
    assert any(e.status.startswith("failed_test") and e.params["backend"] != "triton"
               for e in grounded.evaluations)


def test_small_space_is_exhausted_then_the_search_stops():
    w = hk.Workload("rmsnorm", (4096, 1024), "bfloat16")
    r = hk.search(w, "mi350", budget=50, unit_test=PASS, check=NUMERICS_OK,
                  cost=lambda w, p: abs(p["block_rows"] - 16) + 1.0)
    assert r.tried == len(SPACE["rmsnorm"]["block_rows"]) and r.best.params == {"block_rows": 16}


def test_agent_proposer_gets_taxonomy_and_tests_as_context():
    prompts = []

    def agent(prompt):
        prompts.append(prompt)
        return "Here you go:\n" + json.dumps([BEST])

    r = _search(5, proposer=hk.AgentProposer(agent))
    assert "## online_softmax" in prompts[0] and "def check_interpret" in prompts[0]
    assert r.best.params == BEST and r.best.origin == "AgentProposer"


def test_real_checks_on_a_small_workload():
    """Default unit tests (taxonomy, interpret + lowering) and interpret numerics, analytic cost."""
    w = hk.Workload("matmul", (64, 64, 64), "float32")
    r = hk.search(w, "ampere", budget=3)
    assert r.cost_kind == "analytic" and r.passed >= 1
    assert r.best.error is not None and r.best.error < 1e-4
    assert r.row()["speedup_vs_xla"] == "not measured"
    assert math.isfinite(r.best.cost)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"target='volta'.*'ampere'"):
        hk.search(W, "volta", budget=2)
    with pytest.raises(ValueError, match="'nvfp4' is not supported on hopper"):
        hk.search(hk.Workload("scaled_matmul", (64, 64, 64), "nvfp4"), "hopper", budget=2)
    with pytest.raises(ValueError, match="fmt='int4'.*known formats"):
        hk.search(hk.Workload("scaled_matmul", (64, 64, 64), "int4"), "blackwell", budget=2)
    with pytest.raises(ValueError, match="op='conv'"):
        hk.search(hk.Workload("conv", (1, 1, 1)), "hopper", budget=2)
    with pytest.raises(ValueError, match="budget=0"):
        hk.search(W, "hopper", budget=0, cost=Synthetic())


def test_roofline_cost_ranks_the_strategies_it_models():
    from kernels_pallas.taxonomy import strategies as strat

    cost = hk.RooflineCost("hopper")
    assert cost.kind == "analytic" and cost.baseline(W) is None     # never a speed claim
    expert, untiled = strat.get("tiling").params["hopper"], strat.UNTILED
    assert cost(W, expert) < cost(W, untiled) / 4                   # tiling pays off
    assert cost(W, dict(expert, num_stages=1)) > cost(W, expert)    # pipelining overlaps
    assert cost(W, dict(expert, fuse_epilogue=False)) > cost(W, expert)
    huge = dict(expert, block_m=256, block_n=256, block_k=128, num_stages=4)
    assert math.isinf(cost(W, huge))                                # shared memory overflow
    skinny = hk.Workload("matmul", (64, 64, 65536), "bfloat16")
    tiles = dict(expert, block_m=64, block_n=64)
    assert cost(skinny, dict(tiles, split_k=8)) < cost(skinny, tiles)  # split-K fills the GPU
