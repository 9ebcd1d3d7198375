"""What every launcher writes: config.json, results.json (with claims and regime), report.md.

All writes go through :mod:`lab.atomic` (a temporary file in the same directory,
fsynced, then ``os.replace``), so an interrupted run never leaves a half-written
file that a later run would trust; ``atomic_write_bytes`` / ``atomic_write_text``
are its ``write_bytes`` / ``write_text`` under their earlier names.

``results.json`` carries a ``claims`` list: one entry per headline claim of the
paper the experiment tests, ``{"claim", "metric", "measured", "holds"}``, decided
by a rule in the experiment through :func:`claim`. Beside it an optional
``regime`` list, ``{"check", "measured", "holds"}`` (:func:`regime`): what must be
true of the run for its claims to say anything (the model solves the task at all,
the effect the method exploits is there to exploit). When a regime check fails
the claims are reported, and marked not informative (:func:`regime_holds`).

An experiment with separate parts (e.g. one method on two component types) names a
claim's and a check's ``part``: a check with a part speaks for that part's claims only,
a check without one for every claim (:func:`claim_informative`).

Experiments that train once per seed decide their claims on means over the seeds'
results (:func:`mean_over`, :func:`means_over`).

Numbers in reports print with about three significant digits
(:func:`format_number`); dicts and lists print as compact ``key=value`` text
(:func:`format_value`), never as a JSON dump.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lab import atomic
from lab.atomic import write_bytes as atomic_write_bytes
from lab.atomic import write_text as atomic_write_text

__all__ = [
    "atomic_write_bytes", "atomic_write_text", "claim", "claims_table", "format_number",
    "claim_informative", "format_value", "markdown_table", "mean_over", "means_over", "regime",
    "regime_holds", "regime_verdict",
    "regime_table", "save_figure", "to_jsonable", "write_json", "write_outputs",
]


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
    """Writes ``obj`` (numpy values, NaN and ConfigDicts converted by :func:`to_jsonable`) as
    JSON to ``path`` atomically."""
    atomic.write_json(path, to_jsonable(obj))


def claim(statement: str, metric: str, measured: Any, holds: bool,
          part: str | None = None) -> dict:
    """One entry of ``results["claims"]``; ``holds`` comes from a rule in the experiment;
    ``part``: the part of the experiment it belongs to (None: the experiment as a whole)."""
    out = {"claim": statement, "metric": metric, "measured": to_jsonable(measured),
           "holds": bool(holds)}
    return out if part is None else dict(out, part=part)


def regime(check: str, measured: Any, holds: bool, part: str | None = None) -> dict:
    """One entry of ``results["regime"]``: ``check`` states what must be true of the run
    (thresholds included), ``measured`` the number it was decided on; ``part``: the part
    whose claims it speaks for (None: every claim)."""
    out = {"check": check, "measured": to_jsonable(measured), "holds": bool(holds)}
    return out if part is None else dict(out, part=part)


def regime_holds(results: Mapping[str, Any]) -> bool | None:
    """True when every regime check of ``results`` holds, False when one fails, None when
    the experiment states none (its claims are then unchecked, not uninformative)."""
    checks = results.get("regime") or []
    return all(c["holds"] for c in checks) if checks else None


def claim_informative(results: Mapping[str, Any], claim: Mapping[str, Any]) -> bool | None:
    """Whether the regime checks that speak for ``claim`` hold (those without a part, and
    those of the claim's part): True / False, or None when none does."""
    part = claim.get("part")
    checks = [c for c in results.get("regime") or [] if c.get("part") in (None, part)]
    return all(c["holds"] for c in checks) if checks else None


def regime_verdict(results: Mapping[str, Any]) -> str:
    """One sentence on what the regime checks of ``results`` make of its claims."""
    checks = results.get("regime") or []
    if not checks:
        return "The experiment states no regime checks: its claims are unchecked."
    failed = [c for c in checks if not c["holds"]]
    if not failed:
        return "Every regime check holds: the claims are informative."
    parts = sorted({c.get("part") for c in failed}, key=str)
    if None in parts:
        return ("A regime check fails: the run is outside the regime where the method's "
                "effect can show, so its claims are not informative.")
    names = ", ".join(f"'{p}'" for p in parts)
    return (f"A regime check of the part {names} fails: that part's claims are not "
            "informative; the other claims are (their checks hold).")


def paired_se(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard error of the mean paired difference ``mean(a - b)`` (``a[i]`` and
    ``b[i]`` measured on the same item): ``std(a - b, ddof=1) / sqrt(n)``. Infinite for
    fewer than two pairs, so a claim "the gain exceeds k standard errors" cannot hold on
    one item."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired_se needs two 1-D sequences of one length; got shapes "
                         f"{a.shape} and {b.shape}")
    d = a - b
    return float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")


def mean_over(rows: Sequence[Mapping[str, Any]], *path: str) -> float:
    """The mean over ``rows`` (one results dict per seed) of the number at ``path`` (nested
    keys): ``mean_over(per_seed, "accuracy", "maze")``."""
    if not rows:
        raise ValueError("mean_over needs at least one row")
    values = []
    for row in rows:
        for key in path:
            row = row[key]
        values.append(row)
    return float(np.mean(values))


def means_over(rows: Sequence[Mapping[str, Any]], keys: Iterable[str], *path: str) -> dict:
    """``{key: mean_over(rows, *path, key)}`` for each of ``keys`` (a dict: its keys)."""
    return {key: mean_over(rows, *path, key) for key in keys}


def format_number(value: Any, digits: int = 3) -> str:
    """A number for a report: ints exactly, floats to ``digits`` significant digits.

    Floats from ``10**digits`` up to a million print as whole numbers (``12346``, not
    ``1.23e+04``); others use ``g`` formatting (``0.99``, ``0.000123``, ``1.2e+07``).
    """
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    if 10 ** digits <= abs(v) < 1e6:
        return f"{v:.0f}"
    return format(v, f".{digits}g")


def format_value(value: Any, digits: int = 3) -> str:
    """Any measured value as compact text: numbers by :func:`format_number`, mappings as
    ``key=value`` pairs (nested ones in parentheses), sequences in brackets."""
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return format_number(value, digits)
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if hasattr(value, "to_dict") or hasattr(value, "__array__"):  # ConfigDict, numpy, jax
        value = to_jsonable(value)
        if not isinstance(value, (Mapping, list)):
            return format_value(value, digits)
    if isinstance(value, Mapping):
        def item(v):
            text = format_value(v, digits)
            return f"({text})" if isinstance(v, Mapping) and v else text
        return ", ".join(f"{k}={item(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v, digits) for v in value) + "]"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   floatfmt: str | None = None) -> str:
    """A GitHub markdown table of dict rows (columns default to the first row's keys).

    Floats print with ``floatfmt`` when given (``".3f"``), else with three significant
    digits (:func:`format_number`); dicts and lists compactly (:func:`format_value`);
    ``None`` as an empty cell.
    """
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, (float, np.floating)) and floatfmt and math.isfinite(float(v)):
            text = format(float(v), floatfmt)
        else:
            text = format_value(v)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def claims_table(claims: Sequence[Mapping[str, Any]]) -> str:
    """The claims as a table: holds, claim, metric, measured (rounded, compact)."""
    rows = [{"holds": "yes" if c["holds"] else "no", "claim": _parted(c, "claim"),
             "metric": c["metric"], "measured": format_value(c["measured"])} for c in claims]
    return markdown_table(rows, ["holds", "claim", "metric", "measured"])


