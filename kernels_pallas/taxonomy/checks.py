"""The per-architecture unit test of a strategy, and its parts.

1. :func:`unit_test`: strategy ``s``'s test on target ``arch`` applied to one kernel (a
   search candidate or the strategy's example): the kernel lowered for the target's
   platform (``cuda`` / ``rocm``) from this host, its :class:`KernelFacts` (backend,
   Triton grid and compiler parameters, Mosaic GPU ops, StableHLO around the call, the
   strategy's ``lowering_markers``) and its parameters checked against the target's
   :class:`~kernels_pallas.taxonomy.arch.Hardware`. Structural, not a run.
   :func:`check_lowering` applies it to the example (must pass), :func:`check_without` to
   the unoptimised baseline (must fail).
2. :func:`check_interpret`: the arch's expert example runs in Pallas interpret
   mode (any host) and matches the XLA reference within the workload tolerance.
3. :func:`check_expert_interpret`: where the record names a Mosaic GPU expert
   kernel (TMA, warp specialisation), that kernel in JAX's GPU interpreter.
4. :func:`check_hardware`: only on that hardware: the compiled device code (PTX
   or AMDGCN, dumped by XLA/Mosaic in a subprocess) holds the arch's
   ``device_markers`` and the example beats the unoptimised baseline
   (median wall time, ``min_speedup``).

Each returns a :class:`CheckResult`; ``status`` is ``"pass"``, ``"fail"`` or
``"skip"`` with the reason. Nothing is reported as passed that did not run.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os
import subprocess
import sys
import tempfile
import time

import jax

from kernels_pallas.taxonomy import arch as arch_mod
from kernels_pallas.taxonomy import workloads as wl
from kernels_pallas.taxonomy.strategies import BY_NAME, MM_SMALL, Strategy, get, workload_for


@dataclasses.dataclass(frozen=True)
class CheckResult:
    strategy: str
    arch: str
    part: str        # interpret | lowering | hardware
    status: str      # pass | fail | skip
    detail: str
    value: float | None = None


def _result(s, a, part, ok, detail, value=None):
    return CheckResult(s.name, a, part, "pass" if ok else "fail", detail, value)


def _skip(s, a, part, reason):
    return CheckResult(s.name, a, part, "skip", reason)


def check_interpret(s: Strategy, arch: str, seed: int = 0,
                    params: dict | None = None) -> CheckResult:
    """Correctness of ``s``'s example (or ``params``) for ``arch`` in interpret mode."""
    arch_mod.get(arch)
    if not s.supported(arch):
        return _skip(s, arch, "interpret", f"{arch} has no {s.name} feature ({s.notes})")
    w = workload_for(s, arch, "interpret")
    params = s.params[arch] if params is None else params
    try:
        ok, err = wl.check(w, params, seed)
    except NotImplementedError as e:   # JAX's GPU interpreter lacks Blackwell's tensor memory
        return _skip(s, arch, "interpret", f"the host's interpreter cannot run it: {e}")
    return _result(s, arch, "interpret", ok,
                   f"max rel err {err:.2e} (tol {wl.tolerance(w, params):g})", err)


@functools.lru_cache(maxsize=4)
def _expert_error(path: str) -> float:
    """Runs JAX's expert Mosaic GPU matmul under GPU interpret mode; max relative error."""
    import importlib
    from unittest import mock

    import jax.numpy as jnp
    from jax._src.pallas.mosaic_gpu.interpret.params import force_gpu_interpret_mode

    module = importlib.import_module(path.rsplit(".", 1)[0])
    a = jax.random.uniform(jax.random.key(0), (128, 64), jnp.float16)
    b = jax.random.uniform(jax.random.key(1), (64, 128), jnp.float16)
    ref = a.astype(jnp.float32) @ b.astype(jnp.float32)
    if path.endswith("hopper_matmul_mgpu.matmul"):
        cfg = module.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2,
                                  epi_tile_n=None, epi_tile_m=None)
        # one SM: the persistent grid's size would be read from a GPU this host lacks
        with mock.patch.object(module, "get_num_sms", lambda: 1), force_gpu_interpret_mode():
            out = module.matmul(a, b, None, cfg)
    else:
        cfg = module.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2,
                                  collective=False)
        with force_gpu_interpret_mode():
            out = module.matmul_kernel(a, b, cfg)
    return float(jnp.abs(out.astype(jnp.float32) - ref).max() / jnp.abs(ref).max())


