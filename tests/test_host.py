"""lab.host: with LAB_MALLOC=tuned a jitted call stops page-faulting its large buffers."""

import os
import subprocess
import sys
import textwrap

import pytest

from lab import host

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A jitted x * 2 over 64 MiB (over glibc's largest mmap threshold, 32 MiB): the page faults
# per call, counted over 20 calls after 30 warm-up calls (the tuned heap first grows to hold
# the few buffers whose frees are still in flight, then reuses them).
FAULTS_PER_CALL = textwrap.dedent("""
    import resource
    import lab
    import jax, jax.numpy as jnp
    x = jnp.ones((16, 1024, 1024))
    f = jax.jit(lambda x: x * 2)
    for _ in range(30):
        f(x).block_until_ready()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        f(x).block_until_ready()
    print(lab.MALLOC_TUNED, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 20)
""")
PAGES = 16 * 1024 * 1024 * 4 // 4096  # pages of one output buffer


def faults_per_call(mode: str) -> tuple[bool, float]:
    env = {**os.environ, host.ENV: mode, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_CALL], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="mallopt is glibc's: Linux hosts only")
def test_tuned_malloc_stops_page_faults_on_large_buffers():
    tuned, tuned_faults = faults_per_call("tuned")
    system_tuned, system_faults = faults_per_call("system")
    assert tuned and not system_tuned
    # glibc's default maps every output buffer afresh: about one fault per page per call.
    assert system_faults > 0.9 * PAGES, system_faults
    # Tuned, freed buffers are reused already mapped: measured 0 on an idle host, at most 0.4
    # pages a call under load (a free still in flight when the next call allocates).
    assert tuned_faults < 0.25 * system_faults, (tuned_faults, system_faults)


def test_unknown_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(host.ENV, "fast")
    expected = r"LAB_MALLOC='fast'; expected one of \('system', 'tuned'\)"
    with pytest.raises(ValueError, match=expected):
        host.tune_malloc()


def test_glibcs_defaults_unless_asked(monkeypatch):
    monkeypatch.delenv(host.ENV, raising=False)
    assert host.mode() == "system" and host.tune_malloc() is False
    monkeypatch.setenv(host.ENV, "system")
    assert host.tune_malloc() is False


# Compiles one program under lab.host.use_compile_cache and prints the directory and whether
# JAX's persistent cache answered it (a hit) or XLA compiled it.
COMPILE_ONCE = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from lab import host
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
    directory = host.use_compile_cache()
    jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).block_until_ready()
    print(directory, bool(hits))
""")


def _compile_once(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    out = subprocess.run([sys.executable, "-c", COMPILE_ONCE], capture_output=True, text=True,
                         env=dict(clean, LAB_CACHE=str(tmp_path), **env), cwd=REPO)
    return out


def test_a_second_run_loads_its_compiled_programs_from_the_lab_cache(tmp_path):
    first, second = _compile_once(tmp_path), _compile_once(tmp_path)
    assert first.stdout.split() == [str(tmp_path / "xla"), "False"], first.stderr[-2000:]
    assert second.stdout.split() == [str(tmp_path / "xla"), "True"], second.stderr[-2000:]


def test_the_compile_cache_can_be_turned_off_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv(host.COMPILE_CACHE_ENV, "off")
    assert host.use_compile_cache() is None
    monkeypatch.setenv(host.COMPILE_CACHE_ENV, "yes")
    with pytest.raises(ValueError, match="LAB_COMPILE_CACHE='yes'; expected 'on' or 'off'"):
        host.use_compile_cache()
