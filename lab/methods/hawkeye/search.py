"""The Hawkeye search: propose, test, time, keep the best (Hawkeye, NeurIPS 2026).

For a workload (op, shape, dtype/format) and a target architecture, the
search asks a proposer for candidate kernel configurations, which stack the
taxonomy's strategies, and keeps a candidate only if

1. its parameters are legal for the workload (finite cost),
2. (``grounded=True``, the Hawkeye search) the candidate itself passes the unit test
   of every strategy it uses on the target (:func:`kernels_pallas.taxonomy.checks.unit_test`:
   the candidate lowered for the target's platform, its lowered facts and parameters
   checked against the target's hardware; nothing is cached per strategy, each candidate
   is tested), and
3. it matches the XLA reference numerically: compiled at the workload's shape
   when the process runs on the target, otherwise in interpret mode at a proxy
   shape that keeps its tiles, split-K and grid order (a few tiles, two K
   steps per split), since interpreting the full shape on a CPU would take hours.

Passing candidates are costed by the ``cost`` function and the best is kept.
``grounded=False`` is the same search without the taxonomy's tests (only step 3 gates),
the ablation of the paper's comparison; :func:`target_tests` tests any kept candidate
after the fact. ``budget`` (candidates tried) is the test-time compute knob.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax

from kernels_pallas.taxonomy import arch as arch_mod
from kernels_pallas.taxonomy import checks
from kernels_pallas.taxonomy import strategies as strat
from kernels_pallas.taxonomy import workloads as wl
from lab.methods.hawkeye.cost import MeasuredCost, RooflineCost
from lab.methods.hawkeye.proposers import (
    SPACE,
    START,
    Context,
    DefaultProposer,
    Proposer,
)

FORMAT_SUPPORT = {
    "ampere": ("float32", "bfloat16", "bf16"),
    "hopper": ("float32", "bfloat16", "bf16", "float8_e4m3fn", "fp8_e4m3", "fp8_e5m2"),
    "blackwell": ("float32", "bfloat16", "bf16", "float8_e4m3fn", "fp8_e4m3", "fp8_e5m2",
                  "mxfp4", "nvfp4"),
    "mi350": ("float32", "bfloat16", "bf16", "float8_e4m3fn", "fp8_e4m3", "fp8_e5m2", "mxfp4"),
}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One tried candidate: its parameters, where it came from, what happened, its cost."""

    params: dict
    origin: str
    strategies: tuple[str, ...]
    status: str            # passed | invalid: why | failed_test:<strategy> | failed_numerics
    error: float | None = None
    cost: float = math.inf


@dataclasses.dataclass
class SearchResult:
    workload: wl.Workload
    target: str
    cost_kind: str
    evaluations: list[Evaluation]
    baseline_cost: float | None
    start_cost: float
    grounded: bool = True

    @property
    def tried(self) -> int:
        return len(self.evaluations)

    @property
    def passed(self) -> int:
        return sum(e.status == "passed" for e in self.evaluations)

    @property
    def best(self) -> Evaluation | None:
        ok = [e for e in self.evaluations if e.status == "passed"]
        return min(ok, key=lambda e: e.cost) if ok else None

    def row(self) -> dict:
        """One line of the results table (speeds only when measured)."""
        best = self.best
        vs_xla = (self.baseline_cost / best.cost if best and self.baseline_cost else None)
        return {"op": self.workload.op, "shape": "x".join(map(str, self.workload.shape)),
                "dtype": self.workload.dtype, "target": self.target, "cost": self.cost_kind,
                "tried": self.tried, "passed": self.passed,
                "best_cost_s": best.cost if best else None,
                "speedup_vs_unoptimised": self.start_cost / best.cost if best else None,
                "speedup_vs_xla": vs_xla if vs_xla is not None else "not measured",
                "best_strategies": "+".join(best.strategies) if best else "",
                "best_params": best.params if best else None}


