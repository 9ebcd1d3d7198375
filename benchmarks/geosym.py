"""GeoSym throughput and solver exactness.

Generates ``--n`` problems (sample a construction, solve a question exactly,
render the figure at ``--size`` pixels) on ``--workers`` processes, after a
short warm-up so that process start and imports are not timed, and prints:

- problems per second for generate + solve + render (and with rendering off);
- the solver's exactness rate: of the candidate questions the solver finished,
  the share whose exact answer matched the float evaluation of the
  construction within 1e-9 relative (the others are dropped, never emitted);
  timeouts and degenerate constructions (rejected and redrawn) are counted
  beside it;
- the largest relative error between an emitted exact answer and its float
  evaluation, recomputed here from the records;
- the exactness rate over every candidate quantity (up to 12 per question type)
  of ``--all-candidates`` constructions, not only the one each problem asks.

    python benchmarks/geosym.py [--n 200] [--workers 2] [--size 1024] [--all-candidates 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sympy as sp  # noqa: E402

from lab.methods import geosym  # noqa: E402


def run(n: int, workers: int, size: int, dpi: int, render: bool, seed: int = 0) -> dict:
    config = geosym.GenConfig(image_size=size, dpi=dpi, render=render)
    geosym.generate(max(2, workers), seed=seed + 999, config=config, workers=workers)  # warm-up
    t0 = time.perf_counter()
    records, stats = geosym.generate(n, seed=seed, config=config, workers=workers)
    wall = time.perf_counter() - t0
    worst = 0.0
    for r in records:
        exact = complex(sp.N(geosym.parse(r["answer"]), 30)).real
        worst = max(worst, abs(exact - r["value"]) / abs(r["value"]))
    finished = stats.problems + stats.inexact + stats.unverified
    return {"n": len(records), "wall_s": wall, "per_s": len(records) / wall,
            "exactness": (finished - stats.inexact - stats.unverified) / max(1, finished),
            "candidates_solved": finished, "inexact": stats.inexact,
            "timeouts": stats.timeouts, "degenerate_rejected": stats.degenerate,
            "no_question": stats.no_question, "max_rel_error": worst,
            "strata": geosym.strata_counts(records)}


def _all_candidates(seed: int) -> tuple[int, int, int, int]:
    """Solve every candidate quantity of one construction: (exact, inexact, timeout, skipped)."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    c = geosym.sample(rng, rng.randint(0, 4))
    ok = bad = slow = skipped = 0
    for qs in geosym.candidates(c).values():
        for q in qs[:12]:
            try:
                geosym.solve(c, q, timeout=2.0)
                ok += 1
            except geosym.Inexact:
                bad += 1
            except geosym.SolverTimeout:
                slow += 1
            except geosym.Unsuitable:
                skipped += 1
    return ok, bad, slow, skipped


def exactness_all(n: int, workers: int, seed: int = 7) -> dict:
    """The solver on every candidate quantity (up to 12 per type) of ``n`` constructions."""
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    seeds = [seed * 1_000_003 + i for i in range(n)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        res = list(pool.map(_all_candidates, seeds, chunksize=4))
    ok, bad, slow, skipped = (sum(r[i] for r in res) for i in range(4))
    return {"constructions": n, "exact": ok, "inexact": bad, "timeouts": slow,
            "unsuitable": skipped, "exactness": ok / max(1, ok + bad)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--dpi", type=int, default=128)
    p.add_argument("--all-candidates", type=int, default=60,
                   help="constructions whose every candidate quantity is solved")
    args = p.parse_args(argv)
    out = {}
    for render in (True, False):
        r = run(args.n, args.workers, args.size, args.dpi, render)
        out["render" if render else "no_render"] = r
        what = f"generate + solve + render ({args.size}px)" if render else "generate + solve"
        print(f"{what}: {r['per_s']:.2f} problems/s on {args.workers} processes "
              f"({r['n']} problems in {r['wall_s']:.1f} s)")
    r = out["render"]
    print(f"solver exactness: {r['exactness']:.4f} of {r['candidates_solved']} solved candidates "
          f"(exact == float within 1e-9; {r['inexact']} inexact dropped); "
          f"{r['timeouts']} timeouts dropped; {r['degenerate_rejected']} degenerate draws "
          f"rejected; max relative error of emitted answers {r['max_rel_error']:.2e}")
    print(f"strata: {r['strata']}")
    a = exactness_all(args.all_candidates, args.workers)
    out["all_candidates"] = a
    print(f"solver on every candidate quantity of {a['constructions']} constructions: "
          f"exactness {a['exactness']:.4f} ({a['exact']} exact == float, {a['inexact']} "
          f"disagreed, {a['timeouts']} timed out, {a['unsuitable']} not askable)")
    return out


if __name__ == "__main__":
    main()