def check_expert_interpret(s: Strategy, arch: str) -> CheckResult:
    """The arch's expert Mosaic GPU kernel (``hardware_example``) in GPU interpret mode.

    JAX's GPU interpreter simulates shared memory, barriers, TMA copies and the
    warpgroups, so the TMA / warp-specialised Hopper kernel is checked on a CPU;
    Blackwell's tensor memory (TMEM) is not simulated by jax 0.10, so that
    check reports the interpreter's refusal as a skip.
    """
    arch_mod.get(arch)
    path = s.hardware_example.get(arch)
    if path is None:
        return _skip(s, arch, "expert_interpret", f"no Mosaic GPU expert kernel for {arch}")
    try:
        err = _expert_error(path)
    except NotImplementedError as e:
        return _skip(s, arch, "expert_interpret", f"GPU interpreter: {e}")
    # float16 output: half an ulp of fp16 relative to the largest entry is 2^-11
    return _result(s, arch, "expert_interpret", err <= 2.0**-10,
                   f"{path.rsplit('.', 2)[-2]} in GPU interpret mode: max rel err {err:.2e}", err)


@functools.lru_cache(maxsize=128)
def lowered_text(w: wl.Workload, params_items: tuple, platform: str) -> str:
    """The StableHLO module of the candidate lowered for ``platform`` via the Triton backend."""
    args = wl.make_inputs(w)
    fn = functools.partial(wl.run_kernel, w, dict(params_items), interpret=False, triton=True)
    return jax.jit(fn).trace(args).lower(lowering_platforms=(platform,)).as_text()


def check_lowering(s: Strategy, arch: str, params: dict | None = None) -> CheckResult:
    """The unit test (:func:`unit_test`, lowered for ``arch``'s platform) on the strategy's
    example for ``arch`` (or on ``params`` at the example's workload)."""
    arch_mod.get(arch)
    if not s.supported(arch):
        return _skip(s, arch, "lowering", f"{arch} has no {s.name} feature")
    r = unit_test(s, arch, workload_for(s, arch, "interpret"),
                  s.params[arch] if params is None else params)
    return dataclasses.replace(r, part="lowering")


def check_without(s: Strategy, arch: str) -> CheckResult:
    """The negative case of the unit test: the unoptimised baseline (the example without the
    strategy) must fail ``s``'s test on ``arch``; ``pass`` here means the test caught it."""
    arch_mod.get(arch)
    if not s.supported(arch):
        return _skip(s, arch, "without", f"{arch} has no {s.name} feature")
    w = workload_for(s, arch, "interpret")
    if s.name == "mma":   # the baseline is the same tiles on float32 operands
        w = dataclasses.replace(w, dtype="float32")
    if s.name == "block_scaled_lowp":   # the baseline is the unscaled bf16 matmul
        w = MM_SMALL
    r = unit_test(s, arch, w, s.baseline)
    caught = r.status == "fail"
    return _result(s, arch, "without", caught, ("baseline fails: " if caught else
                                                "baseline PASSES: ") + r.detail)


_DUMP_SCRIPT = """
import json, sys
import jax
from kernels_pallas.taxonomy import checks, workloads as wl
spec, params = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if "expert" in params:
    fn = checks.expert_callable(params["expert"], *spec["shape"])
else:
    w = wl.Workload(**spec)
    args = wl.make_inputs(w)
    fn = lambda: wl.run_kernel(w, params, args, interpret=False)
jax.block_until_ready(fn())
"""


def expert_callable(path: str, m: int, n: int, k: int):
    """A no-argument function running JAX's expert Mosaic GPU matmul on bf16 ``[m,k] @ [k,n]``
    with the tile settings of the kernel's own tuning loop (compiled, on the device)."""
    import importlib

    import jax.numpy as jnp

    module = importlib.import_module(path.rsplit(".", 1)[0])
    a = jax.random.uniform(jax.random.key(0), (m, k), jnp.bfloat16, -1, 1)
    b = jax.random.uniform(jax.random.key(1), (k, n), jnp.bfloat16, -1, 1)
    if path.endswith("hopper_matmul_mgpu.matmul"):
        cfg = module.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                  epi_tile_n=64, epi_tile_m=64, grid_tile_width=4)
        fn = jax.jit(lambda a, b: module.matmul(a, b, None, cfg))
    else:
        cfg = module.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                  collective=False, epilogue_tile_n=32, grid_tile_width=4)
        fn = jax.jit(lambda a, b: module.matmul_kernel(a, b, cfg))
    return lambda: fn(a, b)


