"""The benchmark scripts start as documented (``python benchmarks/<name>.py``)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("stem", SCRIPTS)
def test_no_benchmark_script_shadows_an_installed_module(stem):
    # `python benchmarks/x.py` puts benchmarks/ first on sys.path, so a script named like an
    # installed top-level module replaces it for every import in that process
    # (benchmarks/kernels.py hid Hugging Face's `kernels`, which transformers imports).
    found = importlib.util.find_spec(stem)
    assert found is None, f"benchmarks/{stem}.py shadows the installed {stem!r} ({found.origin})"


def test_the_decode_benchmark_imports_its_references():
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, "benchmarks/decode.py", "--help"],
                          cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout
