"""Runs every registered experiment at one preset and writes one combined report.

  python -m experiments.reproduce --preset=default --workdir=/tmp/lab_reproduce [--only=geomem,prkv]

An experiment is registered by existing: ``configs/<name>.py`` (with
``get_config``) beside ``experiments/<name>.py`` (with ``run``); nobody edits a
shared list. Each runs with ``get_config(preset)`` into ``workdir/<name>/``
under a progress bar. A failing experiment is logged with its traceback
(``workdir/<name>/error.txt``) and recorded, and the others still run.
``workdir/report.md`` starts with a scoreboard of every claim of every
experiment, then a status table (experiment, status, seconds), then each
experiment's report with its image links rewritten to ``<name>/<png>``;
``workdir/results.json`` summarises the same. The process exits with status 1
when any experiment failed (after writing the report).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Sequence

from absl import app, flags, logging
from tqdm import tqdm

from lab import console
from lab.config import check_preset
from lab.outputs import atomic_write_text, markdown_table, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_EXPERIMENTS = frozenset({"reproduce", "train_lm"})
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def discover(root: str = ROOT) -> list[str]:
    """Names with ``configs/<name>.py`` and an ``experiments/<name>.py`` that defines ``run``."""
    names = []
    for fname in sorted(os.listdir(os.path.join(root, "configs"))):
        name, ext = os.path.splitext(fname)
        if ext != ".py" or name.startswith("_") or name in NOT_EXPERIMENTS:
            continue
        exp = os.path.join(root, "experiments", fname)
        if os.path.exists(exp):
            with open(exp, encoding="utf-8") as f:
                if re.search(r"^def run\(", f.read(), re.M):
                    names.append(name)
    return names


def load(name: str):
    """Returns ``(get_config, run)`` of experiment ``name`` (imports its two modules)."""
    get_config = importlib.import_module(f"configs.{name}").get_config
    run = importlib.import_module(f"experiments.{name}").run
    return get_config, run


def _rewrite(report: str, name: str) -> str:
    """Demotes headings one level and points relative image links into ``name/``."""
    def image(m):
        target = m.group(2)
        if re.match(r"^([a-z]+:|/)", target):
            return m.group(0)
        return f"![{m.group(1)}]({name}/{target})"

    lines = [("#" + line) if line.startswith("#") else line for line in report.splitlines()]
    return _IMAGE.sub(image, "\n".join(lines))


def _measured(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def combined_report(preset: str, entries: Sequence[dict], workdir: str) -> str:
    """The markdown of ``workdir/report.md`` from the per-experiment entries."""
    held = sum(c["holds"] for e in entries for c in e.get("claims", []))
    total = sum(len(e.get("claims", [])) for e in entries)
    out = [f"# Lab reproduction report (preset `{preset}`)\n",
           f"{held} of {total} claims hold; "
           f"{sum(e['status'] == 'ok' for e in entries)} of {len(entries)} experiments ran.\n",
           "## Scoreboard\n"]
    rows = [{"experiment": e["name"], "holds": "yes" if c["holds"] else "no",
             "claim": c["claim"], "metric": c["metric"], "measured": _measured(c["measured"])}
            for e in entries for c in e.get("claims", [])]
    out.append(markdown_table(rows) if rows else "(no claims: no experiment finished)\n")
    out.append("\n## Status\n")
    out.append(markdown_table([{"experiment": e["name"], "status": e["status"],
                                "seconds": round(e["seconds"], 1),
                                "error": e.get("error", "")} for e in entries]))
    for e in entries:
        out.append("\n---\n")
        path = os.path.join(workdir, e["name"], "report.md")
        if e["status"] == "ok" and os.path.exists(path):
            with open(path, encoding="utf-8") as f:  # its "# name" title becomes "## name"
                out.append(_rewrite(f.read(), e["name"]))
        else:
            out.append(f"## {e['name']}\n\nFailed after {e['seconds']:.1f} s: "
                       f"`{e.get('error', '')}` (traceback in `{e['name']}/error.txt`).\n")
    return "\n".join(out) + "\n"


def run_all(preset: str = "default", workdir: str = "/tmp/lab_reproduce",
            only: Sequence[str] | None = None) -> dict:
    """Runs the experiments (all, or those in ``only``) and writes the combined outputs.

    Returns:
      ``{"preset", "experiments": [{"name", "status", "seconds", "claims", "error"?}],
      "claims_held", "claims_total", "failed": [names]}`` (also ``workdir/results.json``).
    """
    preset = check_preset(preset)
    names = discover()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"--only names {unknown} are not registered experiments; "
                             f"registered: {names}")
        names = [n for n in names if n in set(only)]
    os.makedirs(workdir, exist_ok=True)
    entries = []
    bar = tqdm(names, desc=f"reproduce[{preset}]", unit="exp")
    for i, name in enumerate(bar):
        bar.set_postfix_str(name)
        logging.info("reproduce: %s (%d of %d) into %s", name, i + 1, len(names),
                     os.path.join(workdir, name))
        t0 = time.time()
        entry = {"name": name}
        try:
            get_config, run = load(name)
            results = run(get_config(preset), os.path.join(workdir, name))
            entry.update(status="ok", claims=list(results.get("claims", [])))
        except Exception as e:  # keep going: one broken experiment must not hide the others
            tb = traceback.format_exc()
            logging.error("experiment %s failed:\n%s", name, tb)
            atomic_write_text(os.path.join(workdir, name, "error.txt"), tb)
            entry.update(status="failed", claims=[], error=f"{type(e).__name__}: {e}")
        entry["seconds"] = time.time() - t0
        entries.append(entry)
        logging.info("reproduce: %s %s in %.0f s; %d of %d claims hold", name, entry["status"],
                     entry["seconds"], sum(c["holds"] for c in entry["claims"]),
                     len(entry["claims"]))
    summary = {
        "preset": preset,
        "experiments": entries,
        "claims_held": sum(c["holds"] for e in entries for c in e["claims"]),
        "claims_total": sum(len(e["claims"]) for e in entries),
        "failed": [e["name"] for e in entries if e["status"] != "ok"],
    }
    write_json(os.path.join(workdir, "results.json"), summary)
    atomic_write_text(os.path.join(workdir, "report.md"), combined_report(preset, entries, workdir))
    return summary


_PRESET = flags.DEFINE_string("preset", "default", "Preset: test | default | paper.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.", required=True)
_ONLY = flags.DEFINE_list("only", None, "Comma-separated experiment names (default: all).")


def main(argv):
    del argv
    console.quiet_third_party_logs()
    summary = run_all(_PRESET.value, _WORKDIR.value, _ONLY.value)
    logging.info("reproduce: %d of %d claims hold; %s", summary["claims_held"],
                 summary["claims_total"], os.path.join(_WORKDIR.value, "report.md"))
    if summary["failed"]:
        logging.error("failed experiments: %s", summary["failed"])
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
