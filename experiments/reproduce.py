"""Runs every registered experiment at one preset and writes one combined report.

  python -m experiments.reproduce --preset=default --workdir=/tmp/lab_reproduce [--only=geomem,prkv]

An experiment is registered by existing: ``configs/<name>.py`` (with
``get_config``) beside ``experiments/<name>.py`` (with ``run``); nobody edits a
shared list. Each runs with ``get_config(preset)`` into ``workdir/<name>/``
under a progress bar. With ``--jobs=N`` (default 2) up to ``N`` experiments run at once,
each in a fresh Python process of its own (its log in ``workdir/<name>.log``, one line
per experiment on the console); code that times the host runs inside
:func:`lab.timing.alone`, during which the other workers are stopped. ``--jobs=1`` runs
them one after another in this process, the compiled programs of each released before the next
(:func:`release_compiled`); ``--retrain`` always does, so that a zoo model several
experiments use is trained once. A failing experiment is logged with its traceback
(``workdir/<name>/error.txt``) and recorded, and the others still run.
``workdir/report.md`` starts with a scoreboard of every claim of every
experiment, each marked informative or not by its run's regime checks
(``results["regime"]``, :func:`lab.outputs.regime`: a claim is not informative when a
check of its run, or of its part of the run, fails, and unchecked when its run states
none; :func:`lab.outputs.claim_informative`), then the
regime checks, a status table (experiment, status, wall, CPU and compile seconds), a
models table (each zoo model an experiment loaded: shipped with Lab, cached on this
host or trained in this run, its stored dtype, its training seconds and the host that
trained it), then each experiment's report with its image links rewritten to
``<name>/<png>``; ``workdir/results.json`` summarises the same, with the run's wall-clock
seconds. An experiment whose module sets ``OUT_OF_MAIN_JOB = "<why>"`` (a model that does
not yet reach its regime in the time the main job allows) is left out of a run without
``--only``, and the report says so with the reason; ``--only=<name>`` still runs it.
Numbers print with three significant digits. With ``--results_doc=docs/results.md`` it
also writes that page (:mod:`experiments.results_doc`). ``--retrain`` trains every zoo
model from scratch (``LAB_ZOO=train``, :mod:`lab.zoo`) instead of using the shipped or
cached weights: the full reproduction, with each model's training time in the models
table. Compiled programs persist in ``$LAB_CACHE/xla`` (:func:`lab.host.use_compile_cache`),
so a rerun on the same host loads them instead of compiling. The process exits with
status 1 when any experiment failed (after writing the report).
"""

from __future__ import annotations

import ast
import gc
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence

import jax
from absl import app, flags, logging
from tqdm import tqdm

from experiments import results_doc
from lab import console, host, timing, zoo
from lab.config import check_preset
from lab.outputs import (
    atomic_write_text,
    claim_informative,
    format_value,
    markdown_table,
    regime_holds,
    write_json,
)

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


def _module_string(source: str, path: str, constant: str) -> str | None:
    """The module-level string ``constant`` of ``source`` (any string expression: one
    literal, or adjacent literals in parentheses), or None when it sets none."""
    for node in ast.parse(source, filename=path).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == constant for t in node.targets):
            why = ast.literal_eval(node.value)
            if not isinstance(why, str) or not why:
                raise ValueError(f"{path}: {constant} = {why!r}; expected a non-empty "
                                 "str giving the reason")
            return why
    return None


def _flagged(names: Sequence[str], root: str, constant: str) -> dict[str, str]:
    out = {}
    for name in names:
        path = os.path.join(root, "experiments", f"{name}.py")
        if not os.path.exists(path):  # registered some other way (the tests' fakes)
            continue
        with open(path, encoding="utf-8") as f:
            why = _module_string(f.read(), path, constant)
        if why:
            out[name] = why
    return out


