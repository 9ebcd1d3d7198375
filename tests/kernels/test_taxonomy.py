"""Hawkeye's taxonomy: ten strategies, one test per target architecture.

Interpret-mode correctness and lowering for the target platform run on any
host; the hardware part (device-code markers, speedup over the unoptimised
kernel) runs only on the matching GPU and is skipped with the reason elsewhere.
"""

import dataclasses

import pytest

from kernels_pallas import taxonomy as tx
from kernels_pallas.taxonomy import arch, checks
from kernels_pallas.taxonomy import workloads as wl

PAIRS = [(s.name, a) for s in tx.STRATEGIES for a in tx.NAMES]


def test_ten_strategies_over_four_architectures():
    assert len(tx.STRATEGIES) == 10 and len({s.name for s in tx.STRATEGIES}) == 10
    assert tx.NAMES == ("ampere", "hopper", "blackwell", "mi350")
    for s in tx.STRATEGIES:
        assert s.exploits and set(s.support) <= set(tx.NAMES), s.name
        assert all(a in s.params for a in s.support), s.name
    text = tx.describe()
    assert all(f"## {s.name}" in text for s in tx.STRATEGIES)
    assert "warp_specialization" in text and "not available" in text   # Ampere lacks it


@pytest.mark.parametrize("name,target", PAIRS)
def test_strategy_interpret(name, target):
    r = tx.check_interpret(tx.get(name), target)
    if r.status == "skip":
        pytest.skip(r.detail)
    assert r.status == "pass", r.detail
    assert r.value <= wl.tolerance(tx.workload_for(tx.get(name), target))


@pytest.mark.parametrize("name,target", PAIRS)
def test_strategy_lowering(name, target):
    r = tx.check_lowering(tx.get(name), target)
    if r.status == "skip":
        pytest.skip(r.detail)
    assert r.status == "pass", r.detail


@pytest.mark.parametrize("name,target", [(n, a) for n in ("bulk_copy", "warp_specialization")
                                         for a in ("hopper", "blackwell")])
def test_expert_mosaic_gpu_kernel_in_gpu_interpret_mode(name, target):
    """JAX's TMA + warp-specialised wgmma Hopper matmul, simulated on the CPU (run once, cached)."""
    r = tx.check_expert_interpret(tx.get(name), target)
    if r.status == "skip":
        assert target == "blackwell" and "tmem" in r.detail   # the interpreter lacks TMEM
        pytest.skip(r.detail)
    assert r.status == "pass" and r.value < 2.0**-10, r.detail


@pytest.mark.hardware
@pytest.mark.parametrize("name,target", PAIRS)
def test_strategy_hardware(name, target):
    reason = arch.skip_reason(target)
    if reason or not tx.get(name).supported(target):
        pytest.skip(reason or f"{target} has no {name} feature")
    results = tx.check_hardware(tx.get(name), target)
    assert all(r.status == "pass" for r in results), [r.detail for r in results]


def test_checks_catch_a_wrong_kernel_and_an_unfused_epilogue(monkeypatch):
    s = tx.get("tiling")
    real = wl.run_kernel
    monkeypatch.setattr(wl, "run_kernel", lambda *a, **k: real(*a, **k) * 1.001)
    wl._interpret_error.cache_clear()
    r = tx.check_interpret(s, "ampere")
    assert r.status == "fail" and r.value > 5e-4
    monkeypatch.undo()
    wl._interpret_error.cache_clear()
    fusion = tx.get("epilogue_fusion")
    assert tx.check_lowering(fusion, "hopper", params=fusion.baseline).status == "fail"
    pipe = tx.get("pipelining")   # the stage count reaches the Triton call, and only that one
    w = tx.workload_for(pipe, "hopper")
    base = checks.lowered_text(w, tuple(sorted(pipe.baseline.items())), "cuda")
    assert "num_stages = 1" in base and "num_stages = 4" not in base


def test_device_detection_and_bad_targets():
    assert arch.classify("NVIDIA H100 80GB HBM3") == "hopper"
    assert arch.classify("NVIDIA A100-SXM4-40GB") == "ampere"
    assert arch.classify("NVIDIA B200") == "blackwell"
    assert arch.classify("AMD Instinct MI355X") == "mi350"
    assert arch.classify("whatever", compute_capability="10.0") == "blackwell"
    assert arch.classify("NVIDIA Tesla T4", compute_capability="7.5") is None
    with pytest.raises(ValueError, match=r"target='volta'.*\['ampere', 'hopper'"):
        tx.check_interpret(tx.get("tiling"), "volta")
    with pytest.raises(ValueError, match="strategy='unroll' is unknown"):
        tx.get("unroll")
    with pytest.raises(ValueError, match="unknown matmul parameters"):
        wl.check_params("matmul", {"block_x": 1})
    bad = dataclasses.replace(tx.get("tiling").interpret_workload, dtype="int8")
    with pytest.raises(ValueError, match="dtype='int8'"):
        bad.validate()