def device_code(w: wl.Workload, params: dict) -> str:
    """Compiles the candidate (or ``{"expert": path}``) in a subprocess with XLA and Mosaic GPU
    dumps on; returns the PTX/AMDGCN/MLIR text found (not exercised without a GPU)."""
    import json

    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={d} " + os.environ.get("XLA_FLAGS", ""),
                   MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=d)
        spec = json.dumps(dict(op=w.op, shape=list(w.shape), dtype=w.dtype, scaling=w.scaling))
        proc = subprocess.run([sys.executable, "-c", _DUMP_SCRIPT, spec, json.dumps(params)],
                              env=env, capture_output=True, text=True, timeout=600)
        texts = [proc.stdout, proc.stderr]
        for pattern in ("*.ptx", "*.s", "*.amdgcn", "*.ll", "*.mlir"):
            for f in glob.glob(os.path.join(d, "**", pattern), recursive=True):
                with open(f, errors="replace") as fh:
                    texts.append(fh.read())
        return "\n".join(texts)


def _median_time(fn, repeats: int = 7) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def check_hardware(s: Strategy, arch: str, min_speedup: float = 1.05) -> list[CheckResult]:
    """On ``arch`` hardware only: device markers present, and a speedup over the baseline.

    Where the record names a Mosaic GPU ``hardware_example`` for ``arch`` (TMA,
    warp specialisation), that expert kernel is the one whose code is inspected
    and timed against the unoptimised portable kernel on the same bf16 matmul.
    """
    if not s.supported(arch):
        return [_skip(s, arch, "hardware", f"{arch} has no {s.name} feature")]
    reason = arch_mod.skip_reason(arch)
    if reason:
        return [_skip(s, arch, "hardware", reason)]
    w = workload_for(s, arch, "hardware")
    params, out = s.params[arch], []
    expert = s.hardware_example.get(arch)
    markers = s.device_markers.get(arch, ())
    if markers:
        code = device_code(w, {"expert": expert} if expert else params)
        missing = [m for m in markers if m not in code]
        out.append(_result(s, arch, "hardware", not missing,
                           f"device code markers missing: {missing}" if missing
                           else f"device code holds {list(markers)}"))
    args = wl.make_inputs(w)
    base_w = w if s.name != "mma" else dataclasses.replace(w, dtype="float32")
    base_args = args if base_w is w else wl.make_inputs(base_w)
    t_opt = _median_time(expert_callable(expert, *w.shape) if expert
                         else lambda: wl.run_kernel(w, params, args, interpret=False))
    t_base = _median_time(lambda: wl.run_kernel(base_w, s.baseline, base_args, interpret=False))
    speedup = t_base / t_opt
    out.append(_result(s, arch, "hardware", speedup >= min_speedup,
                       f"speedup over the unoptimised kernel {speedup:.2f}x "
                       f"({t_base * 1e3:.3f} ms -> {t_opt * 1e3:.3f} ms)", speedup))
    return out


def run_all(names=None, archs=None,
            parts=("interpret", "lowering", "expert_interpret", "hardware")):
    """Every (strategy, arch) check; returns a list of :class:`CheckResult`."""
    results = []
    for name in names or list(BY_NAME):
        s = get(name)
        for a in archs or arch_mod.NAMES:
            if "interpret" in parts:
                results.append(check_interpret(s, a))
            if "lowering" in parts:
                results.append(check_lowering(s, a))
            if "expert_interpret" in parts and s.hardware_example:
                results.append(check_expert_interpret(s, a))
            if "hardware" in parts:
                results.extend(check_hardware(s, a))
    return results