def relevant_strategies(w: wl.Workload, params: dict) -> tuple[str, ...]:
    """The taxonomy strategies a candidate uses (each must pass its unit test for the target)."""
    if w.op == "attention":
        return ("online_softmax",)
    if w.op == "rmsnorm":
        return ("tiling",)
    used = ["tiling"]
    if w.dtype != "float32" and w.op == "matmul":
        used.append("mma")
    if params["num_stages"] > 1:
        used.append("pipelining")
    if params.get("backend", "triton") != "triton":
        used += ["bulk_copy", "warp_specialization"]
    if params["split_k"] > 1:
        used.append("split_k")
    if params["fuse_epilogue"]:
        used.append("epilogue_fusion")
    if params["group_m"] > 1:
        used.append("grid_swizzle")
    if w.op == "scaled_matmul":
        used.append("block_scaled_lowp")
    return tuple(used)


def legal(w: wl.Workload, params: dict) -> str | None:
    """Why ``params`` cannot run ``w`` (``None`` if they can)."""
    wl.check_params(w.op, params)
    missing = sorted(set(SPACE[w.op]) - set(params))
    if missing:
        return f"missing parameters {missing}"
    if w.op in ("matmul", "scaled_matmul"):
        cfg = wl.matmul_config(params).validate()
        bk = wl.lowp_block(w) or params["block_k"]
        n_k = math.ceil(w.shape[2] / bk)
        if n_k % params["split_k"]:
            return f"split_k={params['split_k']} does not divide {n_k} K tiles"
        if cfg.backend != "triton":
            tm, tn = cfg.cta_tile()
            if w.op != "matmul" or w.dtype != "bfloat16":
                return f"backend={cfg.backend!r} runs bfloat16 matmuls only"
            if w.shape[0] % tm or w.shape[1] % tn or w.shape[2] % bk:
                return f"backend={cfg.backend!r} needs the shape in whole {tm}x{tn} CTA tiles"
            if params["fuse_epilogue"]:
                return f"backend={cfg.backend!r} has no fused epilogue"
    return None


def default_unit_test(strategy: str, target: str, w: wl.Workload,
                      params: dict) -> tuple[bool, str]:
    """``strategy``'s unit test on ``target`` applied to this candidate (no cache)."""
    r = checks.unit_test(strat.get(strategy), target, w, params)
    return r.status == "pass", r.detail


def target_tests(w: wl.Workload, target: str, params: dict) -> dict[str, str]:
    """Every used strategy's unit test on ``target`` for a kept candidate: name -> pass/fail."""
    return {s: checks.unit_test(strat.get(s), target, w, params).status
            for s in relevant_strategies(w, params)}


def numerical_check(w: wl.Workload, params: dict, on_target: bool) -> tuple[bool, float]:
    """Compiled at full shape on the target; interpret mode at the proxy shape elsewhere.
    A kernel the host cannot build or interpret (Blackwell's tensor memory; a Mosaic GPU
    kernel over the shared memory) fails: it was not checked."""
    if on_target:
        args = wl.make_inputs(w)
        err = wl.max_rel_error(wl.run_kernel(w, params, args, interpret=False),
                               wl.run_reference(w, args))
        return err <= wl.tolerance(w, params), err
    try:
        return wl.check(wl.proxy_workload(w, params), params)
    except Exception:  # noqa: BLE001  (not runnable here, e.g. Blackwell's tensor memory)
        return False, math.inf


def start_params(op: str, target: str) -> dict:
    """Where both the grounded and the ungrounded search start: the unoptimised kernel
    (one stage, unfused epilogue, no split, no swizzle, Triton) with the smallest tile the
    target's MMA takes (64x64x32, Blackwell's tcgen05 M=128 rows), so that the start runs on
    the target and each single-knob move can be tested on its own."""
    p = dict(START[op])
    if op in ("matmul", "scaled_matmul"):
        mt = arch_mod.hardware(target).mma_tile
        p.update(block_m=max(64, mt[0]), block_n=max(64, mt[1]), block_k=max(32, mt[2]))
    return p


