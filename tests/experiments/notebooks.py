"""Shared by the notebook tests: a notebook is stored stripped and runs top to bottom.

CI executes every notebook at the ``test`` preset with nbclient; the kernel imports
Lab from this checkout (PYTHONPATH), so each notebook's guarded install cell is skipped.
"""

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def path(name: str) -> pathlib.Path:
    return ROOT / "notebooks" / name


def check_stripped(name: str) -> list[dict]:
    """Asserts no stored outputs and a first cell that installs Lab; returns the code cells."""
    nb = json.loads(path(name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)
    assert "pip install" in "".join(code[0]["source"])
    return code


def execute(name: str, monkeypatch, timeout: int = 900):
    """Runs the notebook; returns ``(notebook, text)`` with every output's text and data.

    Fails on any error output.
    """
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(str(path(name)), as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path(name).parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") + json.dumps(o.get("data", {})) for o in outputs)
    assert "Traceback" not in text
    return nb, text


def source(code: list[dict]) -> str:
    """The concatenated source of ``code`` cells (as :func:`check_stripped` returns them)."""
    return "".join("".join(c["source"]) for c in code)


def figures(nb) -> int:
    """How many PNG figures an executed notebook's code cells output."""
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    return sum("image/png" in o.get("data", {}) for o in outputs)