# ----------------------------------------------------------------------------- candidate tests
#
# A strategy's unit test for a target, applied to one kernel (a candidate of the search or a
# strategy's expert example): the kernel is lowered for the target's platform from this host
# and the facts of the lowered module (which backend's custom call, its grid, the Triton
# compiler parameters that reached it, the ops in the Mosaic GPU module, separate XLA ops
# around the kernel) are checked against the target's :class:`~.arch.Hardware` facts.
# Triton's lowering is the same text for cuda and rocm, so it is the rules that differ per
# target (MMA tile multiples, warpgroups, shared memory, pipelining depths, SM counts, which
# backends compile there, TMA), and a strategy the target lacks fails there.


def _unescape(raw: str) -> bytes:
    """An MLIR string attribute (``\\XX`` hex escapes) as bytes."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == "\\":
            if raw[i + 1] in '\\"':
                out += raw[i + 1].encode()
                i += 2
            else:
                out.append(int(raw[i + 1:i + 3], 16))
                i += 3
        else:
            out += raw[i].encode()
            i += 1
    return bytes(out)


@dataclasses.dataclass(frozen=True)
class KernelFacts:
    """What the lowered module of a kernel shows (``kernel_facts``)."""

    backend: str                   # triton | mosaic | none
    grid: tuple[int, ...]          # Triton launch grid (empty for Mosaic GPU)
    num_stages: int | None         # Triton compiler parameters found in the module
    num_warps: int | None
    device_ops: str                # the kernel's own IR (Triton or Mosaic GPU bytecode), text
    outside: str                   # the StableHLO around the kernel call
    module: str = ""               # the whole lowered module as text


@functools.lru_cache(maxsize=512)
def _facts(w: wl.Workload, params_items: tuple, platform: str) -> KernelFacts:
    import re

    text = lowered_text(w, params_items, platform)
    backend = ("triton" if "xla.gpu.triton" in text else
               "mosaic" if "@mosaic_gpu" in text else "none")
    grid = tuple(int(g) for g in re.findall(r"grid_[xyz] = (\d+)", text))
    num = {k: (int(v[0]) if v else None)
           for k in ("num_stages", "num_warps")
           for v in [re.findall(rf"{k} = (\d+)", text)]}
    blobs = re.findall(r'(?:ir|module) = "((?:[^"\\]|\\.)*)"', text)
    device = b"\n".join(_unescape(b) for b in blobs).decode("latin-1")
    outside = re.sub(r'(?:ir|module) = "(?:[^"\\]|\\.)*"', "", text)
    return KernelFacts(backend, grid, num["num_stages"], num["num_warps"], device, outside, text)


def kernel_facts(w: wl.Workload, params: dict, platform: str) -> KernelFacts:
    """The :class:`KernelFacts` of the kernel ``params`` for ``w`` lowered for ``platform``."""
    return _facts(w, tuple(sorted(params.items())), platform)


_MOSAIC_OPS = {  # what the Mosaic GPU module must hold, per target and strategy
    ("hopper", "mma"): ("nvvm.wgmma",), ("blackwell", "mma"): ("tcgen05.mma",),
    ("hopper", "pipelining"): ("mbarrier.try_wait",),
    ("blackwell", "pipelining"): ("mbarrier.try_wait",),
    ("hopper", "bulk_copy"): ("cp.async.bulk.tensor.shared.cluster.global",),
    ("blackwell", "bulk_copy"): ("cp.async.bulk.tensor.shared.cluster",),
    # Hopper: producer/consumer warpgroups re-balance registers with setmaxnreg; Blackwell's
    # kernel gives a TMA warp and an MMA warp their roles and the MMA warp hands each tile
    # to the epilogue warpgroup through tcgen05.commit on an mbarrier (no setmaxnreg there)
    ("hopper", "warp_specialization"): ("nvvm.setmaxregister",),
    ("blackwell", "warp_specialization"): ("nvvm.tcgen05.commit", "mbarrier.try_wait"),
}


def _bytes_of(w: wl.Workload) -> float:
    return {"float32": 4, "bfloat16": 2, "float8_e4m3fn": 1, "bf16": 2, "fp8_e4m3": 1,
            "fp8_e5m2": 1, "mxfp4": 0.5, "nvfp4": 0.5}[w.dtype]


def _rule(name: str, arch: str, w: wl.Workload, p: dict, f: KernelFacts | None,
          pw: wl.Workload | None = None) -> list[str]:
    """Violations of strategy ``name``'s test on ``arch`` by kernel ``p`` for ``w`` (empty =
    passes); ``f`` are the facts of the kernel lowered at the proxy workload ``pw``."""
    hw = arch_mod.hardware(arch)
    bad: list[str] = []
    mm_op = w.op in ("matmul", "scaled_matmul")
    backend = p.get("backend", "triton") if mm_op else "triton"
    if backend not in hw.backends:
        return [f"backend={backend!r} does not compile for {arch} (it has {hw.backends})"]
    mosaic = backend != "triton"
    if f is not None and f.backend != ("mosaic" if mosaic else "triton"):
        bad.append(f"lowered module holds a {f.backend} kernel, not {backend}")
    want_ops = _MOSAIC_OPS.get((arch, name), ()) if mosaic else ()
    if f is not None and want_ops:
        missing = [o for o in want_ops if o not in f.device_ops]
        if missing:
            bad.append(f"Mosaic GPU module lacks {missing}")
    if mm_op:
        cfg = wl.matmul_config(p)
        tm, tn = cfg.cta_tile()
        bk = wl.lowp_block(w) or p["block_k"]
        stages = max(p["num_stages"], 1)
        smem = (tm * bk + bk * tn) * max(_bytes_of(w), 1) * stages
        n_tiles = math.ceil(w.shape[0] / tm) * math.ceil(w.shape[1] / tn)
        pw = pw or w
        proxy_tiles = math.ceil(pw.shape[0] / tm) * math.ceil(pw.shape[1] / tn)
    if name == "tiling":
        if w.op == "rmsnorm":
            rows, d = w.shape
            if 3 * p["block_rows"] * d * _bytes_of(w) > hw.smem_kb * 1024:
                bad.append(f"block_rows={p['block_rows']} rows exceed {hw.smem_kb} KB")
            if p["block_rows"] < 2:
                bad.append("block_rows=1: one row per program, no tile")
            if f is not None and f.grid and f.grid[0] != math.ceil((pw or w).shape[0]
                                                                    / p["block_rows"]):
                bad.append(f"lowered grid {f.grid} is not one program per row block")
            return bad
        if tm * tn < 64 * 64:
            bad.append(f"CTA tile {tm}x{tn} < 64x64: operands re-read from HBM per small tile")
        if smem > hw.smem_kb * 1024:
            bad.append(f"tiles x stages need {smem / 1024:.0f} KB > {hw.smem_kb} KB on {arch}")
        if f is not None and not mosaic and f.grid and f.grid[0] != proxy_tiles:
            bad.append(f"lowered grid {f.grid} does not hold the {proxy_tiles} output tiles")
    elif name == "mma":
        mt = hw.mma_tile
        if w.dtype not in hw.mma_dtypes:
            bad.append(f"{w.dtype} operands do not feed {arch}'s MMA ({hw.mma_dtypes})")
        if p["block_m"] % mt[0] or p["block_n"] % mt[1] or bk % mt[2]:
            bad.append(f"tile {p['block_m']}x{p['block_n']}x{bk} is not a multiple of {arch}'s "
                       f"MMA shape {mt[0]}x{mt[1]}x{mt[2]}")
        if hw.warpgroup_mma and not mosaic and p["num_warps"] % 4:
            bad.append(f"num_warps={p['num_warps']} is not whole warpgroups")
        if f is not None and not mosaic and DOT_BYTES not in f.device_ops:
            bad.append("the Triton module holds no tt.dot")
    elif name == "pipelining":
        lo, hi = hw.stages
        if not lo <= p["num_stages"] <= hi:
            bad.append(f"num_stages={p['num_stages']} outside {arch}'s pipelined depths {lo}..{hi}")
        if smem > hw.smem_kb * 1024:
            bad.append(f"{stages} stages need {smem / 1024:.0f} KB > {hw.smem_kb} KB")
        if f is not None and not mosaic and f.num_stages != p["num_stages"]:
            bad.append(f"module has num_stages={f.num_stages}, not {p['num_stages']}")
    elif name in ("bulk_copy", "warp_specialization"):
        if not hw.tma:
            return [f"{arch} has no {name} (no TMA engine / warpgroup register reallocation)"]
        if not mosaic:
            bad.append(f"backend='triton': Pallas' Triton path issues no {name.replace('_', ' ')}"
                       f"; expected {hw.backends[1:]}")
    elif name == "split_k":
        if p["split_k"] < 2:
            bad.append("split_k=1")
        if n_tiles >= hw.units:
            bad.append(f"{n_tiles} output tiles already fill {arch}'s {hw.units} SMs/CUs: "
                       "split-K only adds reduction traffic")
        if f is not None and f.grid[1:2] != (p["split_k"],):
            bad.append(f"lowered grid {f.grid} has no split axis of {p['split_k']}")
    elif name == "epilogue_fusion":
        if not p["fuse_epilogue"] or mosaic:
            bad.append("the epilogue runs as separate XLA ops after the kernel")
        if f is not None and "stablehlo.tanh" in f.outside:
            bad.append("the lowered module applies the activation outside the kernel")
    elif name == "block_scaled_lowp":
        if w.op != "scaled_matmul":
            bad.append(f"op {w.op!r} multiplies unscaled operands")
        elif w.dtype not in hw.mma_dtypes:
            bad.append(f"{arch}'s MMA has no native {w.dtype} (it takes {hw.mma_dtypes})")
        if f is not None and w.op == "scaled_matmul" and f"lab_scaled_matmul_{w.dtype}" \
                not in f.outside + f.device_ops:
            bad.append("the lowered module holds no block-scaled kernel")
    elif name == "online_softmax":
        b, h, t, s_len, d = w.shape
        bq, bkv = p["block_q"], p["block_k"]
        if bkv >= s_len:
            bad.append(f"block_k={bkv} >= S={s_len}: the whole key row is held, nothing streams")
        need = (bq * d + 2 * bkv * d) * _bytes_of(w) + bq * bkv * 4
        if need > hw.smem_kb * 1024:
            bad.append(f"query/key/value tiles need {need / 1024:.0f} KB > {hw.smem_kb} KB")
    elif name == "grid_swizzle":
        n_m = math.ceil(w.shape[0] / tm)
        if not 1 < p["group_m"] < n_m:
            bad.append(f"group_m={p['group_m']} with {n_m} tile rows: no grouping")
        panel = (p["group_m"] * tm + tn) * w.shape[2] * _bytes_of(w)
        if panel > hw.l2_mb * 2**20:
            bad.append(f"a group's panels ({panel / 2**20:.1f} MB) exceed {arch}'s "
                       f"{hw.l2_mb} MB L2")
        if f is not None and not mosaic and f.grid and f.grid[0] != proxy_tiles:
            bad.append(f"lowered grid {f.grid} does not hold the {proxy_tiles} output tiles")
    return bad


DOT_BYTES = "\x00dot\x00"


def unit_test(s: Strategy, arch: str, w: wl.Workload, params: dict,
              lower: bool = True) -> CheckResult:
    """Strategy ``s``'s test on target ``arch`` applied to the kernel ``params`` for ``w``.

    Passes when the kernel uses the strategy the way ``arch`` provides it: the rules of
    :func:`_rule` on the parameters and, with ``lower``, on the facts of the kernel lowered
    for ``arch``'s platform at :func:`~.workloads.proxy_workload` (attention is not lowered on
    a host without a GPU: its Triton parameters come from the running device). A strategy
    ``arch`` lacks fails. Numerical correctness is the caller's separate check.
    """
    a = arch_mod.get(arch)
    if not s.supported(arch):
        return CheckResult(s.name, arch, "unit", "fail", f"{arch} has no {s.name} ({s.notes})")
    wl.check_params(w.op, params)
    facts, pw = None, wl.proxy_workload(w, params)
    if lower and w.op != "attention" and params.get("backend", "triton") in \
            arch_mod.hardware(arch).backends:
        try:
            facts = kernel_facts(pw, params, a.platform)
        except Exception as e:  # noqa: BLE001  (any lowering error fails the test, said)
            return _result(s, arch, "unit", False, f"does not lower for {a.platform}: "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    bad = _rule(s.name, arch, w, params, facts, pw)
    if facts is not None and facts.backend == "triton" and w.op == s.interpret_workload.op:
        # the markers are written for the op of the strategy's example (matmuls)
        missing = [m for m in (m.format(**params) for m in s.lowering_markers)
                   if m not in facts.module]
        if missing:
            bad.append(f"the lowered module lacks {missing}")
    return _result(s, arch, "unit", not bad, "; ".join(bad) or
                   f"uses {s.name} as {arch} provides it ({s.support[arch]})")