def validate_target(w: wl.Workload, target: str) -> None:
    """``ValueError`` for an unknown target or a format the target cannot run."""
    arch_mod.get(target)
    w.validate()
    if w.dtype not in FORMAT_SUPPORT[target]:
        raise ValueError(f"dtype/format {w.dtype!r} is not supported on {target}; supported: "
                         f"{list(FORMAT_SUPPORT[target])}")


def search(w: wl.Workload, target: str, *, budget: int = 32, cost=None,
           proposer: Proposer | None = None, batch: int = 4, seed: int = 0,
           unit_test: Callable[[str, str, wl.Workload, dict], tuple[bool, str]] | None = None,
           check: Callable[[wl.Workload, dict, bool], tuple[bool, float]] | None = None,
           grounded: bool = True) -> SearchResult:
    """Searches kernel configurations for ``w`` on ``target`` (module docstring).

    Args:
      w: the workload. target: one of ``kernels_pallas.taxonomy.NAMES``.
      budget: the number of candidates tried (the test-time compute knob).
      cost: ``cost(w, params) -> seconds``, optionally with ``kind`` and ``baseline(w)``;
        :class:`MeasuredCost` on the target, :class:`RooflineCost` elsewhere.
      proposer: a :class:`Proposer`; systematic then evolutionary by default.
      unit_test, check: ``unit_test(strategy, target, w, params)`` applied to each candidate
        and the numerical check (defaults: :func:`default_unit_test`, :func:`numerical_check`).
      grounded: gate candidates by the unit tests (Hawkeye) or not (the ablation).

    Returns:
      A :class:`SearchResult` with every evaluation.
    """
    validate_target(w, target)
    if budget < 1:
        raise ValueError(f"budget={budget}; expected a positive number of candidates")
    on_target = arch_mod.detect() == target
    cost = cost or (MeasuredCost() if on_target else RooflineCost(target))
    proposer = proposer or DefaultProposer(seed)
    unit_test = unit_test or default_unit_test
    check = check or numerical_check
    start = start_params(w.op, target)
    context = Context(w, target, SPACE[w.op], start, strat.describe(), _tests_text())
    history: list[Evaluation] = []
    seen = set()
    while len(history) < budget:
        proposals = proposer.propose(context, history, min(batch, budget - len(history)))
        fresh = [p for p in proposals if tuple(sorted(p.items())) not in seen]
        if not fresh:
            break
        for params in fresh:
            seen.add(tuple(sorted(params.items())))
            history.append(_evaluate(w, target, params, cost,
                                     unit_test if grounded else None, check, on_target,
                                     type(proposer).__name__))
            if len(history) >= budget:
                break
    baseline = getattr(cost, "baseline", None)
    return SearchResult(w, target, getattr(cost, "kind", "custom"), history,
                        baseline(w) if baseline else None, cost(w, start), grounded)


def _evaluate(w, target, params, cost, unit_test, check, on_target, origin):
    try:
        why = legal(w, params)
    except ValueError as e:
        why = str(e)
    if why:
        return Evaluation(params, origin, (), f"invalid: {why}")
    used = relevant_strategies(w, params)
    t = cost(w, params)
    if not math.isfinite(t):
        return Evaluation(params, origin, used, "invalid: does not fit the target")
    for s in used if unit_test else ():
        if not unit_test(s, target, w, params)[0]:
            return Evaluation(params, origin, used, f"failed_test:{s}")
    ok, err = check(w, params, on_target)
    if not ok:
        return Evaluation(params, origin, used, "failed_numerics", err)
    return Evaluation(params, origin, used, "passed", err, float(t))


def _tests_text() -> str:
    import inspect

    return inspect.getsource(checks)


def platform_note() -> str:
    dev = jax.devices()[0]
    return f"{dev.platform}:{dev.device_kind}"


