"""``kvpipe sweep``: a grid of points in parallel, written as CSV and JSON, resumable.

The grid flags are those of ``simulate`` (list flags also take
``START..STOP/STEP`` ranges here). Points run over ``--jobs`` local processes
or on a Dask cluster (``--dask ADDRESS``); rows land in ``--out DIR`` as
``rows.json`` and ``rows.csv`` with the schema of ``simulate --json``, plus
the ``rows.jsonl`` journal a rerun resumes from. Each distinct simulation runs
once and extrapolates its steady tokens (``sim.distinct``, ``sim.steady``);
``--exact`` runs every point and token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpipe.commands.args import UsageError, add_grid_args, points_from_args


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
    p.set_defaults(func=run)


def grid_points(args: argparse.Namespace) -> list[Any]:
    """The grid flags (ranges expanded), as points. Raises UsageError on bad input."""
    return points_from_args(args)


def run(args: argparse.Namespace) -> int:
    from kvpipe.sweep import JOURNAL, ROWS_CSV, ROWS_JSON, max_jobs, run_sweep  # here, not at parser build: multiprocessing

    if not 0 <= args.jobs <= max_jobs():
        raise UsageError(f"--jobs {args.jobs} out of range; allowed: 0 (all cores) or 1..{max_jobs()}")
    points = grid_points(args)

    res = run_sweep(points, out_dir=args.out, jobs=args.jobs or None, dask_address=args.dask, progress=not args.quiet,
                    exact=args.exact, resume=args.resume)
    where = f"{args.out}/{ROWS_JSON}, {args.out}/{ROWS_CSV} (journal {JOURNAL})"
    print(f"swept {len(points)} points: {res.ran} run ({res.simulations} distinct simulations), {res.resumed} already "
          f"done, {len(res.failed)} failed, in {res.wall_s:.1f} s -> {where}")
    for key, msg in res.failed[:5]:
        print(f"kvpipe: point {key} failed: {msg}", file=sys.stderr)
    return 1 if res.failed else 0
