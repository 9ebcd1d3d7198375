"""What every launcher writes: config.json, results.json (with claims), report.md, plots.

All writes are atomic (a temporary file in the same directory, fsynced, then
``os.replace``), so an interrupted run never leaves a half-written file that a
later run would trust.

``results.json`` carries a ``claims`` list (DESIGN.md, "Configs, launchers,
outputs"): one entry per headline claim of the paper the experiment tests,
``{"claim", "metric", "measured", "holds"}``, decided by a rule in the
experiment through :func:`claim`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(value: Any) -> Any:
    """Converts numpy/jax scalars and arrays, tuples and mappings to JSON types.

    Non-finite floats become ``None`` (JSON has no NaN), so that the file is
    valid JSON that any reader accepts.
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "to_dict") and callable(value.to_dict):  # ml_collections
        return to_jsonable(value.to_dict())
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
        arr = np.asarray(value)
        return to_jsonable(arr.tolist()) if arr.ndim else to_jsonable(arr.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return to_jsonable(float(value))
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def claim(statement: str, metric: str, measured: Any, holds: bool) -> dict:
    """One entry of ``results["claims"]``; ``holds`` comes from a rule in the experiment."""
    return {
        "claim": statement,
        "metric": metric,
        "measured": to_jsonable(measured),
        "holds": bool(holds),
    }


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   floatfmt: str = ".4g") -> str:
    """A GitHub markdown table of dict rows (columns default to the first row's keys)."""
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())

    def fmt(v):
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt) if math.isfinite(float(v)) else str(v)
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def claims_table(claims: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        {"holds": "yes" if c["holds"] else "no", "claim": c["claim"], "metric": c["metric"],
         "measured": json.dumps(c["measured"]) if not isinstance(c["measured"], (int, float, str))
         else c["measured"]}
        for c in claims
    ]
    return markdown_table(rows, ["holds", "claim", "metric", "measured"])


def write_outputs(workdir: str, *, name: str, config: Any, results: Mapping[str, Any],
                  report: str, plots: Sequence[str] = ()) -> dict:
    """Writes config.json, results.json and report.md for one experiment.

    Args:
      workdir: output directory (created).
      name: the experiment's name (``"geomem"``), the report's title.
      config: the ConfigDict the run used.
      results: every number the report shows; must contain ``claims`` (a list
        made with :func:`claim`).
      report: the markdown body (tables, baselines side by side); the claims
        table and plots are added here.
      plots: PNG file names relative to ``workdir``.

    Returns:
      The results as written (JSON types).
    """
    if "claims" not in results:
        raise ValueError(f"results for {name!r} have no 'claims' list; every experiment "
                         "states the paper claims it tests (lab.outputs.claim)")
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    results = to_jsonable(dict(results, plots=list(plots)))
    write_json(os.path.join(workdir, "results.json"), results)
    text = [f"# {name}\n", "## Claims\n", claims_table(results["claims"]), "\n",
            report.rstrip(), "\n"]
    for p in plots:
        text.append(f"\n![{p}]({p})\n")
    atomic_write_text(os.path.join(workdir, "report.md"), "".join(text))
    return results


def save_figure(fig, workdir: str, filename: str) -> str:
    """Saves a matplotlib figure atomically as PNG in ``workdir``; returns ``filename``."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(os.path.join(workdir, filename), buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return filename
