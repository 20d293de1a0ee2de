"""``kvpipe sweep``: a grid of points in parallel, written as CSV and JSON, resumable.

The grid flags are those of ``simulate`` (list flags also take
``START..STOP/STEP`` ranges here). Points run over ``--jobs`` local processes
or on a Dask cluster (``--dask ADDRESS``); rows land in ``--out DIR`` as
``rows.json`` and ``rows.csv`` with the schema of ``simulate --json``, plus
the ``rows.jsonl`` journal a rerun resumes from. Points inside the compiled
evaluator's envelope (``sim.evaluator``) are evaluated, every token exactly,
and a sample of them re-simulated (``--check``; the summary prints the largest
relative disagreement); the rest run as distinct simulations that extrapolate
their steady tokens (``sim.run.tasks``, ``sim.run.decode``). ``--exact`` simulates
every point and token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpipe.commands.args import UsageError, add_grid_args, points_from_args

CHECK_N = 32  # kvpipe.sweep.CHECK_N (not imported at parser build: it pulls in multiprocessing)


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run a grid of points in parallel into CSV/JSON rows (resumable)")
    add_grid_args(p)
    p.add_argument("--out", metavar="DIR", default="out/sweep",
                   help="output folder (default out/sweep); a rerun into it skips finished points")
    p.add_argument("--jobs", type=int, default=0, help="local worker processes (default: all cores; 1 = this process)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on an existing Dask cluster (needs the 'cluster' extra)")
    p.add_argument("--resume", action="store_true",
                   help="add this grid's points to a folder that holds another grid's sweep (a rerun of the same grid "
                        "resumes without it); rows no kvpipe sweep recorded are never taken")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--check", type=int, default=CHECK_N, metavar="N",
                   help=f"re-simulate at least N of the evaluator's points (the simulator's default path; exact where it "
                        f"differs), plus every point where the best depth or a decline changes between neighbouring "
                        f"contexts, and fail above 1e-9 relative (default {CHECK_N}; 0: no check)")
    p.set_defaults(func=run)


def grid_points(args: argparse.Namespace) -> list[Any]:
    """The grid flags (ranges expanded), as points. Raises UsageError on bad input, and on a delivery schedule other
    than the reference: a sweep's rows are keyed and resumed without one (docs/schedules.md; simulate and validate
    take them)."""
    points = points_from_args(args)
    other = sorted({p.transport.schedule.name for p in points if p.transport.schedule.active})
    if other:
        raise UsageError(f"sweep: schedule {other[0]} not supported (a sweep's rows do not record it); allowed: the "
                         "reference; kvpipe simulate, validate and schedules take --kv-schedule")
    return points


def run(args: argparse.Namespace) -> int:
    from kvpipe.sweep import JOURNAL, ROWS_CSV, ROWS_JSON, max_jobs, run_sweep  # here, not at parser build: multiprocessing
    from sim.evaluator import EvaluatorDisagreement

    if not 0 <= args.jobs <= max_jobs():
        raise UsageError(f"--jobs {args.jobs} out of range; allowed: 0 (all cores) or 1..{max_jobs()}")
    if args.check < 0:
        raise UsageError(f"--check {args.check} out of range; allowed: >= 0 (0 = no check)")
    points = grid_points(args)

    try:
        res = run_sweep(points, out_dir=args.out, jobs=args.jobs or None, dask_address=args.dask, progress=not args.quiet,
                        exact=args.exact, resume=args.resume, check_n=args.check)
    except EvaluatorDisagreement as exc:
        print(f"kvpipe: sample check failed (the rows are written): {exc}", file=sys.stderr)
        return 1
    where = f"{args.out}/{ROWS_JSON}, {args.out}/{ROWS_CSV} (journal {JOURNAL})"
    print(f"swept {len(points)} points: {res.ran} run ({res.evaluated} evaluated, {res.simulations} distinct simulations), "
          f"{res.resumed} already done, {len(res.failed)} failed, in {res.wall_s:.1f} s -> {where}")
    if res.check is not None:
        print(f"sample check: {res.checked} evaluated points re-simulated on the simulator's default path (fast, no race "
              f"checker; {res.checked_exact} again exact), max relative disagreement {res.check:.2g} "
              f"(times relative to the token's)")
    for key, msg in res.failed[:5]:
        print(f"kvpipe: point {key} failed: {msg}", file=sys.stderr)
    return 1 if res.failed else 0
