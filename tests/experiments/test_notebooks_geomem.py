"""notebooks/geomem.ipynb executes top to bottom at the test preset (outputs stored stripped)."""

import os

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(ROOT, "notebooks", "geomem.ipynb")


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(PATH, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "pip install" in code[0].source and "get_config('test')" in "".join(
        c.source for c in code)


def test_notebook_runs_at_test_preset():
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed")
    nb = nbformat.read(PATH, as_version=4)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + env_path if env_path else "")
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}
                                ).execute()
    finally:
        os.environ["PYTHONPATH"] = env_path
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "results.json" in text and "report.md" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3