def left_out(names: Sequence[str], root: str = ROOT) -> dict[str, str]:
    """``{name: why}`` for the experiments among ``names`` whose module sets
    ``OUT_OF_MAIN_JOB`` (read from the source's syntax tree, without importing it)."""
    return _flagged(names, root, "OUT_OF_MAIN_JOB")


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


INFORMATIVE = {True: "yes", False: "no", None: "unchecked"}


def combined_report(preset: str, entries: Sequence[dict], workdir: str,
                    skipped: Mapping[str, str] | None = None, *,
                    seconds: float | None = None, jobs: int = 1) -> str:
    """The markdown of ``workdir/report.md`` from the per-experiment entries (and the
    experiments left out of the run, ``{name: why}``; the run's wall-clock ``seconds``
    and how many experiments ran at once, ``jobs``)."""
    claims = [(e, c) for e in entries for c in e.get("claims", [])]
    held = sum(c["holds"] for _, c in claims)
    by = {k: [c for e, c in claims if claim_informative(e, c) is k] for k in INFORMATIVE}
    out = [f"# Lab reproduction report (preset `{preset}`)\n",
           f"{held} of {len(claims)} claims hold; "
           f"{sum(e['status'] == 'ok' for e in entries)} of {len(entries)} experiments ran"
           + ("" if seconds is None else f" in {seconds / 60:.1f} minutes of wall-clock time"
              f" ({jobs} at a time)") + ".\n",
           f"Informative (the regime checks of their run, or of their part of it, hold): "
           f"{len(by[True])} claims, {sum(c['holds'] for c in by[True])} of them hold. Not "
           f"informative (such a check fails): {len(by[False])}. Unchecked (their experiment "
           f"states no regime): {len(by[None])}.\n",
           "## Scoreboard\n"]
    rows = [{"experiment": e["name"], "holds": "yes" if c["holds"] else "no",
             "informative": INFORMATIVE[claim_informative(e, c)], "claim": c["claim"],
             "metric": c["metric"], "measured": format_value(c["measured"])}
            for e, c in claims]
    out.append(markdown_table(rows) if rows else "(no claims: no experiment finished)\n")
    checks = [{"experiment": e["name"], "holds": "yes" if r["holds"] else "no",
               "check": (f"[{r['part']}] " if r.get("part") else "") + r["check"],
               "measured": format_value(r["measured"])}
              for e in entries for r in e.get("regime", [])]
    out.append("\n## Regime\n")
    out.append(markdown_table(checks) if checks else "(no experiment states regime checks)\n")
    out.append("\n## Status\n")
    out.append(markdown_table([{"experiment": e["name"], "status": e["status"],
                                "seconds": round(e["seconds"], 1),
                                "CPU seconds": _rounded(e.get("cpu_seconds")),
                                "compile seconds": _rounded(e.get("compile_seconds")),
                                "compiles": e.get("compiles", ""),
                                "error": e.get("error", "")} for e in entries]))
    if skipped:
        out.append("\nLeft out of this run (`--only=<name>` runs one):\n")
        out.append("\n".join(f"- `{n}`: {why}" for n, why in skipped.items()) + "\n")
    out.append("\n## Models\n")
    out.append(models_table(entries))
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


def _rounded(seconds: float | None):
    return "" if seconds is None else round(seconds, 1)


SOURCE_WORDS = {"shipped": "shipped with Lab", "cached": "cached on this host",
                "trained": "trained in this run"}


def models_table(entries: Sequence[dict]) -> str:
    """Markdown table of the zoo models each experiment loaded (``entry["models"]``), with
    the total training seconds of this run."""
    rows = [{"experiment": e["name"], "model": m["key"], "source": SOURCE_WORDS[m["source"]],
             "stored": m["stored_dtype"],
             "training seconds": "" if m["train_seconds"] is None else round(m["train_seconds"]),
             "trained on": m["trained_on"] or "not recorded", "note": "; ".join(m["notes"])}
            for e in entries for m in e.get("models", [])]
    if not rows:
        return "(no experiment loaded a zoo model)\n"
    here = {m["key"]: m["train_seconds"] or 0 for e in entries for m in e.get("models", [])
            if m["source"] == "trained"}
    return (markdown_table(rows) + f"\nZoo training in this run: {len(here)} models, "
            f"{sum(here.values()):.0f} s (included in their experiments' seconds above).\n")


