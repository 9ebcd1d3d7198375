"""The Hawkeye search: propose, test, time, keep the best (Hawkeye, NeurIPS 2026).

For a workload (op, shape, dtype/format) and a target architecture, the
search asks a proposer for candidate kernel configurations, which stack the
taxonomy's strategies, and keeps a candidate only if

1. its parameters are legal for the workload and fit the target (finite cost),
2. every strategy it uses passes its unit test for the target
   (:mod:`kernels_pallas.taxonomy.checks`: interpret-mode correctness and
   lowering everywhere, device-code markers and payoff on that hardware), and
3. it matches the XLA reference numerically: compiled at the workload's shape
   when the process runs on the target, otherwise in interpret mode at a proxy
   shape that keeps its tiles, split-K and grid order (a few tiles, two K
   steps per split), since interpreting the full shape on a CPU would take hours.

Passing candidates are timed by the ``cost`` function and the best is kept.
``budget`` (candidates tried) is the test-time compute knob.
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
    status: str            # passed | invalid | failed_test:<strategy> | failed_numerics
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
        return ("epilogue_fusion",)
    used = ["tiling"]
    if w.dtype != "float32" and w.op == "matmul":
        used.append("mma")
    if params["num_stages"] > 1:
        used.append("pipelining")
    if params["split_k"] > 1:
        used.append("split_k")
    if params["fuse_epilogue"]:
        used.append("epilogue_fusion")
    if params["group_m"] > 1:
        used.append("grid_swizzle")
    if w.op == "scaled_matmul":
        used.append("block_scaled_lowp")
    return tuple(used)


def proxy_workload(w: wl.Workload, params: dict) -> wl.Workload:
    """A small workload that keeps the candidate's structure (a few tiles, two K steps)."""
    s = w.shape
    if w.op in ("matmul", "scaled_matmul"):
        bk = lowp_block(w) or params["block_k"]
        shape = (min(s[0], 2 * params["block_m"]), min(s[1], 2 * params["block_n"]),
                 min(s[2], 2 * bk * params["split_k"]))
    elif w.op == "attention":
        shape = (1, 1, min(s[2], 2 * params["block_q"]), min(s[3], 2 * params["block_k"]), s[4])
    else:
        shape = (min(s[0], 2 * params["block_rows"]), s[1])
    return dataclasses.replace(w, shape=shape)


def legal(w: wl.Workload, params: dict) -> str | None:
    """Why ``params`` cannot run ``w`` (``None`` if they can)."""
    wl.check_params(w.op, params)
    missing = sorted(set(SPACE[w.op]) - set(params))
    if missing:
        return f"missing parameters {missing}"
    if w.op in ("matmul", "scaled_matmul"):
        bk = lowp_block(w) or params["block_k"]
        n_k = math.ceil(w.shape[2] / bk)
        if n_k % params["split_k"]:
            return f"split_k={params['split_k']} does not divide {n_k} K tiles"
    return None


def lowp_block(w: wl.Workload) -> int:
    if w.op != "scaled_matmul":
        return 0
    from kernels_pallas import lowp

    return lowp.get_format(w.dtype).block


def default_unit_test(strategy: str, target: str, on_target: bool) -> tuple[bool, str]:
    """The taxonomy's test of ``strategy`` on ``target`` (hardware part only on the target)."""
    s = strat.get(strategy)
    if not s.supported(target):
        return False, f"{target} has no {strategy}"
    results = [checks.check_interpret(s, target), checks.check_lowering(s, target)]
    if on_target:
        results += checks.check_hardware(s, target)
    bad = [r for r in results if r.status == "fail"]
    return (not bad), "; ".join(r.detail for r in bad)


def numerical_check(w: wl.Workload, params: dict, on_target: bool) -> tuple[bool, float]:
    """Compiled at full shape on the target; interpret mode at the proxy shape elsewhere."""
    if on_target:
        args = wl.make_inputs(w)
        err = wl.max_rel_error(wl.run_kernel(w, params, args, interpret=False),
                               wl.run_reference(w, args))
        return err <= wl.tolerance(w), err
    return wl.check(proxy_workload(w, params), params)


def validate_target(w: wl.Workload, target: str) -> None:
    """``ValueError`` for an unknown target or a format the target cannot run."""
    arch_mod.get(target)
    w.validate()
    if w.dtype not in FORMAT_SUPPORT[target]:
        raise ValueError(f"dtype/format {w.dtype!r} is not supported on {target}; supported: "
                         f"{list(FORMAT_SUPPORT[target])}")


def search(w: wl.Workload, target: str, *, budget: int = 32, cost=None,
           proposer: Proposer | None = None, batch: int = 4, seed: int = 0,
           unit_test: Callable[[str, str, bool], tuple[bool, str]] | None = None,
           check: Callable[[wl.Workload, dict, bool], tuple[bool, float]] | None = None,
           ) -> SearchResult:
    """Searches kernel configurations for ``w`` on ``target`` (module docstring).

    Args:
      w: the workload. target: one of ``kernels_pallas.taxonomy.NAMES``.
      budget: the number of candidates tried (the test-time compute knob).
      cost: ``cost(w, params) -> seconds``, optionally with ``kind`` and ``baseline(w)``;
        :class:`MeasuredCost` on the target, :class:`RooflineCost` elsewhere.
      proposer: a :class:`Proposer`; systematic then evolutionary by default.
      unit_test, check: the strategy unit test and numerical check (defaults:
        the taxonomy's checks and :func:`numerical_check`).

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
    context = Context(w, target, SPACE[w.op], START[w.op], strat.describe(),
                      _tests_text())
    history: list[Evaluation] = []
    test_cache: dict[str, tuple[bool, str]] = {}
    seen = set()
    while len(history) < budget:
        proposals = proposer.propose(context, history, min(batch, budget - len(history)))
        fresh = [p for p in proposals if tuple(sorted(p.items())) not in seen]
        if not fresh:
            break
        for params in fresh:
            seen.add(tuple(sorted(params.items())))
            history.append(_evaluate(w, target, params, cost, unit_test, check, on_target,
                                     test_cache, type(proposer).__name__))
            if len(history) >= budget:
                break
    baseline = getattr(cost, "baseline", None)
    return SearchResult(w, target, getattr(cost, "kind", "custom"), history,
                        baseline(w) if baseline else None, cost(w, START[w.op]))


def _evaluate(w, target, params, cost, unit_test, check, on_target, cache, origin):
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
    for s in used:
        if s not in cache:
            cache[s] = unit_test(s, target, on_target)
        if not cache[s][0]:
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