def _parted(entry: Mapping[str, Any], key: str) -> str:
    return f"[{entry['part']}] {entry[key]}" if entry.get("part") else entry[key]


def regime_table(checks: Sequence[Mapping[str, Any]]) -> str:
    """The regime checks as a table: holds, check, measured (rounded, compact)."""
    rows = [{"holds": "yes" if c["holds"] else "no", "check": _parted(c, "check"),
             "measured": format_value(c["measured"])} for c in checks]
    return markdown_table(rows, ["holds", "check", "measured"])


def _check_regime(name: str, checks: Any) -> None:
    keys = {"check", "measured", "holds"}
    if not isinstance(checks, (list, tuple)) or not all(
            isinstance(c, Mapping) and set(c) - {"part"} == keys for c in checks):
        raise ValueError(f"results['regime'] of {name!r} is {checks!r}; expected a list of "
                         f"{{'check', 'measured', 'holds'}} entries (lab.outputs.regime)")


def write_outputs(workdir: str, *, name: str, config: Any, results: Mapping[str, Any],
                  report: str, plots: Sequence[str] = ()) -> dict:
    """Writes config.json, results.json and report.md for one experiment.

    Args:
      workdir: output directory (created).
      name: the experiment's name (``"geomem"``), the report's title.
      config: the ConfigDict the run used.
      results: every number the report shows; must contain ``claims`` (a list
        made with :func:`claim`), may contain ``regime`` (a list made with :func:`regime`).
      report: the markdown body (tables, baselines side by side); the claims and
        regime tables and plots are added here.
      plots: PNG file names relative to ``workdir``.

    Returns:
      The results as written (JSON types).
    """
    if "claims" not in results:
        raise ValueError(f"results for {name!r} have no 'claims' list; every experiment "
                         "states the paper claims it tests (lab.outputs.claim)")
    if "regime" in results:
        _check_regime(name, results["regime"])
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    results = to_jsonable(dict(results, plots=list(plots)))
    write_json(os.path.join(workdir, "results.json"), results)
    text = [f"# {name}\n", "## Claims\n", claims_table(results["claims"]), "\n"]
    if results.get("regime"):
        text += ["## Regime\n", regime_table(results["regime"]), "\n",
                 regime_verdict(results), "\n\n"]
    text += [report.rstrip(), "\n"]
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