def _models_since(start: int) -> list[dict]:
    """The zoo loads since ``start`` (an index into :func:`lab.zoo.loads`), one per key."""
    seen, out = set(), []
    for r in zoo.loads()[start:]:
        if r["key"] not in seen:
            seen.add(r["key"])
            out.append({k: r[k] for k in ("name", "key", "source", "stored_dtype",
                                          "train_seconds", "trained_on", "notes")})
    return out


def release_compiled() -> None:
    """Drops every compiled program (``jax.clear_caches``) and collects the garbage.

    Called after each experiment: XLA's CPU backend maps each compiled executable's
    code into the process, and the programs of a dozen experiments in one process
    passed Linux's default limit of 65,530 mappings (``vm.max_map_count``); the next
    compile then failed with "LLVM compilation error: Cannot allocate memory" and
    the process died. One experiment's programs are not reused by the next."""
    jax.clear_caches()
    gc.collect()


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # XLA compiles a program
_COMPILE = {"seconds": 0.0, "count": 0}  # this process's compiles so far


def _count_compile(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event == BACKEND_COMPILE_EVENT:
        _COMPILE["seconds"] += duration
        _COMPILE["count"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def run_one(name: str, preset: str, workdir: str) -> dict:
    """Runs experiment ``name`` at ``preset`` into ``workdir/<name>`` in this process and
    returns its entry (``{"name", "status", "claims", "regime", "seconds", "cpu_seconds",
    "compile_seconds", "compiles", "models", "informative", "error"?}``): wall seconds, the
    process's CPU seconds (all threads), and the wall seconds and count of XLA compiles
    (JAX's ``backend_compile_duration`` events, loads from the compile cache included); an
    exception is recorded (``error.txt``), not raised."""
    t0, loaded = time.time(), len(zoo.loads())
    cpu0, compiled0 = time.process_time(), dict(_COMPILE)
    entry = {"name": name}
    try:
        get_config, run = load(name)
        results = run(get_config(preset), os.path.join(workdir, name))
        entry.update(status="ok", claims=list(results.get("claims", [])),
                     regime=list(results.get("regime", [])))
    except Exception as e:  # keep going: one broken experiment must not hide the others
        tb = traceback.format_exc()
        logging.error("experiment %s failed:\n%s", name, tb)
        atomic_write_text(os.path.join(workdir, name, "error.txt"), tb)
        entry.update(status="failed", claims=[], regime=[],
                     error=f"{type(e).__name__}: {e}")
    entry["seconds"] = time.time() - t0
    entry["cpu_seconds"] = time.process_time() - cpu0
    entry["compile_seconds"] = _COMPILE["seconds"] - compiled0["seconds"]
    entry["compiles"] = _COMPILE["count"] - compiled0["count"]
    release_compiled()
    entry["models"] = _models_since(loaded)
    entry["informative"] = regime_holds(entry)
    return entry


def _entry_path(workdir: str, name: str) -> str:
    return os.path.join(workdir, name, "entry.json")


def _worker_command(name: str, preset: str, workdir: str) -> list[str]:
    return [sys.executable, "-m", "experiments.reproduce", f"--worker={name}",
            f"--preset={preset}", f"--workdir={workdir}"]


def _collect(name: str, workdir: str, code: int, seconds: float) -> dict:
    """The entry a worker wrote, or a failed one when it died before writing it."""
    try:
        with open(_entry_path(workdir, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        log = os.path.join(workdir, f"{name}.log")
        atomic_write_text(os.path.join(workdir, name, "error.txt"),
                          f"worker process exited with status {code}; its log: {log}\n")
        return {"name": name, "status": "failed", "claims": [], "regime": [],
                "error": f"worker process exited with status {code} (log: {name}.log)",
                "seconds": seconds, "models": [], "informative": None}


def _finished(entry: dict, bar) -> None:
    bar.update(1)
    logging.info("reproduce: %s %s in %.0f s; %d of %d claims hold", entry["name"],
                 entry["status"], entry["seconds"], sum(c["holds"] for c in entry["claims"]),
                 len(entry["claims"]))


def _run_parallel(names: Sequence[str], preset: str, workdir: str, jobs: int,
                  bar) -> dict[str, dict]:
    """Runs each of ``names`` in its own process, up to ``jobs`` at once, and grants their
    :func:`lab.timing.alone` sections (the other workers stopped meanwhile; no worker
    starts during one). Returns ``{name: entry}``."""
    queue, running, done = list(names), {}, {}
    grants = timing.Grants(os.path.join(workdir, ".alone"))
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",  # one accelerator shared
               **grants.env())
    try:
        while queue or running:
            while queue and len(running) < jobs and not grants.held:
                name = queue.pop(0)
                os.makedirs(os.path.join(workdir, name), exist_ok=True)
                if os.path.exists(_entry_path(workdir, name)):
                    os.remove(_entry_path(workdir, name))
                with open(os.path.join(workdir, f"{name}.log"), "w", encoding="utf-8") as log:
                    proc = subprocess.Popen(_worker_command(name, preset, workdir), cwd=ROOT,
                                            env=env, stdout=log, stderr=subprocess.STDOUT)
                running[name] = (proc, time.time())
                logging.info("reproduce: %s started (log %s.log)", name, name)
            time.sleep(timing.POLL_SECONDS)
            for name, (proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                done[name] = _collect(name, workdir, proc.returncode, time.time() - t0)
                bar.set_postfix_str(name)
                _finished(done[name], bar)
            grants.poll([proc.pid for proc, _ in running.values()])
    finally:
        grants.close()
        for proc, _ in running.values():  # interrupted: stop the workers too
            proc.terminate()
        shutil.rmtree(grants.directory, ignore_errors=True)
    return done


def run_all(preset: str = "default", workdir: str = "/tmp/lab_reproduce",
            only: Sequence[str] | None = None, results_doc_path: str = "",
            retrain: bool = False, jobs: int = 1) -> dict:
    """Runs the experiments (all, or those in ``only``) and writes the combined outputs.

    ``results_doc_path`` (when not empty): also write that markdown page from every
    experiment's ``results.json`` (:func:`experiments.results_doc.write`). ``retrain``:
    train every zoo model from scratch (``LAB_ZOO=train`` for the run) instead of loading
    shipped or cached weights. ``jobs``: how many experiments run at once, each in a
    process of its own (1: one after another in this process; ``retrain`` implies 1).

    Returns:
      ``{"preset", "retrain", "jobs", "seconds", "experiments": [{"name", "status",
      "seconds", "claims", "regime", "informative", "models", "error"?}], "claims_held",
      "claims_total", "claims_informative", "claims_informative_held", "failed": [names]}``
      (also ``workdir/results.json``), the experiments in discovery order;
      ``informative`` is True / False / None (regime holds / fails / not stated);
      ``models`` lists the zoo models the experiment loaded and where each came from.
    """
    preset = check_preset(preset)
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}; expected an int >= 1")
    previous = os.environ.get(zoo.SOURCE_ENV)
    if retrain:
        os.environ[zoo.SOURCE_ENV] = "train"
    try:
        return _run_all(preset, os.path.abspath(workdir), only, results_doc_path, retrain,
                        1 if retrain else jobs)
    finally:
        if retrain:
            if previous is None:
                os.environ.pop(zoo.SOURCE_ENV, None)
            else:
                os.environ[zoo.SOURCE_ENV] = previous


def _run_all(preset, workdir, only, results_doc_path, retrain, jobs) -> dict:
    names = discover()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"--only names {unknown} are not registered experiments; "
                             f"registered: {names}")
        names = [n for n in names if n in set(only)]
        skipped = {}
    else:
        skipped = left_out(names)
        names = [n for n in names if n not in skipped]
    os.makedirs(workdir, exist_ok=True)
    t_start, jobs = time.time(), max(1, min(jobs, len(names)))
    bar = tqdm(total=len(names), desc=f"reproduce[{preset}]", unit="exp")
    if jobs > 1:
        done = _run_parallel(names, preset, workdir, jobs, bar)
        entries = [done[n] for n in names]
    else:
        entries = []
        for i, name in enumerate(names):
            bar.set_postfix_str(name)
            logging.info("reproduce: %s (%d of %d) into %s", name, i + 1, len(names),
                         os.path.join(workdir, name))
            entries.append(run_one(name, preset, workdir))
            _finished(entries[-1], bar)
    bar.close()
    summary = {
        "preset": preset,
        "retrain": retrain,
        "jobs": jobs,
        "seconds": time.time() - t_start,
        "experiments": entries,
        "claims_held": sum(c["holds"] for e in entries for c in e["claims"]),
        "claims_total": sum(len(e["claims"]) for e in entries),
        "claims_informative": sum(bool(claim_informative(e, c)) for e in entries
                                  for c in e["claims"]),
        "claims_informative_held": sum(c["holds"] for e in entries for c in e["claims"]
                                       if claim_informative(e, c)),
        "failed": [e["name"] for e in entries if e["status"] != "ok"],
        "left_out": skipped,
    }
    write_json(os.path.join(workdir, "results.json"), summary)
    atomic_write_text(os.path.join(workdir, "report.md"), combined_report(
        preset, entries, workdir, skipped, seconds=summary["seconds"], jobs=jobs))
    if results_doc_path:
        results_doc.write(workdir, results_doc_path, names=[e["name"] for e in entries])
    return summary


_PRESET = flags.DEFINE_string("preset", "default", "Preset: test | default | paper.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.", required=True)
_ONLY = flags.DEFINE_list("only", None, "Comma-separated experiment names (default: all).")
_RESULTS_DOC = flags.DEFINE_string(
    "results_doc", "", "Also write this markdown page (e.g. docs/results.md) from the runs' "
    "results.json files; empty: do not.")
_JOBS = flags.DEFINE_integer(
    "jobs", 2, "How many experiments run at once, each in a process of its own (1: one "
    "after another in this process; --retrain runs them one after another).")
_WORKER = flags.DEFINE_string(
    "worker", None, "Internal: run this one experiment in this process and write its entry "
    "to <workdir>/<name>/entry.json (what --jobs > 1 starts).")
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train every zoo model from scratch (the full reproduction) instead of "
    "using the shipped or cached weights.")


def main(argv):
    del argv
    console.quiet_third_party_logs()
    host.use_compile_cache()  # the workers inherit it: a rerun loads its programs
    if _WORKER.value:
        name = _WORKER.value
        logging.info("reproduce: %s at preset %s into %s", name, _PRESET.value,
                     os.path.join(_WORKDIR.value, name))
        entry = run_one(name, check_preset(_PRESET.value), _WORKDIR.value)
        write_json(_entry_path(_WORKDIR.value, name), entry)
        logging.info("reproduce: %s %s in %.0f s", name, entry["status"], entry["seconds"])
        return
    summary = run_all(_PRESET.value, _WORKDIR.value, _ONLY.value, _RESULTS_DOC.value,
                      retrain=_RETRAIN.value, jobs=_JOBS.value)
    logging.info("reproduce: %d of %d claims hold in %.0f s; %s", summary["claims_held"],
                 summary["claims_total"], summary["seconds"],
                 os.path.join(_WORKDIR.value, "report.md"))
    if summary["failed"]:
        logging.error("failed experiments: %s", summary["failed"])
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
