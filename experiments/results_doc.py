"""Writes a results page (docs/results.md) from the experiments' ``results.json`` files.

  python -m experiments.results_doc --workdir=/tmp/lab_reproduce --out=docs/results.md \
      --extra=tar=/tmp/tar_vlm

``workdir`` is an :mod:`experiments.reproduce` output directory: one
``<name>/results.json`` (and ``config.json``) per experiment. Per experiment the
page gives the preset it ran at, its regime checks and whether its claims are
informative (:func:`lab.outputs.regime_verdict`), its claims, and its main table:
the experiment module's ``main_table(results)`` when it defines one, else the
first list of row dicts in its results. ``extra`` adds experiments run on their own
(one the main job leaves out, run by its launcher): ``name=directory`` with that run's
``results.json``; their sections say so. Numbers print with three significant
digits. Results of the ``test`` preset (a few prompts on a model trained for a
few steps) say nothing about the papers, so they are refused unless
``allow_test``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping, Sequence

from lab.atomic import write_text
from lab.outputs import (
    claim_informative,
    claims_table,
    markdown_table,
    regime_table,
    regime_verdict,
)


def _load(run_dir: str) -> tuple[dict, str]:
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    preset = "unknown"
    config = os.path.join(run_dir, "config.json")
    if os.path.exists(config):
        with open(config, encoding="utf-8") as f:
            preset = json.load(f).get("preset") or "default"
    return results, preset


def _rows(value) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(r, Mapping) for r in value))


def main_table(name: str, results: Mapping) -> list[dict] | None:
    """The experiment's main table: ``experiments.<name>.main_table(results)`` if that
    function exists, else the first top-level list of row dicts in ``results`` (None
    when there is none)."""
    try:
        module = importlib.import_module(f"experiments.{name}")
    except ImportError:
        module = None
    fn = getattr(module, "main_table", None)
    if callable(fn):
        return fn(results)
    for key, value in results.items():
        if key not in ("claims", "regime") and _rows(value):
            return value
    return None


def section(name: str, results: Mapping, preset: str, *, on_its_own: bool = False) -> str:
    """One experiment's part of the page (``on_its_own``: run by its launcher, not by the
    main job)."""
    claims = results.get("claims", [])
    out = [f"## {name}\n"]
    if on_its_own:
        out.append(f"Run on its own (`python -m experiments.{name}`), outside the main job.\n")
    out.append(f"Preset `{preset}`. {sum(c['holds'] for c in claims)} of "
               f"{len(claims)} claims hold. {regime_verdict(results)}\n")
    if results.get("regime"):
        out += ["### Regime\n", regime_table(results["regime"])]
    out += ["### Claims\n", claims_table(claims) if claims else "(no claims)\n"]
    table = main_table(name, results)
    out += ["### Main table\n", markdown_table(table) if table else
            "(no main table in results.json; see the experiment's report.md)\n"]
    return "\n".join(out)


def render(workdir: str, names: Sequence[str] | None = None, *, allow_test: bool = False,
           extra: Mapping[str, str] | None = None) -> str:
    """The page's markdown for the experiments ``names`` (default: every subdirectory of
    ``workdir`` with a ``results.json``, sorted) and those of ``extra`` (``{name: run
    directory}``, runs of their own; then the sections go in name order)."""
    if names is None:
        names = sorted(n for n in os.listdir(workdir)
                       if os.path.exists(os.path.join(workdir, n, "results.json")))
    extra = dict(extra or {})
    for name, run_dir in extra.items():
        if not os.path.exists(os.path.join(run_dir, "results.json")):
            raise ValueError(f"extra[{name!r}]={run_dir!r} holds no results.json; expected "
                             "the workdir of a run of that experiment's launcher")
    loaded = {n: _load(os.path.join(workdir, n)) for n in names if n not in extra
              and os.path.exists(os.path.join(workdir, n, "results.json"))}
    loaded.update({n: _load(d) for n, d in extra.items()})
    if extra:
        loaded = dict(sorted(loaded.items()))
    if not loaded:
        raise ValueError(f"workdir={workdir!r} holds no <experiment>/results.json; expected an "
                         "experiments.reproduce output directory")
    test = sorted(n for n, (_, preset) in loaded.items() if preset == "test")
    if test and not allow_test:
        raise ValueError(f"{test} ran at preset 'test', whose numbers say nothing about the "
                         "papers; expected runs at 'default' or 'paper' (or allow_test=True)")
    missing = [n for n in names if n not in loaded]
    held = sum(c["holds"] for r, _ in loaded.values() for c in r.get("claims", []))
    total = sum(len(r.get("claims", [])) for r, _ in loaded.values())
    informative = [c for r, _ in loaded.values() for c in r.get("claims", [])
                   if claim_informative(r, c)]
    out = ["# Results\n",
           f"Generated by `python -m experiments.results_doc` from the `results.json` of "
           f"{len(loaded)} experiments. {held} of {total} claims hold; "
           f"{len(informative)} claims are informative (the regime checks that speak for them "
           f"hold), "
           f"{sum(c['holds'] for c in informative)} of them hold.\n"]
    if missing:
        out.append(f"No results for: {', '.join(missing)}.\n")
    out += [section(n, r, preset, on_its_own=n in extra) for n, (r, preset) in loaded.items()]
    return "\n".join(out).rstrip() + "\n"


def write(workdir: str, out: str, names: Sequence[str] | None = None, *,
          allow_test: bool = False, extra: Mapping[str, str] | None = None) -> str:
    """Writes :func:`render`'s page to ``out`` atomically; returns ``out``."""
    write_text(out, render(workdir, names, allow_test=allow_test, extra=extra))
    return out


def _main():
    from absl import app, flags

    workdir = flags.DEFINE_string("workdir", None, "experiments.reproduce output directory.",
                                  required=True)
    out = flags.DEFINE_string("out", "docs/results.md", "The page to write.")
    allow_test = flags.DEFINE_bool("allow_test", False, "Accept test-preset results.")
    extra = flags.DEFINE_list("extra", [], "Runs of their own, name=directory (an experiment "
                              "the main job leaves out, run by its launcher).")

    def main(argv):
        del argv
        runs = {}
        for item in extra.value:
            name, sep, run_dir = item.partition("=")
            if not sep or not name or not run_dir:
                raise app.UsageError(f"--extra={item!r}; expected name=directory")
            runs[name] = run_dir
        print(write(workdir.value, out.value, allow_test=allow_test.value, extra=runs))

    app.run(main)


if __name__ == "__main__":
    _main()
