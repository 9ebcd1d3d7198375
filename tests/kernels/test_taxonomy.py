"""Hawkeye's taxonomy: ten strategies, one test per target architecture.

Interpret-mode correctness and lowering for the target platform run on any
host; the hardware part (device-code markers, speedup over the unoptimised
kernel) runs only on the matching GPU and is skipped with the reason elsewhere.
"""

import dataclasses

import pytest

from kernels_pallas import taxonomy as tx
from kernels_pallas.taxonomy import arch, checks, strategies
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
    s = tx.get(name)
    assert r.value <= wl.tolerance(tx.workload_for(s, target), s.params[target])


@pytest.mark.parametrize("name,target", PAIRS)
def test_unit_test_passes_the_strategy_and_fails_the_kernel_without_it(name, target):
    """Positive: the example for ``target`` passes ``name``'s test (lowered for the target);
    negative: the baseline without the strategy fails it. A target without the feature
    fails every kernel, the example of a target that has it included."""
    s = tx.get(name)
    if not s.supported(target):
        other = next(a for a in tx.NAMES if s.supported(a))
        r = tx.unit_test(s, target, tx.workload_for(s, other), s.params[other])
        assert r.status == "fail" and f"{target} has no {name}" in r.detail
        return
    pos = tx.check_lowering(s, target)
    assert pos.status == "pass", pos.detail
    neg = tx.check_without(s, target)
    assert neg.status == "pass" and neg.detail.startswith("baseline fails"), neg.detail


W = wl.Workload("matmul", (4096, 4096, 4096), "bfloat16")
MM = dict(block_m=64, block_n=64, block_k=32, num_stages=2, num_warps=4, split_k=1, group_m=1,
          grid_order="mn", backend="triton", fuse_epilogue=True)


@pytest.mark.parametrize("name,params,passes", [
    # tensor-core tiles: wgmma takes M=64 from one warpgroup, tcgen05 wants M=128, MFMA 32x32
    ("mma", dict(MM, block_m=64, block_n=64), {"ampere", "hopper", "mi350"}),
    ("mma", dict(MM, block_m=128, block_n=16), {"ampere", "hopper", "blackwell"}),
    ("mma", dict(MM, block_m=128, block_n=128, num_warps=2), {"ampere", "mi350"}),
    # pipelining depth: AMD's stream pipeliner double-buffers; NVIDIA parts take 4 stages
    ("pipelining", dict(MM, block_m=128, block_n=128, num_stages=4),
     {"ampere", "hopper", "blackwell"}),
    # TMA / warp specialisation: only the target's own Mosaic GPU kernel
    ("bulk_copy", dict(MM, block_m=64, block_n=64, block_k=64, backend="mosaic_hopper",
                       fuse_epilogue=False), {"hopper"}),
    ("warp_specialization", dict(MM, block_m=128, block_n=128, block_k=64,
                                 backend="mosaic_blackwell", fuse_epilogue=False), {"blackwell"}),
    # shared memory: 128x256 tiles x 3 stages of bf16 = 288 KB fits nowhere; 2 stages 192 KB
    # fits Hopper/Blackwell (228 KB) but not Ampere (164) or MI350 (160)
    ("tiling", dict(MM, block_m=128, block_n=256, block_k=128, num_stages=2),
     {"hopper", "blackwell"}),
    # split-K pays only while the output tiles underfill the SMs/CUs: 12x12 = 144 tiles
    ("split_k", dict(MM, block_m=32, block_n=32, split_k=2), {"blackwell", "mi350"}),
])
def test_the_same_kernel_is_judged_per_target(name, params, passes):
    w = wl.Workload("matmul", (384, 384, 4096), "bfloat16") if name == "split_k" else W
    got = {a for a in tx.NAMES if tx.unit_test(tx.get(name), a, w, params).status == "pass"}
    assert got == passes


def test_block_scaled_formats_per_target():
    s = tx.get("block_scaled_lowp")
    p = s.params["blackwell"]
    for fmt, passes in (("mxfp4", {"blackwell", "mi350"}), ("nvfp4", {"blackwell"}),
                        ("fp8_e4m3", {"hopper", "blackwell", "mi350"})):
        w = wl.Workload("scaled_matmul", (64, 64, 128), fmt)
        got = {a for a in tx.NAMES if tx.unit_test(s, a, w, p).status == "pass"}
        assert got == passes, fmt


def test_lowered_facts_decide_not_only_the_parameters(monkeypatch):
    """A kernel whose lowered module lacks what its parameters claim fails the test."""
    s, w = tx.get("pipelining"), tx.workload_for(tx.get("pipelining"), "hopper")
    p = s.params["hopper"]
    facts = checks.kernel_facts(wl.proxy_workload(w, p), p, "cuda")
    assert facts.backend == "triton" and facts.num_stages == p["num_stages"]
    lying = dataclasses.replace(facts, num_stages=1)
    monkeypatch.setattr(checks, "kernel_facts", lambda *a: lying)
    r = tx.unit_test(s, "hopper", w, p)
    assert r.status == "fail" and "module has num_stages=1" in r.detail
    no_dot = dataclasses.replace(facts, module=facts.module.replace(strategies.DOT, ""))
    monkeypatch.setattr(checks, "kernel_facts", lambda *a: no_dot)
    r = tx.unit_test(tx.get("tiling"), "hopper", w, p)
    assert r.status == "fail" and "the lowered module lacks" in r.detail
    ws = tx.get("warp_specialization")
    mosaic = dataclasses.replace(facts, backend="mosaic", device_ops="cp.async.bulk.tensor")
    monkeypatch.setattr(checks, "kernel_facts", lambda *a: mosaic)
    r = tx.unit_test(ws, "hopper", tx.workload_for(ws, "hopper"), ws.params["hopper"])
    assert r.status == "fail" and "nvvm.setmaxregister" in r.detail


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


def test_device_benchmark_refuses_a_host_without_a_target_gpu():
    import os
    import subprocess
    import sys

    if arch.detect() is not None:
        pytest.skip("hardware: a target GPU is present, so --device times kernels instead of "
                    "refusing (the refusal is what this test checks)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "benchmarks/pallas_kernels.py", "--device"], cwd=root,
                          env=dict(os.environ, PYTHONPATH=root), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "no GPU present" in proc.stderr
    assert "measured" not in proc.stdout
