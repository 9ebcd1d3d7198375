"""The per-architecture unit test of a strategy, in four parts.

1. :func:`check_interpret`: the arch's expert example runs in Pallas interpret
   mode (any host) and matches the XLA reference within the workload tolerance.
2. :func:`check_lowering`: the example lowers for the arch's platform (``cuda``
   or ``rocm``) from this host, through the Triton backend, and the lowered
   module holds the strategy's ``lowering_markers``. Structural, not a run.
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
import os
import subprocess
import sys
import tempfile
import time

import jax

from kernels_pallas.taxonomy import arch as arch_mod
from kernels_pallas.taxonomy import workloads as wl
from kernels_pallas.taxonomy.strategies import BY_NAME, Strategy, get, workload_for


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
    ok, err = wl.check(w, s.params[arch] if params is None else params, seed)
    return _result(s, arch, "interpret", ok, f"max rel err {err:.2e} (tol {wl.tolerance(w):g})",
                   err)


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
    """The example (or ``params``) lowers for ``arch``'s platform and holds the strategy's
    lowering markers."""
    a = arch_mod.get(arch)
    if not s.supported(arch):
        return _skip(s, arch, "lowering", f"{arch} has no {s.name} feature")
    w = workload_for(s, arch, "interpret")
    if w.op == "attention":
        return _skip(s, arch, "lowering", "the attention kernel picks Triton parameters from the "
                     "running platform, so it is lowered on GPU hosts only")
    params = s.params[arch] if params is None else params
    text = lowered_text(w, tuple(sorted(params.items())), a.platform)
    markers = [m.format(**params) for m in s.lowering_markers]
    found = "xla.gpu.triton" in text and all(m in text for m in markers)
    if s.name == "epilogue_fusion":  # the activation must not be a separate XLA op
        found = found and "stablehlo.tanh" not in text
    return _result(s, arch, "lowering", found,
                   f"lowered for {a.platform}: markers {markers} "
                   f"{'present' if found else 'missing'}")


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
