"""``kvpipe simulate``: run a grid of points on the SimPy machine and print the table.

With no options it runs the reference preset (qwen3.8-27b, q8_0, RTX 4070 on
gen4 x16) at 4,096 / 16,384 / 32,768 at depth 0 and 1 with the default
budget, and prints a table with the gain. ``--json`` prints one object per
point, ``--csv FILE`` writes them as CSV, ``--trace FILE`` writes a Chrome
trace of every point's timeline. Each distinct simulation runs once and
extrapolates its steady tokens (``sim.run.tasks``, ``sim.run.decode``); ``--exact``
simulates every point and token, as traces and functional runs always do.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from backends.base import OutOfDeviceMemory
from kvpipe.commands.args import add_grid_args, points_from_args
from sim.rows import row
from sim.run.point import Point, RunResult
from sim.safe_write import write_outputs
from sim.telemetry import chrome_trace, rows_to_csv, table
from sim.transport.scheduler import GraphStats


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a grid of workload points (the main job)")
    add_grid_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON array of result rows")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto) of each point")
    p.add_argument("--functional", action="store_true",
                   help="move real bytes and compute real outputs (functional simulation) on a scaled point: each context "
                        "/ 32 clipped to 64..1,024 rows, the model's first 6 attention layers, small weights; every row "
                        "says what it was scaled from")
    p.add_argument("--fail-on-hazard", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 when the race checker (on in every run) finds a hazard (default: on)")
    p.set_defaults(func=run)


def run_points(points: list[Point], trace: bool = False, functional: bool = False,
               exact: bool = False) -> list[tuple[RunResult, dict[str, Any]]]:
    """Simulate each distinct point once (``sim.run.tasks``: ``run_point``, on the fast path unless ``exact``, a trace
    or a functional run); returns (result, row) pairs, one per point. Blocks for the simulations' wall time."""
    from sim.run import tasks

    out: dict[int, tuple[RunResult, dict[str, Any]]] = {}
    alone = trace or functional
    for task in tasks.tasks(points, exact=exact or alone, share=not alone):
        try:
            results = tasks.run_task(task, trace=trace, functional=functional)
        except OutOfDeviceMemory as exc:  # a point that does not fit is a row that says so; the rest of the grid runs
            results = [RunResult(m.point, [GraphStats()], extra={"fits": False, "fit_reason": str(exc)}) for m in task.members]
        for m, result in zip(task.members, results, strict=True):
            out[m.index] = (result, row(result))
    return [out[i] for i in range(len(points))]


def run(args: argparse.Namespace) -> int:
    points = points_from_args(args)
    results = run_points(points, trace=bool(args.trace), functional=args.functional, exact=args.exact)
    rows = [r for _, r in results]
    files: list[tuple[str, str]] = []  # the trace and the CSV: both written, or neither
    if args.trace:
        label = lambda r: f"{r['model']} {r['hardware']} ctx={r['context']} depth={r['depth']} budget={r['budget_mib']:g}"  # noqa: E731
        files.append((args.trace, json.dumps(chrome_trace((label(r), res.spans) for res, r in results))))
    if args.csv:
        files.append((args.csv, rows_to_csv(rows)))
    write_outputs(files)
    if points and points[0].transport.mutations and not args.functional:
        for r in rows:
            r["mutation_note"] = "timing only: --functional shows what the mutation does to the bytes"
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print(table(rows))
    found = sum(r.get("hazards", 0) for r in rows)
    if found and args.fail_on_hazard:
        print(f"kvpipe simulate: the race checker found {found} hazards (rows above); --no-fail-on-hazard exits 0", file=sys.stderr)
        return 1
    return 0
